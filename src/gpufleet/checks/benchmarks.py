"""Turn benchmark output (gpufleet.bench.*.run()) into results of the one schema.

Each function takes the benchmark's output and the profile and returns a list
of results; the raw output rides along in `detail` so nothing measured is lost.
"""

from __future__ import annotations

import statistics
import time

from gpufleet import failure_class, profiles, schema
from gpufleet.bench import sig
from gpufleet.bench.watch import describe, wait_quiet
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.collect.nvml import HW_SLOWDOWN_EVENTS
from gpufleet.schema import ERROR, FAIL, PASS, WARN, result
from gpufleet.train.gpt2 import mfu

GROUP = "benchmark"
CPU_NOTE = "CPU run: logic check only, not a performance figure"


def _against_min(check, value, unit, profile, key, what, remedy, detail, cpu):
    """pass/fail against a minimum threshold; warn when none is set; never a claim on CPU."""
    limit = profiles.value(profile, key)
    thr = profiles.threshold(profile, key, min=limit)
    if value is None:
        return result(check, ERROR, f"{what}: no value measured", threshold=thr, detail=detail)
    if cpu:
        return result(check, schema.SKIP, f"{what} {value} {unit}; {CPU_NOTE}", value=value, unit=unit, threshold=thr, detail=detail)
    if limit is None:
        return result(check, WARN, f"{what} {value} {unit}; no threshold set ({key})", value=value, unit=unit, threshold=thr,
                      remedy=f"set gpufleet_thresholds.{key} or add it to the GPU's profile", detail=detail)
    if value < limit:
        return result(check, FAIL, f"{what} {value} {unit} is under the minimum {limit} {unit}", value=value, unit=unit,
                      threshold=thr, remedy=remedy, detail=detail)
    return result(check, PASS, f"{what} {value} {unit} (minimum {limit})", value=value, unit=unit, threshold=thr, detail=detail)


def _throttled(monitor: dict) -> dict:
    return {idx: g["throttled"] for idx, g in (monitor.get("per_gpu") or {}).items() if g.get("throttled")}


def _nvml_index(monitor: dict, pci_bus_id: str | None) -> int | None:
    """The NVML index of a CUDA device, by PCI bus id: the monitor samples NVML's GPUs, torch counts CUDA's."""
    for idx, g in (monitor.get("per_gpu") or {}).items():
        if pci_bus_id and (g.get("pci_bus_id") or "").startswith(pci_bus_id):
            return int(idx)
    return None


def _flag(res: dict, gpus: list[dict]) -> dict:
    """detail.flagged_gpus on a result that is not passing because of these GPUs ({"index", "uuid"}; index NVML's)."""
    if res["status"] in (WARN, FAIL, ERROR) and gpus:
        seen, flagged = set(), []
        for g in gpus:
            key = (g.get("index"), g.get("uuid"))
            if key not in seen:
                seen.add(key)
                flagged.append({"index": g.get("index"), "uuid": g.get("uuid"), "serial": g.get("serial")})
        res["detail"] = {**res["detail"], "flagged_gpus": flagged}
    return res


def _sample_drops(figures: list, profile: dict) -> tuple[list, dict]:
    """Timed samples far below their GPU's median: [(gpu, what, unit, samples summary)] -> the drops over the limit
    ({"gpu", "figure", "min", "median", "drop_pct"}) and the limit's threshold. One GPU is judged as well as eight."""
    limit = profiles.value(profile, "sample_drop_pct_max")
    thr = profiles.threshold(profile, "sample_drop_pct_max", max=limit)
    drops = []
    for gpu, what, unit, samples in figures:
        if limit is None or not samples or not samples.get("median"):
            continue
        drop = round(100 * (samples["median"] - samples["min"]) / samples["median"], 1)
        if drop > limit:
            drops.append({"gpu": gpu, "figure": what, "unit": unit, "min": sig(samples["min"]),
                          "median": sig(samples["median"]), "drop_pct": drop, "n": samples.get("n")})
    return drops, thr


def _noisy(res: dict, drops: list, thr: dict, flagged: list) -> tuple[dict, list]:
    """A passing result whose samples dropped becomes a warn: its figure is not yet the node's (confirmed by
    measuring again, checks.benchmarks.watched). The drops and their limit go into detail either way."""
    res["detail"] = {**res["detail"], "sample_drops": drops, "sample_drop_threshold": thr}
    if drops and res["status"] == PASS:
        text = "; ".join(f"GPU {d['gpu']['index'] if d['gpu'].get('index') is not None else '?'} {d['figure']} sample "
                         f"{d['min']:g} {d['unit']}, {d['drop_pct']:g}% below its median {d['median']:g}" for d in drops)
        res.update(status=WARN, reason=f"{res['reason']}, but a timed sample fell far below its GPU's median "
                                       f"(more than {thr['value']:g}%): {text}; the figure is not yet the node's",
                   remedy="another process or a clock drop disturbed the measurement: it is measured again; "
                          "compare detail.monitor (processes, clocks, reasons)")
        flagged = [d["gpu"] for d in drops]
    return res, flagged


def _cuda_gpu(monitor: dict, info: dict) -> dict:
    """A CUDA device's identity for flagged_gpus, from what the benchmark read of it ({"uuid", "pci_bus_id"})."""
    return {"index": _nvml_index(monitor, info.get("pci_bus_id")), "uuid": info.get("uuid"), "serial": None}


