"""The comparable figures of one host document, each with its unit, its GPU and what it may be compared with.

The metric keys and what each means: metric_keys.py. Per GPU (NVML index, uuid, serial): matmul per dtype, HBM
copy, PCIe copies. Per node (no GPU): each per-GPU metric again, as its slowest GPU (a synchronous job runs at
the pace of its slowest rank), NCCL busbw per collective and size band, the slowest send/recv pair, the GPT-2
training gate and the LoRA fine-tune in tokens/s/GPU.

A band's figure is the busbw at the largest size measured in it; that size and the world size are the metric's
`context`, so a figure is only ever compared with one measured the same way (the same goes for the benchmark
tier of matmul and memory, the batch of the training gate and the config of the fine-tune).

Which GPU a CUDA device is: the benchmark's `uuid` per device when it recorded one; otherwise the i-th GPU this
node can see (the counter snapshots say which are visible), otherwise the i-th GPU of the inventory. The last two
assume CUDA numbers GPUs in NVML's order (`mapped_by: position` says so).

A CPU run (status skip, "not a performance figure") still yields its metrics, flagged `cpu`, so the fleet
logic runs in CI; the comparisons then say "CPU run" and claim nothing.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePath
from typing import Any

from gpufleet.comparisons.metric_keys import DTYPES, GPU_METRICS, band_of, describe

CPU_MARK = "not a performance figure"
UNSTABLE = ("fell", "disturbed")  # a figure's samples judged so (base.judge): not yet the node's
SNAPSHOT_CHECKS = ("snapshot_before", "snapshot_after")
MEMORY_CHECKS = ("hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_d2h_bandwidth")
FABRIC_CHECKS = ("fabric_before", "fabric_after")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_cpu(res: dict) -> bool:
    """A CPU run: the benchmark says its figure is none (checks.benchmarks.CPU_NOTE), or gloo stood in for NCCL."""
    detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
    return CPU_MARK in str(res.get("reason") or "") or detail.get("backend") == "gloo" or detail.get("device") == "cpu"


def _results(doc_or_results: Any) -> list[dict]:
    results = doc_or_results.get("results") if isinstance(doc_or_results, dict) else doc_or_results
    return [r for r in results or [] if isinstance(r, dict)]


def _find(results: list[dict], group: str, check: str) -> dict | None:
    """The last result of that group and check (a later pass of the same stage replaces an earlier one)."""
    last = None
    for r in results:
        if r.get("group") == group and r.get("check") == check:
            last = r
    return last


def snapshots(results: list[dict]) -> dict:
    """{"before": detail, "after": detail} of the counter snapshots that were read (status pass), and
    {"problems": {phase: reason}} for those that were not; the same of the fabric snapshots under "fabric",
    with "skipped": {phase: reason} where the node has no fabric counters."""
    out: dict = {"problems": {}, "fabric": {"problems": {}, "skipped": {}}}
    for checks, into, listed in ((SNAPSHOT_CHECKS, out, "gpus"), (FABRIC_CHECKS, out["fabric"], "devices")):
        for check in checks:
            res = _find(results, "counters", check)
            if res is None:
                continue
            phase = check.split("_", 1)[1]
            detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
            if res.get("status") == "pass" and isinstance(detail.get(listed), list):
                into[phase] = detail
            else:
                kind = "skipped" if res.get("status") == "skip" and "skipped" in into else "problems"
                into[kind][phase] = f"counters.{check} is {res.get('status')}: {res.get('reason')}"
    return out


def inventory(results: list[dict]) -> list[dict]:
    """Every GPU NVML saw on the node: [{"index", "uuid", "serial", "pci_bus_id", "name", "visible"}], by index.

    From the counter snapshots (which say which GPUs are visible) and gpu_inventory.gpu_count; a GPU known to
    one only is still listed.
    """
    gpus: dict[int, dict] = {}
    count = _find(results, "gpu_inventory", "gpu_count")
    inv = ((count or {}).get("detail") or {}).get("inventory") or {}
    for g in inv.get("gpus") or []:
        if isinstance(g, dict) and isinstance(g.get("index"), int):
            gpus[g["index"]] = {
                "index": g["index"],
                "uuid": g.get("uuid"),
                "serial": g.get("serial"),
                "pci_bus_id": g.get("pci_bus_id"),
                "name": g.get("name"),
                "visible": None,
            }
    snaps = snapshots(results)
    for phase in ("before", "after"):
        for g in (snaps.get(phase) or {}).get("gpus") or []:
            if not isinstance(g, dict) or not isinstance(g.get("index"), int):
                continue
            known = gpus.setdefault(
                g["index"],
                {"index": g["index"], "uuid": None, "serial": None, "pci_bus_id": None, "name": None, "visible": None},
            )
            for k in ("uuid", "serial", "pci_bus_id"):
                known[k] = known[k] or g.get(k)
            if isinstance(g.get("visible"), bool):
                known["visible"] = g["visible"]
    return [gpus[i] for i in sorted(gpus)]


class _Mapper:
    """CUDA device number -> the GPU it is (module docstring)."""

    def __init__(self, gpus: list[dict]):
        self.by_uuid = {g["uuid"]: g for g in gpus if g.get("uuid")}
        visible = [g for g in gpus if g.get("visible") is True]
        self.position = visible or [g for g in gpus if g.get("visible") is not False]
        self.position_from = "the GPUs this node sees" if visible else "the inventory"

    def gpu(self, cuda_index: str, uuid: str | None = None) -> dict:
        if uuid:
            g = self.by_uuid.get(uuid, {})
            return {
                "index": g.get("index"),
                "uuid": uuid,
                "serial": g.get("serial"),
                "cuda_index": cuda_index,
                "mapped_by": "uuid",
            }
        if str(cuda_index).isdigit() and int(cuda_index) < len(self.position):
            g = self.position[int(cuda_index)]
            return {
                "index": g["index"],
                "uuid": g.get("uuid"),
                "serial": g.get("serial"),
                "cuda_index": cuda_index,
                "mapped_by": "position",
                "mapped_from": self.position_from,
            }
        return {"index": None, "uuid": None, "serial": None, "cuda_index": cuda_index, "mapped_by": None}


def _metric(key: str, value: float, *, gpu: dict | None, cpu: bool, context: str, source: str, **extra) -> dict:
    desc = describe(key)
    row = {
        "key": key,
        "label": desc["label"],
        "value": float(value),
        "unit": desc["unit"],
        "scope": "gpu" if gpu else "node",
        "index": None,
        "uuid": None,
        "serial": None,
        "cuda_index": None,
        "mapped_by": None,
        "cpu": cpu,
        "context": context,
        "source": source,
        "shared": desc["shared"],
    }
    if gpu:
        row.update({k: gpu.get(k) for k in ("index", "uuid", "serial", "cuda_index", "mapped_by")})
    row.update(extra)
    return row


def _spread(samples: Any) -> dict | None:
    """{"n", "min", "median", "max", "spread_pct"} from a samples summary; spread_pct computed when absent."""
    if not isinstance(samples, dict):
        return None
    lo, mid, hi = samples.get("min"), samples.get("median"), samples.get("max")
    spread = samples.get("spread_pct")
    if not _finite(spread):
        if not (_finite(lo) and _finite(mid) and _finite(hi)) or mid <= 0:
            return None
        spread = (hi - lo) / mid * 100
    return {"n": samples.get("n"), "min": lo, "median": mid, "max": hi, "spread_pct": round(float(spread), 2)}


def _best_shape_samples(per_shape: Any) -> dict | None:
    """Before benchmarks kept samples_tflops: the bf16 shape with the best median, whose samples gave the figure."""
    shapes = per_shape.get("bf16") if isinstance(per_shape, dict) else None
    good = [
        s
        for s in shapes or []
        if isinstance(s, dict) and isinstance(s.get("tflops"), dict) and _finite(s["tflops"].get("median"))
    ]
    return max(good, key=lambda s: s["tflops"]["median"])["tflops"] if good else None


def _tier(detail: dict) -> str:
    method = detail.get("method") if isinstance(detail.get("method"), dict) else {}
    return f"tier={method.get('tier')}"


def _intervals(detail: dict) -> dict[tuple, list]:
    """(uuid, metric) -> the 95% interval of a figure's median, where its samples gave one (checks.figures)."""
    return {
        ((j.get("gpu") or {}).get("uuid"), j.get("metric")): j["interval"]
        for j in detail.get("samples_judged") or []
        if isinstance(j, dict) and isinstance(j.get("interval"), (list, tuple)) and len(j["interval"]) == 2
    }


