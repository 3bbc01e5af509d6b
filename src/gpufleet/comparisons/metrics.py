"""The comparable figures of one host document, each with its unit, its GPU and what it may be compared with.

The metric keys and what each means: metric_keys.py. Each benchmark reads its own figures out of its results (its
`figures`, registry.ROLES, in its folder), through Figures below: per GPU (NVML index, uuid, serial) or per node.
Per node, each per-GPU metric again, as its slowest GPU (a synchronous job runs at the pace of its slowest rank),
and the LoRA fine-tune in tokens/s/GPU. A figure's `context` says how it was measured (the benchmark tier, a
size and world size, a batch, the fine-tune's config), so a figure is only ever compared with one measured the
same way.

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

from gpufleet.base import registry
from gpufleet.comparisons.metric_keys import GPU_METRICS, describe

CPU_MARK = "not a performance figure"
UNSTABLE = ("fell", "disturbed")  # a figure's samples judged so (base.judge): not yet the node's
SNAPSHOT_CHECKS = ("snapshot_before", "snapshot_after")
BENCHMARK_GROUPS = (registry.BENCHMARK_GROUP, registry.MULTINODE_GROUP)
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


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text))]


class Figures:
    """What a benchmark's registered `figures` (registry.ROLES) reads one of its results into: the figures the fleet
    compares, each a row of extract()'s `metrics` (add), and their samples' spreads (add_spread); the GPU a CUDA
    device is (gpu), and what each result's detail says of its figures (the static helpers)."""

    finite = staticmethod(_finite)
    spread = staticmethod(_spread)
    tier = staticmethod(_tier)
    unstable = staticmethod(_unstable)
    natural = staticmethod(_natural)

    def __init__(self, results: list[dict], mapper: _Mapper, out: dict):
        self.results, self._mapper, self._out, self.cpu = results, mapper, out, False

    def gpu(self, cuda_index: str, uuid: str | None = None) -> dict:
        return self._mapper.gpu(cuda_index, uuid)

    def add(self, key: str, value: float, *, gpu: dict | None, context: str, source: str, **extra) -> None:
        self._out["metrics"].append(_metric(key, value, gpu=gpu, cpu=self.cpu, context=context, source=source, **extra))

    def add_gpu_figure(self, key: str, value: float, gpu: dict, res: dict, source: str, unstable: dict) -> None:
        """A GPU's figure with its result's trust, compared only with one of the same tier, with the 95% interval its
        samples gave (the result's detail) and why it is not yet the node's (unstable(): its samples' judgement)."""
        detail = res.get("detail") or {}
        interval = _intervals(detail).get((gpu.get("uuid"), key))
        why = unstable.get((gpu.get("uuid"), key))
        self.add(
            key,
            value,
            gpu=gpu,
            context=_tier(detail),
            source=source,
            trust=res.get("trust"),
            **({"interval": interval} if interval else {}),
            **({"unstable": why} if why else {}),
        )

    def node_figure(self, key: str, res: dict, context: str, **extra) -> None:
        """A node's figure that is a result's value, with its trust."""
        self.add(
            key,
            res["value"],
            gpu=None,
            context=context,
            source=f"{res['group']}.{res['check']}",
            trust=res.get("trust"),
            **extra,
        )

    def add_spread(self, key: str, spread: dict, gpu: dict, source: str) -> None:
        """A GPU's samples' spread of figure `key` (spread(): from its samples summary)."""
        self._out["spreads"].append(
            {
                "key": key,
                "label": describe(key)["label"],
                "cpu": self.cpu,
                "source": source,
                **{k: gpu.get(k) for k in ("index", "uuid", "serial", "cuda_index", "mapped_by")},
                **spread,
            }
        )


def _finetune(res: dict, figures: Figures) -> None:
    """The LoRA fine-tune's tokens/s/GPU (no benchmark: its own playbook), compared only with one of its config."""
    detail = res.get("detail") or {}
    if not _finite(res.get("value")) or res.get("status") == "error":
        return
    config = PurePath(str(detail.get("config_path") or "")).name or None
    context = f"config={config},seq={detail.get('max_seq_length')},world={detail.get('world_size')}"
    scope = "multinode" if (detail.get("nnodes") or 1) > 1 else "node"
    figures.node_figure(f"finetune_{scope}_tokens_per_s_per_gpu", res, context)


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
    figures = Figures(results, mapper, out)
    owner = {c.name: b.name for b in registry.BENCHMARKS for c in b.checks}
    for res in results:
        group, check = res.get("group"), res.get("check")
        if res.get("trust") == "disturbed" and group in BENCHMARK_GROUPS:
            # Measured beside another process: no figure of the node's, compared with nothing (comparisons.trusted).
            out["apart"].append({"source": f"{group}.{check}", "why": str(res.get("reason") or "").split("; ")[0]})
        if res.get("status") == "error" or not isinstance(res.get("detail"), dict):
            continue
        figures.cpu = is_cpu(res)
        if group in BENCHMARK_GROUPS and check in owner:
            read = registry.registered(owner[check], "figures", needed=False)
            if read is not None:
                read(res, figures)
        elif group == "finetune" and check == "finetune":
            _finetune(res, figures)
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