def matmul(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    mon = out["monitor"]
    errors = {d: v["error"] for d, v in out["per_device"].items() if "error" in v}
    detail = {"summary": out["summary"], "method": out["method"], "versions": out["versions"], "monitor": mon,
              "per_gpu": {d: {k: v.get(k, {}).get("tflops") for k in out["method"]["dtypes"]}
                          | {"error": v.get("error"), "uuid": (v.get("device") or {}).get("uuid"),
                             "samples_tflops": (v.get("bf16") or {}).get("samples_tflops")}
                          | ({"phases_s": v["phases_s"]} if v.get("phases_s") else {})  # a worker's, where one ran
                          for d, v in out["per_device"].items()},
              "per_shape": {d: {k: v[k]["per_shape"] for k in out["method"]["dtypes"] if k in v} for d, v in out["per_device"].items()}}
    ident = {d: _cuda_gpu(mon, v.get("device") or {}) for d, v in out["per_device"].items()}
    if errors:
        return [_flag(result("matmul_bf16", ERROR, f"matmul failed on GPU(s) {', '.join(errors)}: {next(iter(errors.values()))}",
                             detail=detail, remedy="look at the error; a GPU that cannot run a matmul is not fit for training"),
                      [ident[d] for d in errors])]
    bf16 = out["summary"].get("bf16", {})
    res = _against_min("matmul_bf16", bf16.get("tflops_min"), "TFLOPS", profile, "matmul_bf16_tflops_min",
                       "slowest GPU bf16 matmul", "compare with the other GPUs in detail; check clocks, power limit and cooling", detail, cpu)
    limit = profiles.value(profile, "matmul_bf16_tflops_min")
    flagged = [ident[d] for d, v in out["per_device"].items()
               if limit is not None and (v.get("bf16") or {}).get("tflops") is not None and v["bf16"]["tflops"] < limit]
    throttled = _throttled(mon)
    spread = bf16.get("spread_pct")
    spread_max = profiles.value(profile, "matmul_spread_pct_max")
    if not cpu and throttled and res["status"] == PASS:
        res.update(status=FAIL, reason=f"{res['reason']}, but GPU(s) throttled during the run: {throttled}",
                   remedy="hardware slowdown under load: check cooling, power delivery and the GPU's health")
        by_index = {g["index"]: g for g in ident.values()}
        flagged = [by_index.get(int(i)) or {"index": int(i), "uuid": None} for i in throttled]
    elif not cpu and spread_max is not None and spread is not None and spread > spread_max and res["status"] == PASS:
        res.update(status=WARN, reason=f"{res['reason']}, but GPUs differ by {spread}% (more than {spread_max}%)",
                   remedy="the slowest GPU in detail.per_gpu is the one to look at")
        slowest = min((d for d, v in out["per_device"].items() if (v.get("bf16") or {}).get("tflops") is not None),
                      key=lambda d: out["per_device"][d]["bf16"]["tflops"], default=None)
        flagged = [ident[slowest]] if slowest is not None else []
    if not cpu:
        drops, thr = _sample_drops([(ident[d], "bf16 matmul", "TFLOPS", (v.get("bf16") or {}).get("samples_tflops"))
                                    for d, v in out["per_device"].items()], profile)
        res, flagged = _noisy(res, drops, thr, flagged)
    return [_flag(res, flagged)]


def memory(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    s, per, mon = out["summary"], out["per_device"], out["monitor"]
    detail = {"summary": s, "method": out["method"], "per_gpu": per, "monitor": mon}
    copies = {**per["hbm"], **{f"pcie{k}": v for k, v in per["pcie"].items()}}
    bad = [d for d, v in copies.items() if "error" in v or not v.get("correct", False)]
    if bad:
        wrong_data = any("error" not in copies[d] for d in bad)  # a copy that ran and moved wrong data: the board
        return [_flag(result("memory_bandwidth", ERROR, f"copies failed or moved wrong data on {bad}", detail=detail,
                             failure_class="hardware" if wrong_data else None),
                      [_cuda_gpu(mon, copies[d]) for d in bad if copies[d].get("uuid")])]

    def under(part, field, key):  # the GPUs under the minimum: the ones a failing result is about
        limit = profiles.value(profile, key)
        return [_cuda_gpu(mon, v) for v in per[part].values() if limit is not None and v.get(field) is not None and v[field] < limit]

    res = [_flag(_against_min("hbm_bandwidth", s["hbm_copy_gbps_min"], "GB/s", profile, "hbm_copy_gbps_min",
                              "slowest GPU HBM copy (read+write)", "compare GPUs in detail; check memory clocks and ECC/row remapping",
                              detail, cpu), under("hbm", "hbm_copy_gbps", "hbm_copy_gbps_min"))]
    if per["pcie"]:
        h2d = _against_min("pcie_h2d_bandwidth", s["h2d_gbps_min"], "GB/s", profile, "pcie_h2d_gbps_min", "slowest GPU host-to-device",
                           "a link trained down shows here: compare with gpu_health.pcie_link and reseat or replace the riser", detail, cpu)
        d2h = _against_min("pcie_d2h_bandwidth", s["d2h_gbps_min"], "GB/s", profile, "pcie_d2h_gbps_min", "slowest GPU device-to-host",
                           "a link trained down shows here: compare with gpu_health.pcie_link", detail, cpu)
        res += [_flag(h2d, under("pcie", "h2d_gbps", "pcie_h2d_gbps_min")), _flag(d2h, under("pcie", "d2h_gbps", "pcie_d2h_gbps_min"))]
    if not cpu:
        figures = {"hbm_bandwidth": [("hbm", "HBM copy", "samples_gbps")],
                   "pcie_h2d_bandwidth": [("pcie", "host-to-device", "samples_h2d_gbps")],
                   "pcie_d2h_bandwidth": [("pcie", "device-to-host", "samples_d2h_gbps")]}
        for i, r in enumerate(res):
            drops, thr = _sample_drops([(_cuda_gpu(mon, v), what, "GB/s", v.get(field)) for part, what, field in figures[r["check"]]
                                        for v in per[part].values()], profile)
            flagged = r["detail"].get("flagged_gpus") or []
            r, flagged = _noisy(r, drops, thr, flagged)
            res[i] = _flag(r, flagged)
    return res


def _largest(rows):
    good = [r for r in rows if "busbw_gbps" in r]
    return max(good, key=lambda r: r["size_bytes"]) if good else None


ONE_GPU_NCCL = "one GPU on this node: no collective inside it to measure"


def nccl(out: dict, profile: dict, *, host_has_ib: bool | None = None) -> list[dict]:
    cpu = out["device"] == "cpu"
    base = {k: out.get(k) for k in ("method", "world_size", "nnodes", "backend", "rc", "seconds", "nccl_log", "command")}
    if out.get("timed_out") or out.get("rc") != 0 or "collectives" not in out:
        why = "timed out and was killed" if out.get("timed_out") else f"exited {out.get('rc')}"
        # The folders a failed run keeps on the node (torchrun's and NCCL's logs) are named, to be read and removed.
        kept = {"kept_folders": [d for d in (out.get("workdir"), out.get("nccl_log_dir")) if d]}
        return [result("nccl", FAIL, f"NCCL benchmark {why}", detail={**base, **kept, "log_tail": out.get("log_tail")},
                       remedy="read the log tail; a hang across nodes is usually the fabric or a firewall on the rendezvous port")]
    if out.get("world_size") == 1:  # one GPU visible (CUDA_VISIBLE_DEVICES, or a one-GPU node): busbw is 0 by definition
        return [result("nccl", schema.SKIP, ONE_GPU_NCCL, detail=base)]
    res = []
    for name, rows in out["collectives"].items():
        detail = {**base, "rows": rows}
        check = f"nccl_{name}"
        wrong = [r["size_bytes"] for r in rows if not r.get("correct")]
        if wrong:
            res.append(result(check, FAIL, f"{name} gave wrong results or failed at sizes {wrong} bytes", detail=detail,
                              remedy="wrong collective results point to a faulty GPU, NVLink or NIC: run gpu_health and the sendrecv matrix"))
            continue
        top = _largest(rows)
        what = f"{name} busbw at {schema.size_text(top['size_bytes'])} over {out['world_size']} ranks"
        if name == "all_reduce":
            res.append(_against_min(check, top["busbw_gbps"], "GB/s", profile, "nccl_allreduce_busbw_gbps_min", what,
                                    "compare the transport in detail.nccl_log; check NVLink state, ACS and the NCCL environment", detail, cpu))
        else:
            res.append(result(check, schema.SKIP if cpu else PASS, f"{what}: {top['busbw_gbps']} GB/s, results correct" + (f"; {CPU_NOTE}" if cpu else ""),
                              value=top["busbw_gbps"], unit="GB/s", detail=detail))
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
        return result("nccl_sendrecv", FAIL, f"send/recv delivered wrong data on pairs {wrong}", detail=detail,
                      remedy="a pair that corrupts data: check that NVLink path and both GPUs' health")
    vals = sorted(c["gbps"] for _, _, c in cells)
    median = vals[len(vals) // 2]
    ratio = profiles.value(profile, "nccl_sendrecv_pair_ratio_min")
    slow = [f"{s}->{d} {c['gbps']} GB/s" for s, d, c in cells if c["gbps"] < ratio * median]
    thr = profiles.threshold(profile, "nccl_sendrecv_pair_ratio_min", min=ratio)
    if cpu:
        return result("nccl_sendrecv", schema.SKIP, f"{len(cells)} pairs correct; {CPU_NOTE}", value=median, unit="GB/s", threshold=thr, detail=detail)
    if slow:
        return result("nccl_sendrecv", FAIL, f"slow pairs (under {ratio:.0%} of the median {median} GB/s): {', '.join(slow)}",
                      value=vals[0], unit="GB/s", threshold=thr, detail=detail,
                      remedy="the GPUs named share the slow link: check gpu_health.nvlink for them and their NVLink error counters")
    return result("nccl_sendrecv", PASS, f"{len(cells)} pairs, slowest {vals[0]} GB/s, median {median} GB/s",
                  value=vals[0], unit="GB/s", threshold=thr, detail=detail)


def _inter_node(log: dict, host_has_ib: bool | None, base: dict, cpu: bool) -> dict:
    how = log.get("inter_node")
    detail = {**base, "transports": log.get("transports"), "networks": log.get("networks")}
    if cpu:
        return result("nccl_transport", schema.SKIP, f"gloo on CPU: no NCCL transport to name; {CPU_NOTE}", detail=detail)
    if how == "ib_gdr":
        return result("nccl_transport", PASS, "inter-node traffic used InfiniBand with GPUDirect RDMA", value=how, detail=detail)
    if how == "ib":
        return result("nccl_transport", WARN, "inter-node traffic used InfiniBand without GPUDirect RDMA", value=how, detail=detail,
                      remedy="load nvidia_peermem and check NCCL_NET_GDR_LEVEL and ACS (bringup.yml)")
    if how == "socket" and host_has_ib:
        return result("nccl_transport", FAIL, "inter-node traffic fell back to TCP sockets on a host that has InfiniBand", value=how,
                      detail=detail, remedy="check NCCL_IB_DISABLE, NCCL_IB_HCA and the HCA ports (host_hygiene.infiniband)")
    if how == "socket":
        return result("nccl_transport", WARN, "inter-node traffic used TCP sockets (no InfiniBand on this host)", value=how, detail=detail)
    if log.get("transports") and not any(t.startswith("NET") for t in log["transports"]):
        return result("nccl_transport", schema.SKIP, f"NCCL joined these nodes through {', '.join(log['transports'])}, paths inside one "
                      "machine: the nodes of this run share a machine, so there is no network between them to judge", detail=detail)
    return result("nccl_transport", ERROR, "NCCL's log names no inter-node transport", value=how, detail=detail,
                  remedy="run with NCCL_DEBUG=INFO and read the log in detail.nccl_log_dir")


def train_gpt2(full: dict, profile: dict, *, single: dict | None = None, reference: dict | None = None) -> list[dict]:
    """Tokens/s per GPU of the GPT-2-small gate, its MFU, and the scaling efficiency.

    Inside a node (`full["nnodes"]` 1) the scaling is against `single`, the same training on one GPU. Across
    nodes it is against `reference`: this node's own single-node `benchmark.train_gpt2` result from earlier in
    the run (its value is the per-GPU figure on all of this node's GPUs); when that is absent or has no figure,
    the scaling result is an `error` that names the missing figure.
    """
    cpu = full["device"] == "cpu"
    nnodes = full.get("nnodes") or 1
    keep = ("method", "world_size", "rc", "seconds", "command", "batch_per_gpu", "steps", "compiled", "config", "device_name")
    detail = {k: full.get(k) for k in keep} | {"nnodes": nnodes}
    where = f"across {nnodes} nodes " if nnodes > 1 else ""
    if full.get("timed_out") or full.get("rc") != 0 or "tokens_per_s_per_gpu" not in full:
        why = "timed out and was killed" if full.get("timed_out") else f"exited {full.get('rc')}"
        remedy = "read the log tail: an out-of-memory, a NCCL error or a dead peer shows there"
        if nnodes > 1:
            remedy += "; across nodes a node that never came (down, a firewalled rendezvous port) stops every node"
        kept = {"kept_folders": [d for d in [full.get("workdir")] if d]}
        return [result("train_gpt2", FAIL, f"GPT-2 training gate {where}{why}",
                       detail={**detail, **kept, "log_tail": full.get("log_tail")},
                       remedy=remedy)]
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
    res = [_against_min("train_gpt2", per_gpu, "tokens/s/GPU", profile, "train_gpt2_tokens_per_s_per_gpu_min",
                        f"GPT-2-small training on {full['world_size']} GPU(s){over}",
                        "compare matmul_bf16 and nccl_all_reduce: the slower of the two is the layer to fix first", detail, cpu)]
    if nnodes > 1:
        res.append(_scaling_across_nodes(full, per_gpu, reference, profile, cpu))
    elif full["world_size"] > 1 and single is not None and single.get("rc") == 0 and "tokens_per_s_per_gpu" in single:
        eff = round(full["tokens_per_s_per_gpu"] / single["tokens_per_s_per_gpu"], 3)
        sdetail = {"tokens_per_s_per_gpu_one": round(single["tokens_per_s_per_gpu"]), "tokens_per_s_per_gpu_all": per_gpu,
                   "world_size": full["world_size"]}
        res.append(_scaling(eff, f"per-GPU throughput on {full['world_size']} GPUs is {eff:.1%} of one GPU's", profile, cpu, sdetail,
                            "the gradient all-reduce does not overlap: check nccl_all_reduce, the transport, and DDP bucket sizes"))
    return res


def _scaling(eff: float, what: str, profile: dict, cpu: bool, detail: dict, remedy: str) -> dict:
    limit = profiles.value(profile, "train_scaling_efficiency_min")
    thr = profiles.threshold(profile, "train_scaling_efficiency_min", min=limit)
    if cpu:
        status, reason = schema.SKIP, f"{what}; {CPU_NOTE}"
    elif eff < limit:
        status, reason = FAIL, f"{what}, under the minimum {limit:.0%}"
    else:
        status, reason = PASS, what
    return result("train_scaling", status, reason, value=eff, unit="ratio", threshold=thr, detail=detail,
                  remedy=remedy if status == FAIL else None)


def _scaling_across_nodes(full: dict, per_gpu: int, reference: dict | None, profile: dict, cpu: bool) -> dict:
    """Per-GPU tokens/s across the nodes over this node's own single-node figure (benchmark.train_gpt2)."""
    nnodes, world = full["nnodes"], full["world_size"]
    ref = reference or {}
    ref_value = ref.get("value")
    detail = {"tokens_per_s_per_gpu_one_node": ref_value, "tokens_per_s_per_gpu_all": per_gpu, "world_size": world,
              "nnodes": nnodes, "world_size_one_node": ref.get("world_size"),
              "reference": {k: ref.get(k) for k in ("check", "group", "status", "reason")} if ref else None}
    missing = None
    if not reference:
        missing = "no single-node benchmark.train_gpt2 result of this node was given for this run"
    elif isinstance(ref_value, bool) or not isinstance(ref_value, (int, float)) or ref_value <= 0:
        missing = (f"this node's single-node benchmark.train_gpt2 result has no figure "
                   f"(status {ref.get('status')}: {ref.get('reason') or 'no reason given'})")
    if missing:
        thr = profiles.threshold(profile, "train_scaling_efficiency_min", min=profiles.value(profile, "train_scaling_efficiency_min"))
        return result("train_scaling", ERROR,
                      f"no scaling efficiency across {nnodes} nodes: the single-node per-GPU figure of this node is missing; {missing}",
                      threshold=thr, detail=detail,
                      remedy="keep train_gpt2 in gpufleet_benchmarks and fix what benchmark.train_gpt2 of this node says, then re-run")
    eff = round(per_gpu / ref_value, 3)
    on = f" on {ref['world_size']} GPU(s)" if ref.get("world_size") else ""
    what = f"per-GPU throughput on {world} GPUs over {nnodes} nodes is {eff:.1%} of this node's alone{on}"
    return _scaling(eff, what, profile, cpu, detail,
                    "the gradient all-reduce between nodes does not keep up: check benchmark_multinode.nccl_all_reduce and "
                    "nccl_transport (InfiniBand with GPUDirect RDMA), then DDP bucket sizes")


# --- soak -----------------------------------------------------------------------------------------------

# A GPU's best windows of a soak are its own reference: every window is judged against their median
# (at most half the windows, so that a short soak's slow stretch is not part of its own reference).
SOAK_BEST_WINDOWS = 3
# Counters whose growth during a soak fails it: memory the GPU could not correct or repair.
SOAK_FAIL_COUNTERS = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "row_remap_uncorrectable",
                      "row_remap_pending", "row_remap_failure")
SOAK_REMEDY_THROTTLE = ("hardware slowdown under sustained load: check cooling (inlet temperature, fans, airflow for this "
                        "GPU's slot) and power delivery (PSUs, BMC power capping); detail.per_gpu has clocks, temperature "
                        "and power per window")


def _soak_when(out: dict, t_s: float | None, prep: str = "at") -> str:
    """ "at 2026-11-23T10:12:31Z (751 s into the soak)": the time in UTC and from the soak's start."""
    if t_s is None:
        return "at an unknown time"
    start = out.get("started_epoch")
    if start is None:
        return f"{prep} {t_s:.0f} s into the soak"
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + t_s))
    return f"{prep} {utc} ({t_s:.0f} s into the soak)"