def _unstable(detail: dict, source: str) -> dict[tuple, str]:
    """(uuid, metric) -> why a figure is not yet the node's: its samples fell in its last measurement, with nothing
    seen or beside a cause (checks.figures). Such a figure is compared with nothing (comparisons.trusted)."""
    out = {}
    for j in detail.get("samples_judged") or []:
        if not isinstance(j, dict) or j.get("verdict") not in UNSTABLE or not (j.get("gpu") or {}).get("uuid"):
            continue
        how = "beside a cause the sampler saw" if j["verdict"] == "disturbed" else "with nothing seen on the GPU"
        out[(j["gpu"]["uuid"], j.get("metric"))] = (
            f"its samples fell {how} ({j.get('low')} of {j.get('n')} more than {j.get('limit')}% below their "
            f"median): not yet the node's ({source})"
        )
    return out


def _matmul(res: dict, mapper: _Mapper, cpu: bool, out: dict) -> None:
    detail = res.get("detail") or {}
    intervals = _intervals(detail)
    per_gpu = detail.get("per_gpu") if isinstance(detail.get("per_gpu"), dict) else {}
    per_shape = detail.get("per_shape") if isinstance(detail.get("per_shape"), dict) else {}
    source = "benchmark.matmul_bf16"
    unstable = _unstable(detail, source)
    for cuda, figures in sorted(per_gpu.items(), key=lambda kv: _natural(kv[0])):
        if not isinstance(figures, dict):
            continue
        gpu = mapper.gpu(cuda, figures.get("uuid"))
        for dtype in DTYPES:
            if _finite(figures.get(dtype)):
                key = f"matmul_{dtype}_tflops"
                interval = intervals.get((gpu.get("uuid"), key))
                why = unstable.get((gpu.get("uuid"), key))
                out["metrics"].append(
                    _metric(
                        key,
                        figures[dtype],
                        gpu=gpu,
                        cpu=cpu,
                        context=_tier(detail),
                        source=source,
                        trust=res.get("trust"),
                        **({"interval": interval} if interval else {}),
                        **({"unstable": why} if why else {}),
                    )
                )
        spread = _spread(figures.get("samples_tflops")) or _spread(_best_shape_samples(per_shape.get(cuda)))
        if spread and _finite(figures.get("bf16")):
            out["spreads"].append(
                {
                    "key": "matmul_bf16_tflops",
                    "label": "bf16 matmul",
                    "cpu": cpu,
                    "source": source,
                    **{k: gpu.get(k) for k in ("index", "uuid", "serial", "cuda_index", "mapped_by")},
                    **spread,
                }
            )


