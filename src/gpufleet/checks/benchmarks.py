"""Turn the quick benchmarks' output (gpufleet.bench.*.run(): matmul, memory, nccl, train_gpt2) into results of
the one schema. The soak's judgement is checks.soak; measuring again and each figure's trust, measure.

Each function takes the benchmark's output and the profile and returns a list
of results; the raw output rides along in `detail` so nothing measured is lost.
"""

from __future__ import annotations

from gpufleet import calibration, judge, profiles, schema
from gpufleet.checks import figures
from gpufleet.numbers import mfu
from gpufleet.schema import ERROR, FAIL, PASS, WARN, result

GROUP = "benchmark"
CPU_NOTE = "CPU run: logic check only, not a performance figure"


def _against_min(check, value, unit, profile, key, what, remedy, detail, cpu):
    """pass/fail against a minimum threshold (judge.judge); warn when none is set; never a claim on CPU."""
    limit = profiles.value(profile, key)
    threshold = profiles.threshold(profile, key, min=limit)
    if value is None:
        return result(check, ERROR, f"{what}: no value measured", threshold=threshold, detail=detail)
    if cpu:
        return result(
            check,
            schema.SKIP,
            f"{what} {value} {unit}; {CPU_NOTE}",
            value=value,
            unit=unit,
            threshold=threshold,
            detail=detail,
        )
    if limit is None:
        return result(
            check,
            WARN,
            f"{what} {value} {unit}; no threshold set ({key})",
            value=value,
            unit=unit,
            threshold=threshold,
            remedy=f"set gpufleet_thresholds.{key} or add it to the GPU's profile",
            detail=detail,
        )
    if judge.judge(value, judge.Limit(key, limit, kind=judge.MIN)).status == FAIL:
        return result(
            check,
            FAIL,
            f"{what} {value} {unit} is under the minimum {limit} {unit}",
            value=value,
            unit=unit,
            threshold=threshold,
            remedy=remedy,
            detail=detail,
        )
    return result(
        check,
        PASS,
        f"{what} {value} {unit} (minimum {limit})",
        value=value,
        unit=unit,
        threshold=threshold,
        detail=detail,
    )


def _throttled(monitor: dict) -> dict:
    return {idx: g["throttled"] for idx, g in (monitor.get("per_gpu") or {}).items() if g.get("throttled")}


def _nvml_index(monitor: dict, pci_bus_id: str | None) -> int | None:
    """The NVML index of a CUDA device, by PCI bus id: the monitor samples NVML's GPUs, torch counts CUDA's."""
    for idx, g in (monitor.get("per_gpu") or {}).items():
        if pci_bus_id and (g.get("pci_bus_id") or "").startswith(pci_bus_id):
            return int(idx)
    return None


def flag_gpus(res: dict, gpus: list[dict]) -> dict:
    """detail.flagged_gpus on a result that is not passing because of these GPUs ({"index", "uuid"}; index NVML's)."""
    if res["status"] in (WARN, FAIL, ERROR) and gpus:
        seen, flagged = set(), []
        for g in gpus:
            key = (g.get("index"), g.get("uuid"))
            if key not in seen:
                seen.add(key)
                flagged.append({"index": g.get("index"), "uuid": g.get("uuid"), "serial": g.get("serial")})
        return res.replace(detail={**res["detail"], "flagged_gpus": flagged})
    return res


def _cuda_gpu(monitor: dict, info: dict) -> dict:
    """A CUDA device's identity for flagged_gpus, from what the benchmark read of it ({"uuid", "pci_bus_id"})."""
    return {"index": _nvml_index(monitor, info.get("pci_bus_id")), "uuid": info.get("uuid"), "serial": None}