class _SoakGpus:
    """Who each soak process loaded: NVML index, uuid, serial, and the label a reason gives it."""

    def __init__(self, out: dict):
        self.cpu = out["device"] == "cpu"
        sampler = (out.get("sampler") or {}).get("per_gpu") or {}
        self.by_rank = {}
        for rank, g in (out.get("gpus") or {}).items():
            index = g.get("nvml_index")
            serial = (sampler.get(str(index)) or {}).get("serial") if index is not None else None
            self.by_rank[rank] = {"index": index, "uuid": g.get("uuid"), "serial": serial}
        self.by_index = {str(i): {"index": int(i), "uuid": g.get("uuid"), "serial": g.get("serial")} for i, g in sampler.items()}

    def label(self, rank: str) -> tuple[int | None, str]:
        """(NVML index for Findings, or None with the label written into the text)."""
        if self.cpu:
            return None, f"process {rank}: "
        index = self.by_rank.get(rank, {}).get("index")
        return (index, "") if index is not None else (None, f"CUDA device {rank}: ")


class _Flags:
    """GPUs behind each status, to name them in detail.flagged_gpus (the worst status's)."""

    def __init__(self):
        self.by_status: dict[str, list] = {}

    def add(self, status: str, gpu: dict | None) -> None:
        if gpu:
            self.by_status.setdefault(status, []).append(gpu)

    def apply(self, res: dict) -> dict:
        res.get("detail", {}).pop("flagged_gpus", None)  # Findings' own has no uuid for these indices
        return _flag(res, self.by_status.get(res["status"], []))