def _memory(res: dict, mapper: _Mapper, cpu: bool, out: dict, memory_results: list[dict]) -> None:
    detail = res.get("detail") or {}
    intervals = _intervals(detail)
    per = detail.get("per_gpu") if isinstance(detail.get("per_gpu"), dict) else {}
    # The three results share one detail, each judging its own figure's samples: every result's judgement is read.
    unstable = {
        k: v for r in memory_results for k, v in _unstable(r.get("detail") or {}, f"benchmark.{r['check']}").items()
    }
    parts = (
        ("hbm", "hbm_copy_gbps", "samples_gbps", "benchmark.hbm_bandwidth"),
        ("pcie", "h2d_gbps", "samples_h2d_gbps", "benchmark.pcie_h2d_bandwidth"),
        ("pcie", "d2h_gbps", "samples_d2h_gbps", "benchmark.pcie_d2h_bandwidth"),
    )
    for part, field, samples, source in parts:
        devices = per.get(part) if isinstance(per.get(part), dict) else {}
        key = field if part == "hbm" else f"pcie_{field}"
        for cuda, fig in sorted(devices.items(), key=lambda kv: _natural(kv[0])):
            if not isinstance(fig, dict) or not _finite(fig.get(field)) or fig.get("correct") is False:
                continue
            gpu = mapper.gpu(cuda, fig.get("uuid"))
            interval = intervals.get((gpu.get("uuid"), key))
            why = unstable.get((gpu.get("uuid"), key))
            out["metrics"].append(
                _metric(
                    key,
                    fig[field],
                    gpu=gpu,
                    cpu=cpu,
                    context=_tier(detail),
                    source=source,
                    trust=res.get("trust"),
                    **({"interval": interval} if interval else {}),
                    **({"unstable": why} if why else {}),
                )
            )
            spread = _spread(fig.get(samples))
            if spread:
                out["spreads"].append(
                    {
                        "key": key,
                        "label": describe(key)["label"],
                        "cpu": cpu,
                        "source": source,
                        **{k: gpu.get(k) for k in ("index", "uuid", "serial", "cuda_index", "mapped_by")},
                        **spread,
                    }
                )