def matmul(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    mon = out["monitor"]
    errors = {d: v["error"] for d, v in out["per_device"].items() if "error" in v}
    detail = {
        "summary": out["summary"],
        "method": out["method"],
        "versions": out["versions"],
        "monitor": mon,
        "per_gpu": {
            d: {k: v.get(k, {}).get("tflops") for k in out["method"]["dtypes"]}
            | {
                "error": v.get("error"),
                "uuid": (v.get("device") or {}).get("uuid"),
                "pci_bus_id": (v.get("device") or {}).get("pci_bus_id"),
                "samples_tflops": (v.get("bf16") or {}).get("samples_tflops"),
            }
            | ({"phases_s": v["phases_s"]} if v.get("phases_s") else {})  # a worker's, where one ran
            for d, v in out["per_device"].items()
        },
        "per_shape": {
            d: {k: v[k]["per_shape"] for k in out["method"]["dtypes"] if k in v} for d, v in out["per_device"].items()
        },
    }
    ident = {d: _cuda_gpu(mon, v.get("device") or {}) for d, v in out["per_device"].items()}
    if errors:
        return [
            flag_gpus(
                result(
                    "matmul_bf16",
                    ERROR,
                    f"matmul failed on GPU(s) {', '.join(errors)}: {next(iter(errors.values()))}",
                    detail=detail,
                    remedy="look at the error; a GPU that cannot run a matmul is not fit for training",
                ),
                [ident[d] for d in errors],
            )
        ]
    bf16 = out["summary"].get("bf16", {})
    res = _against_min(
        "matmul_bf16",
        bf16.get("tflops_min"),
        "TFLOPS",
        profile,
        "matmul_bf16_tflops_min",
        "slowest GPU bf16 matmul",
        "compare with the other GPUs in detail; check clocks, power limit and cooling",
        detail,
        cpu,
    )
    limit = profiles.value(profile, "matmul_bf16_tflops_min")
    flagged = [
        ident[d]
        for d, v in out["per_device"].items()
        if limit is not None and (v.get("bf16") or {}).get("tflops") is not None and v["bf16"]["tflops"] < limit
    ]
    throttled = _throttled(mon)
    spread = bf16.get("spread_pct")
    spread_thr = calibration.entry(profile["thresholds"], "matmul_spread_pct_max", "matmul_bf16_tflops")
    spread_max = spread_thr["value"]
    if not cpu and throttled and res["status"] == PASS:
        res = res.replace(
            status=FAIL,
            reason=f"{res['reason']}, but GPU(s) throttled during the run: {throttled}",
            remedy="hardware slowdown under load: check cooling, power delivery and the GPU's health",
        )
        by_index = {g["index"]: g for g in ident.values()}
        flagged = [by_index.get(int(i)) or {"index": int(i), "uuid": None} for i in throttled]
    elif (
        not cpu
        and spread is not None
        and res["status"] == PASS
        and judge.judge(spread, judge.Limit("matmul_spread_pct_max", spread_max, breach=WARN)).status == WARN
    ):
        res = res.replace(
            status=WARN,
            reason=f"{res['reason']}, but GPUs differ by {spread}% (more than {spread_max:g}%"
            f"{calibration.uncalibrated_text(spread_thr)})",
            remedy="the slowest GPU in detail.per_gpu is the one to look at: compare its clocks, power and "
            "temperature in detail.monitor with its siblings'; one that stays slow needs service",
            detail={**res["detail"], "spread_threshold": spread_thr},
        )
        slowest = min(
            (d for d, v in out["per_device"].items() if (v.get("bf16") or {}).get("tflops") is not None),
            key=lambda d: out["per_device"][d]["bf16"]["tflops"],
            default=None,
        )
        flagged = [ident[slowest]] if slowest is not None else []
    if not cpu:
        judged = figures.judged(
            [
                (ident[d], "matmul_bf16_tflops", "bf16 matmul", "TFLOPS", (v.get("bf16") or {}).get("samples_tflops"))
                for d, v in out["per_device"].items()
            ],
            profile,
            mon,
        )
        res, flagged = figures.with_samples(res, judged, flagged, profile, "matmul_bf16_tflops")
        res = figures.near_limit(res, judged, "matmul_bf16_tflops_min", profile, "matmul_bf16_tflops")
    return [flag_gpus(res, flagged)]


def memory(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    s, per, mon = out["summary"], out["per_device"], out["monitor"]
    detail = {"summary": s, "method": out["method"], "per_gpu": per, "monitor": mon}
    copies = {**per["hbm"], **{f"pcie{k}": v for k, v in per["pcie"].items()}}
    bad = [d for d, v in copies.items() if "error" in v or not v.get("correct", False)]
    if bad:
        wrong_data = any("error" not in copies[d] for d in bad)  # a copy that ran and moved wrong data: the board
        return [
            flag_gpus(
                result(
                    "memory_bandwidth",
                    ERROR,
                    f"copies failed or moved wrong data on {bad}",
                    detail=detail,
                    failure_class="hardware" if wrong_data else None,
                ),
                [_cuda_gpu(mon, copies[d]) for d in bad if copies[d].get("uuid")],
            )
        ]

    def under(part, field, key):  # the GPUs under the minimum: the ones a failing result is about
        limit = profiles.value(profile, key)
        return [
            _cuda_gpu(mon, v)
            for v in per[part].values()
            if limit is not None and v.get(field) is not None and v[field] < limit
        ]

    res = [
        flag_gpus(
            _against_min(
                "hbm_bandwidth",
                s["hbm_copy_gbps_min"],
                "GB/s",
                profile,
                "hbm_copy_gbps_min",
                "slowest GPU HBM copy (read+write)",
                "compare GPUs in detail; check memory clocks and ECC/row remapping",
                detail,
                cpu,
            ),
            under("hbm", "hbm_copy_gbps", "hbm_copy_gbps_min"),
        )
    ]
    if per["pcie"]:
        h2d = _against_min(
            "pcie_h2d_bandwidth",
            s["h2d_gbps_min"],
            "GB/s",
            profile,
            "pcie_h2d_gbps_min",
            "slowest GPU host-to-device",
            "a link trained down shows here: compare with gpu_health.pcie_link and reseat or replace the riser",
            detail,
            cpu,
        )
        d2h = _against_min(
            "pcie_d2h_bandwidth",
            s["d2h_gbps_min"],
            "GB/s",
            profile,
            "pcie_d2h_gbps_min",
            "slowest GPU device-to-host",
            "a link trained down shows here: compare with gpu_health.pcie_link",
            detail,
            cpu,
        )
        res += [
            flag_gpus(h2d, under("pcie", "h2d_gbps", "pcie_h2d_gbps_min")),
            flag_gpus(d2h, under("pcie", "d2h_gbps", "pcie_d2h_gbps_min")),
        ]
    if not cpu:
        parts = {
            "hbm_bandwidth": ("hbm", "hbm_copy_gbps", "HBM copy", "samples_gbps", "hbm_copy_gbps_min"),
            "pcie_h2d_bandwidth": ("pcie", "pcie_h2d_gbps", "host-to-device", "samples_h2d_gbps", "pcie_h2d_gbps_min"),
            "pcie_d2h_bandwidth": ("pcie", "pcie_d2h_gbps", "device-to-host", "samples_d2h_gbps", "pcie_d2h_gbps_min"),
        }
        for i, r in enumerate(res):
            part, metric, what, field, key = parts[r["check"]]
            judged = figures.judged(
                [(_cuda_gpu(mon, v), metric, what, "GB/s", v.get(field)) for v in per[part].values()], profile, mon
            )
            r, flagged = figures.with_samples(r, judged, r["detail"].get("flagged_gpus") or [], profile, metric)
            res[i] = flag_gpus(figures.near_limit(r, judged, key, profile, metric), flagged)
    return res


def _largest(rows):
    good = [r for r in rows if "busbw_gbps" in r]
    return max(good, key=lambda r: r["size_bytes"]) if good else None


ONE_GPU_NCCL = "one GPU on this node: no collective inside it to measure"


def nccl(out: dict, profile: dict, *, host_has_ib: bool | None = None) -> list[dict]:
    cpu = out["device"] == "cpu"
    base = {
        k: out.get(k) for k in ("method", "world_size", "nnodes", "backend", "rc", "seconds", "nccl_log", "command")
    }
    if out.get("timed_out") or out.get("rc") != 0 or "collectives" not in out:
        why = "timed out and was killed" if out.get("timed_out") else f"exited {out.get('rc')}"
        # The folders a failed run keeps on the node (torchrun's and NCCL's logs) are named, to be read and removed.
        kept = {"kept_folders": [d for d in (out.get("workdir"), out.get("nccl_log_dir")) if d]}
        return [
            result(
                "nccl",
                FAIL,
                f"NCCL benchmark {why}",
                detail={**base, **kept, "log_tail": out.get("log_tail")},
                remedy="read the log tail; a hang across nodes is usually the fabric or a firewall on the rendezvous port",
            )
        ]
    if (
        out.get("world_size") == 1
    ):  # one GPU visible (CUDA_VISIBLE_DEVICES, or a one-GPU node): busbw is 0 by definition
        return [result("nccl", schema.SKIP, ONE_GPU_NCCL, detail=base)]
    res = []
    for name, rows in out["collectives"].items():
        detail = {**base, "rows": rows}
        check = f"nccl_{name}"
        wrong = [r["size_bytes"] for r in rows if not r.get("correct")]
        if wrong:
            res.append(
                result(
                    check,
                    FAIL,
                    f"{name} gave wrong results or failed at sizes {wrong} bytes",
                    detail=detail,
                    remedy="wrong collective results point to a faulty GPU, NVLink or NIC: run gpu_health and the sendrecv matrix",
                )
            )
            continue
        top = _largest(rows)
        what = f"{name} busbw at {schema.size_text(top['size_bytes'])} over {out['world_size']} ranks"
        if name == "all_reduce":
            res.append(
                _against_min(
                    check,
                    top["busbw_gbps"],
                    "GB/s",
                    profile,
                    "nccl_allreduce_busbw_gbps_min",
                    what,
                    "compare the transport in detail.nccl_log; check NVLink state, ACS and the NCCL environment",
                    detail,
                    cpu,
                )
            )
        else:
            res.append(
                result(
                    check,
                    schema.SKIP if cpu else PASS,
                    f"{what}: {top['busbw_gbps']} GB/s, results correct" + (f"; {CPU_NOTE}" if cpu else ""),
                    value=top["busbw_gbps"],
                    unit="GB/s",
                    detail=detail,
                )
            )
    if out.get("sendrecv"):
        res.append(_sendrecv(out["sendrecv"], profile, cpu, base))
    if out.get("nnodes", 1) > 1:
        res.append(_inter_node(out["nccl_log"], host_has_ib, base, cpu))
    return res


def _sendrecv(matrix: dict, profile: dict, cpu: bool, base: dict) -> dict:
    cells = [(s, d, c) for s, row in enumerate(matrix["gbps"]) for d, c in enumerate(row) if c is not None]
    wrong = [(s, d) for s, d, c in cells if not c["correct"]]
    detail = {**base, "matrix": matrix}
    if wrong:
        return result(
            "nccl_sendrecv",
            FAIL,
            f"send/recv delivered wrong data on pairs {wrong}",
            detail=detail,
            remedy="a pair that corrupts data: check that NVLink path and both GPUs' health",
        )
    vals = sorted(c["gbps"] for _, _, c in cells)
    median = vals[len(vals) // 2]
    ratio = profiles.value(profile, "nccl_sendrecv_pair_ratio_min")
    slow = [f"{s}->{d} {c['gbps']} GB/s" for s, d, c in cells if c["gbps"] < ratio * median]
    threshold = profiles.threshold(profile, "nccl_sendrecv_pair_ratio_min", min=ratio)
    if cpu:
        return result(
            "nccl_sendrecv",
            schema.SKIP,
            f"{len(cells)} pairs correct; {CPU_NOTE}",
            value=median,
            unit="GB/s",
            threshold=threshold,
            detail=detail,
        )
    if slow:
        return result(
            "nccl_sendrecv",
            FAIL,
            f"slow pairs (under {ratio:.0%} of the median {median} GB/s): {', '.join(slow)}",
            value=vals[0],
            unit="GB/s",
            threshold=threshold,
            detail=detail,
            remedy="the GPUs named share the slow link: check gpu_health.nvlink for them and their NVLink error counters",
        )
    return result(
        "nccl_sendrecv",
        PASS,
        f"{len(cells)} pairs, slowest {vals[0]} GB/s, median {median} GB/s",
        value=vals[0],
        unit="GB/s",
        threshold=threshold,
        detail=detail,
    )


def _inter_node(log: dict, host_has_ib: bool | None, base: dict, cpu: bool) -> dict:
    how = log.get("inter_node")
    detail = {**base, "transports": log.get("transports"), "networks": log.get("networks")}
    if cpu:
        return result(
            "nccl_transport", schema.SKIP, f"gloo on CPU: no NCCL transport to name; {CPU_NOTE}", detail=detail
        )
    if how == "ib_gdr":
        return result(
            "nccl_transport", PASS, "inter-node traffic used InfiniBand with GPUDirect RDMA", value=how, detail=detail
        )
    if how == "ib":
        return result(
            "nccl_transport",
            WARN,
            "inter-node traffic used InfiniBand without GPUDirect RDMA",
            value=how,
            detail=detail,
            remedy="load nvidia_peermem and check NCCL_NET_GDR_LEVEL and ACS (bringup.yml)",
        )
    if how == "socket" and host_has_ib:
        return result(
            "nccl_transport",
            FAIL,
            "inter-node traffic fell back to TCP sockets on a host that has InfiniBand",
            value=how,
            detail=detail,
            remedy="check NCCL_IB_DISABLE, NCCL_IB_HCA and the HCA ports (host_hygiene.infiniband)",
        )
    if how == "socket":
        return result(
            "nccl_transport",
            WARN,
            "inter-node traffic used TCP sockets (no InfiniBand on this host)",
            value=how,
            detail=detail,
        )
    if log.get("transports") and not any(t.startswith("NET") for t in log["transports"]):
        return result(
            "nccl_transport",
            schema.SKIP,
            f"NCCL joined these nodes through {', '.join(log['transports'])}, paths inside one "
            "machine: the nodes of this run share a machine, so there is no network between them to judge",
            detail=detail,
        )
    return result(
        "nccl_transport",
        ERROR,
        "NCCL's log names no inter-node transport",
        value=how,
        detail=detail,
        remedy="run with NCCL_DEBUG=INFO and read the log in detail.nccl_log_dir",
    )


def train_gpt2(full: dict, profile: dict, *, single: dict | None = None, reference: dict | None = None) -> list[dict]:
    """Tokens/s per GPU of the GPT-2-small gate, its MFU, and the scaling efficiency.

    Inside a node (`full["nnodes"]` 1) the scaling is against `single`, the same training on one GPU. Across
    nodes it is against `reference`: this node's own single-node `benchmark.train_gpt2` result from earlier in
    the run (its value is the per-GPU figure on all of this node's GPUs); when that is absent or has no figure,
    the scaling result is an `error` that names the missing figure.
    """
    cpu = full["device"] == "cpu"
    nnodes = full.get("nnodes") or 1
    keep = (
        "method",
        "world_size",
        "rc",
        "seconds",
        "command",
        "batch_per_gpu",
        "steps",
        "compiled",
        "config",
        "device_name",
    )
    detail = {k: full.get(k) for k in keep} | {"nnodes": nnodes}
    where = f"across {nnodes} nodes " if nnodes > 1 else ""
    if full.get("timed_out") or full.get("rc") != 0 or "tokens_per_s_per_gpu" not in full:
        why = "timed out and was killed" if full.get("timed_out") else f"exited {full.get('rc')}"
        remedy = "read the log tail: an out-of-memory, a NCCL error or a dead peer shows there"
        if nnodes > 1:
            remedy += "; across nodes a node that never came (down, a firewalled rendezvous port) stops every node"
        kept = {"kept_folders": [d for d in [full.get("workdir")] if d]}
        return [
            result(
                "train_gpt2",
                FAIL,
                f"GPT-2 training gate {where}{why}",
                detail={**detail, **kept, "log_tail": full.get("log_tail")},
                remedy=remedy,
            )
        ]
    rank0 = full["ranks"][0]
    peak = profiles.value(profile, "bf16_dense_peak_tflops")
    per_gpu = round(full["tokens_per_s_per_gpu"])
    detail.update(
        tokens_per_s_total=round(full["tokens_per_s_total"]),
        mfu=mfu(full["tokens_per_s_per_gpu"], rank0["flops_per_token"], peak),
        mfu_peak_tflops=peak,
        flops_per_token=rank0["flops_per_token"],
        step_s_median=rank0["step_s_median"],
        loss_first=rank0["loss_first"],
        loss_last=rank0["loss_last"],
        peak_memory_gib=rank0["peak_memory_gib"],
        per_rank_tokens_per_s=[round(r["tokens_per_s_per_gpu"]) for r in full["ranks"]],
    )
    if peak is None:
        detail["mfu_note"] = "no MFU: the profile sets no bf16_dense_peak_tflops"
    over = f" over {nnodes} nodes" if nnodes > 1 else ""
    res = [
        _against_min(
            "train_gpt2",
            per_gpu,
            "tokens/s/GPU",
            profile,
            "train_gpt2_tokens_per_s_per_gpu_min",
            f"GPT-2-small training on {full['world_size']} GPU(s){over}",
            "compare matmul_bf16 and nccl_all_reduce: the slower of the two is the layer to fix first",
            detail,
            cpu,
        )
    ]
    if nnodes > 1:
        res.append(_scaling_across_nodes(full, per_gpu, reference, profile, cpu))
    elif full["world_size"] > 1 and single is not None and single.get("rc") == 0 and "tokens_per_s_per_gpu" in single:
        eff = round(full["tokens_per_s_per_gpu"] / single["tokens_per_s_per_gpu"], 3)
        sdetail = {
            "tokens_per_s_per_gpu_one": round(single["tokens_per_s_per_gpu"]),
            "tokens_per_s_per_gpu_all": per_gpu,
            "world_size": full["world_size"],
        }
        res.append(
            _scaling(
                eff,
                f"per-GPU throughput on {full['world_size']} GPUs is {eff:.1%} of one GPU's",
                profile,
                cpu,
                sdetail,
                "the gradient all-reduce does not overlap: check nccl_all_reduce, the transport, and DDP bucket sizes",
            )
        )
    return res


def _scaling(eff: float, what: str, profile: dict, cpu: bool, detail: dict, remedy: str) -> dict:
    limit = profiles.value(profile, "train_scaling_efficiency_min")
    threshold = profiles.threshold(profile, "train_scaling_efficiency_min", min=limit)
    if cpu:
        status, reason = schema.SKIP, f"{what}; {CPU_NOTE}"
    elif eff < limit:
        status, reason = FAIL, f"{what}, under the minimum {limit:.0%}"
    else:
        status, reason = PASS, what
    return result(
        "train_scaling",
        status,
        reason,
        value=eff,
        unit="ratio",
        threshold=threshold,
        detail=detail,
        remedy=remedy if status == FAIL else None,
    )


def _scaling_across_nodes(full: dict, per_gpu: int, reference: dict | None, profile: dict, cpu: bool) -> dict:
    """Per-GPU tokens/s across the nodes over this node's own single-node figure (benchmark.train_gpt2)."""
    nnodes, world = full["nnodes"], full["world_size"]
    ref = reference or {}
    ref_value = ref.get("value")
    detail = {
        "tokens_per_s_per_gpu_one_node": ref_value,
        "tokens_per_s_per_gpu_all": per_gpu,
        "world_size": world,
        "nnodes": nnodes,
        "world_size_one_node": ref.get("world_size"),
        "reference": {k: ref.get(k) for k in ("check", "group", "status", "reason")} if ref else None,
    }
    missing = None
    if not reference:
        missing = "no single-node benchmark.train_gpt2 result of this node was given for this run"
    elif isinstance(ref_value, bool) or not isinstance(ref_value, (int, float)) or ref_value <= 0:
        missing = (
            f"this node's single-node benchmark.train_gpt2 result has no figure "
            f"(status {ref.get('status')}: {ref.get('reason') or 'no reason given'})"
        )
    if missing:
        threshold = profiles.threshold(
            profile, "train_scaling_efficiency_min", min=profiles.value(profile, "train_scaling_efficiency_min")
        )
        return result(
            "train_scaling",
            ERROR,
            f"no scaling efficiency across {nnodes} nodes: the single-node per-GPU figure of this node is missing; {missing}",
            threshold=threshold,
            detail=detail,
            remedy="keep train_gpt2 in gpufleet_benchmarks and fix what benchmark.train_gpt2 of this node says, then re-run",
        )
    eff = round(per_gpu / ref_value, 3)
    on = f" on {ref['world_size']} GPU(s)" if ref.get("world_size") else ""
    what = f"per-GPU throughput on {world} GPUs over {nnodes} nodes is {eff:.1%} of this node's alone{on}"
    return _scaling(
        eff,
        what,
        profile,
        cpu,
        detail,
        "the gradient all-reduce between nodes does not keep up: check benchmark_multinode.nccl_all_reduce and "
        "nccl_transport (InfiniBand with GPUDirect RDMA), then DDP bucket sizes",
    )