def soak(out: dict, profile: dict) -> list[dict]:
    """The soak's verdict: soak_throttle, soak_errors and soak_slowdown, each naming the GPU and the time.

    A soak that could not start is one `soak` result (fail). On the CPU (no CUDA) only a process that
    failed or an all_reduce that gave wrong results counts; the rest is `skip`, not a performance figure.
    """
    cpu = out["device"] == "cpu"
    base = {k: out.get(k) for k in ("method", "versions", "started", "duration_s", "ran_s", "window_s", "n_windows",
                                    "world_size", "stopped_early", "stop_reason", "after_effects")}
    if out.get("setup_error"):
        return [result("soak", FAIL, f"soak could not start: {out['setup_error']}", detail=base,
                       remedy="read the error: a GPU that cannot hold a sustained load (out of memory beside another "
                              "process, a CUDA or NCCL error) is not fit for training; run gpu_health")]
    gpus = _SoakGpus(out)
    return [_soak_throttle(out, profile, base, gpus, Findings, cpu), _soak_errors(out, profile, base, gpus, Findings, cpu),
            _soak_slowdown(out, profile, base, gpus, Findings, cpu)]


def _soak_throttle(out, profile, base, gpus, Findings, cpu) -> dict:
    limit = profiles.value(profile, "soak_throttle_s_max")
    thr = profiles.threshold(profile, "soak_throttle_s_max", max=limit)
    sampler = out.get("sampler") or {}
    detail = {**base, "per_gpu": {i: {k: g.get(k) for k in ("uuid", "serial", "pci_bus_id", "throttle", "windows", "error")}
                                  for i, g in (sampler.get("per_gpu") or {}).items()}}
    if cpu:
        return result("soak_throttle", schema.SKIP, f"no GPU clocks to watch; {CPU_NOTE}", threshold=thr, detail=detail)
    if sampler.get("error") or not sampler.get("per_gpu"):
        return result("soak_throttle", ERROR, f"could not watch the GPUs' clocks during the soak: {sampler.get('error') or 'no GPU sampled'}",
                      threshold=thr, detail=detail, remedy="check NVML (`nvidia-smi`) on the node and run the soak again")
    f, flags = Findings(), _Flags()
    worst = 0.0
    clocks = []
    for i, g in sorted(sampler["per_gpu"].items(), key=lambda kv: int(kv[0])):
        hw = {name: e for name, e in (g.get("throttle") or {}).items() if name in HW_SLOWDOWN_EVENTS}
        seconds = sum(e["seconds"] for e in hw.values())
        worst = max(worst, seconds)
        sm = [w["sm_clock_min_mhz"] for w in g.get("windows") or [] if w.get("sm_clock_min_mhz") is not None]
        clocks += sm
        if hw and (limit is None or seconds > limit):
            first = min(e["first_s"] for e in hw.values())
            names = ", ".join(HW_SLOWDOWN_EVENTS[n] for n in hw)
            f.add(FAIL, f"{names} {_soak_when(out, first)}, {seconds:g} s in all", gpu=int(i), remedy=SOAK_REMEDY_THROTTLE)
            flags.add(FAIL, gpus.by_index.get(i))
        if g.get("error"):
            f.add(PASS, f"some readings failed: {g['error']}", gpu=int(i))
    ok = (f"no hardware or thermal slowdown on {len(sampler['per_gpu'])} GPU(s) over {out.get('ran_s'):g} s"
          + (f" (lowest SM clock {min(clocks)} MHz)" if clocks else ""))
    return flags.apply(f.result("soak_throttle", ok, value=worst, unit="s", threshold=thr, detail=detail))