def _nccl(res: dict, scope: str, cpu: bool, out: dict) -> None:
    detail = res.get("detail") or {}
    collective = res["check"][len("nccl_") :]
    rows = [
        r
        for r in detail.get("rows") or []
        if isinstance(r, dict)
        and r.get("correct", True)
        and isinstance(r.get("size_bytes"), int)
        and _finite(r.get("busbw_gbps"))
    ]
    best: dict[str, dict] = {}
    for r in rows:
        band = band_of(r["size_bytes"])
        if band not in best or r["size_bytes"] > best[band]["size_bytes"]:
            best[band] = r
    for band, r in best.items():
        out["metrics"].append(
            _metric(
                f"nccl_{scope}_{collective}_busbw_gbps_{band}",
                r["busbw_gbps"],
                gpu=None,
                cpu=cpu,
                context=f"size={r['size_bytes']},world={detail.get('world_size')}",
                source=f"{res['group']}.{res['check']}",
                size_bytes=r["size_bytes"],
                trust=res.get("trust"),
            )
        )


def _sendrecv(res: dict, cpu: bool, out: dict) -> None:
    detail = res.get("detail") or {}
    matrix = detail.get("matrix") if isinstance(detail.get("matrix"), dict) else {}
    cells = [
        c.get("gbps") for row in matrix.get("gbps") or [] for c in row or [] if isinstance(c, dict) and c.get("correct")
    ]
    cells = [c for c in cells if _finite(c)]
    if cells:
        out["metrics"].append(
            _metric(
                "nccl_node_sendrecv_gbps",
                min(cells),
                gpu=None,
                cpu=cpu,
                context=f"size={matrix.get('size_bytes')},world={detail.get('world_size')}",
                source=f"{res['group']}.{res['check']}",
            )
        )


def _tokens(res: dict, name: str, scope: str, cpu: bool, out: dict) -> None:
    detail = res.get("detail") or {}
    if not _finite(res.get("value")) or res.get("status") == "error":
        return
    if name == "train_gpt2":
        context = f"batch={detail.get('batch_per_gpu')},world={detail.get('world_size')}"
    else:
        config = PurePath(str(detail.get("config_path") or "")).name or None
        context = f"config={config},seq={detail.get('max_seq_length')},world={detail.get('world_size')}"
    _node_figure(f"{name}_{scope}_tokens_per_s_per_gpu", res, cpu, context, out)


def _node_figure(key: str, res: dict, cpu: bool, context: str, out: dict, **extra) -> None:
    """A node's figure that is a result's value, with its trust."""
    source = f"{res['group']}.{res['check']}"
    out["metrics"].append(
        _metric(key, res["value"], gpu=None, cpu=cpu, context=context, source=source, trust=res.get("trust"), **extra)
    )


# The host's own figures (benchmarks.host.host_judge): check -> metric key.
HOST_CHECKS = {
    "host_memory_bandwidth": "host_memory_gbps",
    "disk_write_bandwidth": "disk_write_gbps",
    "disk_read_bandwidth": "disk_read_gbps",
    "data_loader": "loader_tokens_per_s_per_gpu",
}
HOST_METRICS = tuple(HOST_CHECKS.values())