def _soak_errors(out, profile, base, gpus, Findings, cpu) -> dict:
    fail_codes = set(profiles.value(profile, "xid_fail_codes") or [])
    sampler = out.get("sampler") or {}
    events = [dict(e, utc=_soak_when(out, e.get("t_s"))) for e in sampler.get("events") or [] if e.get("kind") in ("counter", "xid")]
    detail = {**base, "events": events, "events_dropped": sampler.get("events_dropped"),
              "per_gpu": {i: {k: g.get(k) for k in ("uuid", "serial", "counters_start", "counters_end")}
                          for i, g in (sampler.get("per_gpu") or {}).items()},
              "processes": {r: {k: g.get(k) for k in ("uuid", "nvml_index", "error", "done_s", "last_burst_s", "bursts")}
                            for r, g in (out.get("gpus") or {}).items()},
              "nccl_wrong": (out.get("nccl") or {}).get("wrong")}
    f, flags = Findings(), _Flags()
    for rank, g in sorted((out.get("gpus") or {}).items(), key=lambda kv: int(kv[0])):
        if g.get("error"):
            index, prefix = gpus.label(rank)
            err = g["error"]
            f.add(FAIL, f"{prefix}the load stopped {_soak_when(out, err.get('t_s'))}: {err.get('error')}", gpu=index,
                  remedy="read the error and the node's gpu_health (Xid, ECC); a GPU that cannot hold a sustained load is not "
                         "fit for training")
            flags.add(FAIL, gpus.by_rank.get(rank))
    for wrong in (out.get("nccl") or {}).get("wrong") or []:
        rank = str(wrong["rank"])
        index, prefix = gpus.label(rank)
        f.add(FAIL, f"{prefix}all_reduce gave wrong results {_soak_when(out, wrong['t_s'])}", gpu=index,
              remedy="wrong collective results point to a faulty GPU or NVLink: run gpu_health and the nccl benchmark")
        flags.add(FAIL, gpus.by_rank.get(rank))
    if not cpu:
        if sampler.get("error") or not sampler.get("per_gpu"):
            f.add(ERROR, f"could not read the error counters during the soak: {sampler.get('error') or 'no GPU sampled'}",
                  remedy="check NVML (`nvidia-smi`) on the node and run the soak again")
        moved: dict[tuple, list] = {}
        for e in sampler.get("events") or []:
            if e.get("kind") == "counter":
                moved.setdefault((e["index"], e["counter"]), []).append(e)
            elif e.get("kind") == "xid":
                status = FAIL if e.get("xid") in fail_codes else WARN
                where = "" if e.get("index") is not None else f"PCI {e.get('pci')}: "
                f.add(status, f"{where}Xid {e.get('xid')} {_soak_when(out, e.get('t_s'))}", gpu=e.get("index"),
                      remedy="look the Xid up in NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors); the message is in detail.events")
                flags.add(status, gpus.by_index.get(str(e.get("index"))))
        for (index, counter), evs in sorted(moved.items()):
            status = FAIL if counter in SOAK_FAIL_COUNTERS else WARN
            first, last = evs[0], evs[-1]
            f.add(status, f"{counter} {first['from']} -> {last['to']}, first {_soak_when(out, first['t_s'])}", gpu=index,
                  remedy=("memory errors the GPU could not correct under load: drain the node, reset the GPU; replace it if they "
                          "come back" if status == FAIL else
                          "errors corrected under load: the fleet layer judges their rate (fleet.counter_rates); a link or "
                          "memory whose counts keep growing needs service"))
            flags.add(status, gpus.by_index.get(str(index)))
        log = sampler.get("kernel_log") or {}
        if log.get("error"):
            f.add(ERROR, f"Xid events not watched: {log['error']}",
                  remedy="run the soak as root so /dev/kmsg can be read, or allow dmesg (sysctl kernel.dmesg_restrict=0)")
    if cpu and f.status == PASS:
        return result("soak_errors", schema.SKIP, f"{len(out.get('gpus') or {})} CPU processes ran to the end, all_reduce results "
                      f"correct; {CPU_NOTE}", value=0, unit="events", detail=detail)
    ok = (f"no error counter moved, no Xid, every GPU held the load to the end over {out.get('ran_s'):g} s"
          + (f", {out['nccl']['rounds']} all_reduce rounds correct" if out.get("nccl") else ""))
    return flags.apply(f.result("soak_errors", ok, value=len(events), unit="events", detail=detail))