def _host(res: dict, cpu: bool, out: dict) -> None:
    """A figure of the host's own (its value: the slowest NUMA node, the drive, the loader), compared only with one
    measured the same way (the tier; for the drive also the tool and its folder); on a virtual machine it says why
    the host is one (`virtual`: benchmarks.host's `machine`)."""
    detail = res.get("detail") or {}
    if not _finite(res.get("value")) or res.get("status") == "error":
        return
    context = _tier(detail)
    if res["check"].startswith("disk_"):
        context = (
            f"tier={(detail.get('method') or {}).get('tier')},tool={detail.get('tool')},at={detail.get('scratch')}"
        )
    machine = detail.get("machine") if isinstance(detail.get("machine"), dict) else {}
    virtual = {"virtual": machine["why"]} if machine.get("virtual") and machine.get("why") else {}
    _node_figure(HOST_CHECKS[res["check"]], res, cpu, context, out, **virtual)


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text))]


def extract(doc_or_results: Any, gpus: list[dict] | None = None) -> dict:
    """{"gpus": inventory, "metrics": [...], "spreads": [...], "snapshots": {...}, "apart": [...], "cpu": bool} of
    one node; `apart`: the results measured beside another process ({"source", "why"}), whose figures are none.

    Per-GPU metrics first, then the node-level ones, the slowest GPU of each per-GPU metric among them. `gpus`: the
    node's GPUs where the caller has them (the node's own NVML readings), else read from the results.
    """
    results = _results(doc_or_results)
    gpus = gpus if gpus is not None else inventory(results)
    mapper = _Mapper(gpus)
    out: dict = {"gpus": gpus, "metrics": [], "spreads": [], "snapshots": snapshots(results), "apart": []}
    memory_done = False
    for res in results:
        group, check = res.get("group"), res.get("check")
        if res.get("trust") == "disturbed" and group in ("benchmark", "benchmark_multinode"):
            # Measured beside another process: no figure of the node's, compared with nothing (comparisons.trusted).
            out["apart"].append({"source": f"{group}.{check}", "why": str(res.get("reason") or "").split("; ")[0]})
        if res.get("status") == "error" or not isinstance(res.get("detail"), dict):
            continue
        cpu = is_cpu(res)
        if group == "benchmark" and check == "matmul_bf16":
            _matmul(res, mapper, cpu, out)
        elif group == "benchmark" and check in MEMORY_CHECKS and not memory_done:
            memory = [r for r in results if r.get("group") == "benchmark" and r.get("check") in MEMORY_CHECKS]
            _memory(res, mapper, cpu, out, memory)  # the three share one detail: read it once
            memory_done = True
        elif group == "benchmark" and check == "nccl_sendrecv":
            _sendrecv(res, cpu, out)
        elif (
            group in ("benchmark", "benchmark_multinode")
            and str(check).startswith("nccl_")
            and check not in ("nccl_transport", "nccl_sendrecv")
        ):
            _nccl(res, "node" if group == "benchmark" else "multinode", cpu, out)
        elif group in ("benchmark", "benchmark_multinode") and check == "train_gpt2":
            _tokens(res, "train_gpt2", "node" if group == "benchmark" else "multinode", cpu, out)
        elif group == "benchmark" and check in HOST_CHECKS:
            _host(res, cpu, out)
        elif group == "finetune" and check == "finetune":
            nnodes = res["detail"].get("nnodes") or 1
            _tokens(res, "finetune", "multinode" if nnodes > 1 else "node", cpu, out)
    # The node's figure of a per-GPU metric is its slowest GPU's.
    node_rows = []
    for key in GPU_METRICS:
        rows = [m for m in out["metrics"] if m["key"] == key]
        if rows:
            slow = min(rows, key=lambda m: m["value"])
            node_rows.append(
                _metric(
                    key,
                    slow["value"],
                    gpu=None,
                    cpu=any(m["cpu"] for m in rows),
                    context=slow["context"],
                    source=slow["source"],
                    slowest_gpu=slow["index"] if slow["index"] is not None else slow["cuda_index"],
                    **({"unstable": f"its slowest GPU's {slow['unstable']}"} if slow.get("unstable") else {}),
                )
            )
    out["metrics"] += node_rows
    out["cpu"] = any(m["cpu"] for m in out["metrics"])
    return out