def _drop_pct(base: float, value: float) -> float:
    return round(100 * (base - value) / base, 1) if base else 0.0


def _stretches(drops: list, limit: float | None) -> list[list]:
    """[(window, drop %)] -> runs of consecutive windows more than `limit`% down."""
    stretches: list[list] = []
    for w, d in drops:
        if limit is None or d <= limit:
            continue
        if stretches and stretches[-1][-1][0]["index"] == w["index"] - 1:
            stretches[-1].append((w, d))
        else:
            stretches.append([(w, d)])
    return stretches


def _slowed(windows: list, key: str, limit: float | None) -> tuple[list, float | None, list]:
    """(stretches of consecutive windows more than `limit`% below the median of the best windows, that median,
    every window's drop). The reference is the best windows, not the first: a slow stretch at the start would
    lower its own reference and hide."""
    vals = [(w, w[key]) for w in windows if w.get(key) is not None]
    if len(vals) < 2:
        return [], None, []
    n_best = min(SOAK_BEST_WINDOWS, max(1, len(vals) // 2))
    best = statistics.median(sorted((v for _, v in vals), reverse=True)[:n_best])
    drops = [(w, _drop_pct(best, v)) for w, v in vals]
    return _stretches(drops, limit), best, drops


def _behind_siblings(per_gpu: dict, rank: str, key: str, limit: float | None) -> tuple[list, dict]:
    """(stretches of this GPU's windows more than `limit`% below the median of every GPU in the same window,
    {window index: that median}); a node of one GPU has no siblings."""
    if len(per_gpu) < 2:
        return [], {}
    node: dict[int, float] = {}
    for w in range(max(len(g.get("windows") or []) for g in per_gpu.values())):
        vals = [g["windows"][w][key] for g in per_gpu.values()
                if w < len(g.get("windows") or []) and g["windows"][w].get(key) is not None]
        if len(vals) >= 2:
            node[w] = statistics.median(vals)
    drops = [(w, _drop_pct(node[w["index"]], w[key])) for w in per_gpu[rank].get("windows") or []
             if w.get(key) is not None and w["index"] in node]
    return _stretches(drops, limit), node


def _stretch_text(out: dict, g: dict, prefix: str, what: str, unit: str, key: str, stretch: list, against: str) -> str:
    """ "GPU 1: bf16 matmul 700 TFLOPS in the window from <when> and 2 window(s) after it, <against>; the sampler saw..." """
    first = stretch[0][0]
    span = f" and {len(stretch) - 1} window(s) after it" if len(stretch) > 1 else ""
    return (f"{prefix}{what} {first[key]:g} {unit} in the window {_soak_when(out, first['start_s'], 'from')}{span}, "
            f"{against}; {_sampler_saw(out, g.get('nvml_index'), [w for w, _ in stretch])}")


def _sampler_saw(out: dict, index: int | None, windows: list) -> str:
    """What the soak's sampler saw on one GPU over these windows: clocks, reasons, power and foreign processes."""
    sampled = (((out.get("sampler") or {}).get("per_gpu") or {}).get(str(index)) or {}).get("windows") or []
    rows = [sampled[w["index"]] for w in windows if w["index"] < len(sampled)]
    if not rows:
        return "the sampler saw nothing of this GPU then"
    sm = [r["sm_clock_median_mhz"] for r in rows if r.get("sm_clock_median_mhz") is not None]
    power = [r["power_median_w"] for r in rows if r.get("power_median_w") is not None]
    reasons = sorted({n for r in rows for n in r.get("reasons") or []})
    procs = {p["pid"]: p for r in rows for p in r.get("foreign_processes") or []}
    saw = [f"SM clock median {min(sm):g} MHz" if sm else "SM clock unread",
           f"power median {min(power):g} W" if power else "power unread",
           f"clock event reasons {', '.join(reasons)}" if reasons else "no clock event reason"]
    saw.append("foreign process(es) " + ", ".join(
        f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB)" for p in procs.values())
        if procs else "no foreign process")
    return "the sampler saw then: " + "; ".join(saw)


def _soak_slowdown(out, profile, base_detail, gpus, Findings, cpu) -> dict:
    limit = profiles.value(profile, "soak_slowdown_pct_max")
    thr = profiles.threshold(profile, "soak_slowdown_pct_max", max=limit, best_windows=SOAK_BEST_WINDOWS)
    per_gpu = {r: {k: g.get(k) for k in ("uuid", "nvml_index", "name", "windows", "matmul_tflops_median", "hbm_gbps_median")}
               for r, g in (out.get("gpus") or {}).items()}
    detail = {**base_detail, "per_gpu": per_gpu, "nccl": out.get("nccl")}
    n_windows = out.get("n_windows") or 0
    if cpu:
        return result("soak_slowdown", schema.SKIP, f"{n_windows} windows of {out.get('window_s'):g} s on "
                      f"{len(per_gpu)} CPU processes; {CPU_NOTE}", threshold=thr, detail=detail)
    f, flags = Findings(), _Flags()
    worst = 0.0
    judged = False
    metrics = (("matmul_tflops", "bf16 matmul", "TFLOPS"), ("hbm_gbps", "HBM copy", "GB/s"))
    remedy = ("a GPU that cannot hold its throughput: compare its clocks, temperature and power per window "
              "(soak_throttle detail) with the other GPUs; check cooling and power, and whether another process "
              "used the GPU (gpu_health.processes)")
    for rank, g in sorted(per_gpu.items(), key=lambda kv: int(kv[0])):
        index, prefix = gpus.label(rank)
        for key, what, unit in metrics:
            stretches, best, drops = _slowed(g.get("windows") or [], key, limit)
            if best is None:
                continue
            judged = True
            worst = max([worst] + [d for _, d in drops])
            for stretch in stretches:
                low, low_drop = max(stretch, key=lambda wd: wd[1])
                head = stretch[0][0][key]
                f.add(FAIL, _stretch_text(out, g, prefix, what, unit, key, stretch,
                                          f"{_drop_pct(best, head):g}% below its best windows' median {sig(best):g} {unit} "
                                          f"(lowest {low[key]:g} {unit}, {low_drop:g}% below)"), gpu=index, remedy=remedy)
                flags.add(FAIL, gpus.by_rank.get(rank))
            # Window by window against its siblings: a stretch the whole node shared is not this GPU's.
            own = {w["index"] for stretch in stretches for w, _ in stretch}
            behind, node = _behind_siblings(per_gpu, rank, key, limit)
            for stretch in behind:
                if all(w["index"] in own for w, _ in stretch):
                    continue  # named already against its own best windows
                first, drop = stretch[0]
                worst = max([worst] + [d for _, d in stretch])
                f.add(FAIL, _stretch_text(out, g, prefix, what, unit, key, stretch,
                                          f"{drop:g}% below the node's median GPU in that window "
                                          f"({sig(node[first['index']]):g} {unit})"), gpu=index, remedy=remedy)
                flags.add(FAIL, gpus.by_rank.get(rank))
    # Against its siblings over the soak: a GPU slow from the first window on is not slower than itself.
    for key, what, unit in metrics:
        medians = {r: g[f"{key}_median"] for r, g in per_gpu.items() if g.get(f"{key}_median") is not None}
        if len(medians) < 2:
            continue
        node = statistics.median(medians.values())
        for rank, m in sorted(medians.items(), key=lambda kv: int(kv[0])):
            drop = _drop_pct(node, m)
            worst = max(worst, drop)
            if limit is not None and drop > limit:
                index, prefix = gpus.label(rank)
                f.add(FAIL, f"{prefix}{what} median {m:g} {unit} over the soak, {drop:g}% below the node's median GPU "
                            f"({sig(node):g} {unit})", gpu=index, remedy=remedy)
                flags.add(FAIL, gpus.by_rank.get(rank))
    nccl = out.get("nccl") or {}
    stretches, best, drops = _slowed(nccl.get("windows") or [], "busbw_gbps", limit)
    if best is not None:
        worst = max([worst] + [d for _, d in drops])
        for stretch in stretches:
            first = stretch[0][0]
            f.add(FAIL, f"all_reduce busbw {first['busbw_gbps']:g} GB/s in the window {_soak_when(out, first['start_s'], 'from')}, "
                        f"{_drop_pct(best, first['busbw_gbps']):g}% below the best windows' median {sig(best):g} GB/s",
                  remedy="NVLink or NVSwitch bandwidth fell under load: check gpu_health.nvlink and the NVLink error counters "
                         "(soak_errors), and the fabric manager")
    if not judged:
        return result("soak_slowdown", schema.SKIP,
                      f"{n_windows} window(s) of {out.get('window_s'):g} s: a slowdown needs two or more, to compare "
                      "each window with the best; soak longer",
                      threshold=thr, detail=detail)
    ok = (f"every window of every GPU within {limit:g}% of its best windows and of its siblings over {n_windows} windows of "
          f"{out.get('window_s'):g} s" if limit is not None else f"{n_windows} windows judged")
    return flags.apply(f.result("soak_slowdown", ok, value=worst, unit="%", threshold=thr, detail=detail))


# --- watched and confirmed measurements ------------------------------------------------------------------

# Results whose figure is measured once more before a warn or fail stands (the soak's windows are many
# measurements already, and a second soak would double its hours: a soak is measured again only when disturbed).
CONFIRMED_CHECKS = ("matmul_bf16", "hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_d2h_bandwidth")


def _foreign(out: dict) -> tuple[list, float | None, dict]:
    """(foreign processes the step's sampler saw, its start in epoch seconds, the sampler's own summary)."""
    mon = out.get("monitor") or out.get("sampler") or {}
    return mon.get("foreign") or [], mon.get("started_epoch") or out.get("started_epoch"), mon


def _brief(res: dict) -> dict:
    return {k: res.get(k) for k in ("check", "status", "value", "unit", "reason")}


def watched(step: str, run, judge, profile: dict, *, log: list, confirm: bool = True, wait=None,
            not_again: str | None = None) -> list[dict]:
    """Measure a step (run() -> output, judge(output, profile) -> results) until its figures can be trusted.

    - A foreign process on a GPU during the step (its sampler's `foreign`): wait until the GPUs are quiet
      (at most disturbed_wait_s) and measure again, at most disturbed_remeasure_max times; else every result
      is `error` "disturbed by pid N (name, MiB) ... from t1 to t2", trust `disturbed`. `not_again` says why a
      step is never measured again (too long, or every node of a run across nodes would have to): disturbed
      once, its results are that error.
    - A CONFIRMED_CHECKS result that warns or fails (under its minimum, an outlier, a sample far below its
      median) is measured once more (confirm_remeasure_max) and judged on the second measurement, both kept:
      trust `confirmed` (slow confirmed, or passed on confirmation), `inconclusive` when the samples dropped again.
    - Otherwise trust `clean`. Every attempt, every process seen and the seconds of each go into detail.attempts;
      `log` gets each attempt's sightings for the step's foreign_processes result.
    """
    wait = wait or wait_quiet
    disturbed_max = profiles.value(profile, "disturbed_remeasure_max") or 0
    wait_s = profiles.value(profile, "disturbed_wait_s") or 0
    confirm_max = profiles.value(profile, "confirm_remeasure_max") or 0 if confirm else 0
    attempts: list[dict] = []
    first_clean: dict | None = None  # check -> result of the clean measurement a confirmation follows
    disturbed = confirmations = 0
    while True:
        t0 = time.monotonic()
        out = run()
        res = judge(out, profile)
        seconds = round(time.monotonic() - t0, 1)
        foreign, epoch, mon = _foreign(out)
        attempt = {"attempt": len(attempts) + 1, "seconds": seconds, "results": [_brief(r) for r in res],
                   "processes": mon.get("processes") or [], "foreign": [describe(p, epoch) for p in foreign]}
        attempts.append(attempt)
        log.append({"step": step, "attempt": attempt["attempt"], "device": out.get("device"), "foreign": foreign,
                    "started_epoch": epoch, "watch_error": mon.get("error"),
                    "processes_unreadable": mon.get("processes_unreadable")})
        if foreign:
            why = None
            if not_again:
                why = f"not measured again: {not_again}"
            elif disturbed >= disturbed_max:
                why = f"still disturbed after {disturbed} measurement(s) again"
            else:
                quiet = wait(wait_s)
                attempt["wait"] = {k: quiet.get(k) for k in ("quiet", "waited_s", "error")}
                attempt["processes_while_waiting"] = quiet.get("processes") or []
                if not quiet.get("quiet"):
                    why = f"the GPUs did not become quiet within {wait_s:g} s" + (f" ({quiet['error']})" if quiet.get("error") else "")
            if why:
                return [_disturbed(r, foreign, epoch, why, attempts, profile) for r in res]
            disturbed += 1
            continue
        doubtful = [r for r in res if r["check"] in CONFIRMED_CHECKS and r["status"] in (WARN, FAIL)]
        if doubtful and first_clean is None and confirmations < confirm_max:
            confirmations += 1
            first_clean = {r["check"]: r for r in res}
            attempt["confirm"] = [r["check"] for r in doubtful]
            continue
        break
    for r in res:
        _trust(r, (first_clean or {}).get(r["check"]), attempts)
    return res


def _disturbed(res: dict, foreign: list, epoch: float | None, why: str, attempts: list, profile: dict) -> dict:
    names = "; ".join(describe(p, epoch) for p in foreign)
    # A process is not a fault of the board: the GPUs the figure would have flagged are not named.
    res["detail"] = {**{k: v for k, v in res["detail"].items() if k != "flagged_gpus"}, "attempts": attempts, "disturbed_value": res.get("value"),
                     "judged_as": _brief(res), "disturbed_wait_threshold": profiles.threshold(
                         profile, "disturbed_wait_s", max=profiles.value(profile, "disturbed_wait_s"))}
    # The class says so too: a disturbed figure does not follow the GPU to its next run (fleet.returning_gpu).
    res.update(status=ERROR, value=None, trust=schema.DISTURBED, **{"class": failure_class.ENVIRONMENT},
               reason=f"disturbed by {names}; {why}; the figure measured beside it ({res['value']} {res.get('unit') or ''}".rstrip()
                      + ") is not the node's",
               remedy="find out what runs on the GPU (detail.attempts[].processes) and stop it or keep the node out of "
                      "the scheduler while it is validated; then run again")
    return res


def _trust(res: dict, first: dict | None, attempts: list) -> None:
    """How far the figure can be trusted, said in `trust` and in the reason; both measurements kept."""
    res["detail"] = {**res["detail"], "attempts": attempts}
    if res["status"] == schema.SKIP:
        return
    if first is None or first["status"] not in (WARN, FAIL):
        res["trust"] = schema.CLEAN
        return
    extra_s = attempts[-1]["seconds"]
    res["detail"]["confirmation_s"] = extra_s
    was = f"first {first.get('value')}, then {res.get('value')} {res.get('unit') or ''}".rstrip()
    if res["detail"].get("sample_drops"):
        res.update(status=WARN if res["status"] == PASS else res["status"], trust=schema.INCONCLUSIVE,
                   reason=f"inconclusive: {res['reason']}; measured twice ({was}), the samples dropped again "
                          f"(the confirmation took {extra_s:g} s)")
    elif res["status"] in (WARN, FAIL):
        res.update(trust=schema.CONFIRMED, reason=f"slow (confirmed): {res['reason']}; measured twice ({was}; the "
                                                  f"confirmation took {extra_s:g} s)")
    else:
        res.update(trust=schema.CONFIRMED, reason=f"{res['reason']}; passed on confirmation ({was}; the first "
                                                  f"measurement said: {first['reason']}; the confirmation took {extra_s:g} s)")


def foreign_processes(step: str, log: list) -> dict:
    """`<step>_processes`: what else ran on the node's GPUs while a step measured them (log: benchmarks.watched's
    entries of that step). Any foreign process fails the node, even when the step was measured again once quiet:
    a node shared during validation is not the node a training job will get. Not the GPU's fault: no GPU flagged."""
    check = f"{step}_processes"
    detail = {"attempts": log}
    seen = [f"{describe(p, e['started_epoch'])} (attempt {e['attempt']})" for e in log for p in e["foreign"]]
    if seen:
        return result(check, FAIL, f"foreign process(es) on the GPUs while {step} measured them: " + "; ".join(seen),
                      value=len(seen), unit="sightings", detail=detail,
                      remedy="another workload used the GPU during validation: stop it (or drain the node from the "
                             "scheduler first) and validate again; the figures measured beside it were measured again "
                             "or marked disturbed")
    unwatched = [f"attempt {e['attempt']}: {e.get('watch_error') or e.get('processes_unreadable')}" for e in log
                 if e.get("watch_error") or e.get("processes_unreadable")]
    if unwatched:
        return result(check, ERROR, f"the GPUs' processes could not be listed while {step} measured: {'; '.join(unwatched)}",
                      detail=detail, remedy="check NVML (`nvidia-smi`) on the node and run again")
    return result(check, PASS, f"no foreign process on the GPUs while {step} measured them ({len(log)} measurement(s))",
                  value=0, unit="sightings", detail=detail)
