"""The memory step measured again in part: a confirmation measures only the figures that asked (one GPU's HBM copy,
or one way of its PCIe link), not every GPU's HBM and PCIe again, and what it measured completes the measurement
it confirms.

    plan(out, results, asked, profile)   benchmarks.memory.run's options that measure just what asked (`only`), and
                                         what that is in words (`what`); None where a figure asked that is not one
                                         of the step's own (the whole step then)
    combined(before, again, profile)     the measurement before, its figures measured again replaced: what is
                                         judged then, every figure's samples on the first measurement's clock

Which figure asked (node.trust.asks): a result (its check: the GPUs whose samples fell, those under the minimum,
else the slowest, whose interval reaches across its limit) or a comparison's record key, check|metric|context|uuid
(that GPU; the node's figure, uuid empty, is its slowest GPU's).
"""

from __future__ import annotations

import copy

from gpufleet.base.registry import registers
from gpufleet.base import judge
from gpufleet.bench import spread_pct
from gpufleet.checks.benchmarks import cuda_gpu

# metric key -> (its part of benchmarks.memory's output, the figure's field, its samples' field, its words)
FIGURES = {
    "hbm_copy_gbps": ("hbm", "hbm_copy_gbps", "samples_gbps", "HBM copy"),
    "pcie_h2d_gbps": ("pcie", "h2d_gbps", "samples_h2d_gbps", "host-to-device"),
    "pcie_d2h_gbps": ("pcie", "d2h_gbps", "samples_d2h_gbps", "device-to-host"),
}
METRIC_OF = {
    "hbm_bandwidth": "hbm_copy_gbps",
    "pcie_h2d_bandwidth": "pcie_h2d_gbps",
    "pcie_d2h_bandwidth": "pcie_d2h_gbps",
}
UNSTABLE = (judge.FELL, judge.DISTURBED)


def _devices(out: dict, metric: str) -> dict[str, dict]:
    return (out.get("per_device") or {}).get(FIGURES[metric][0]) or {}


def _slowest(out: dict, metric: str) -> list[str]:
    field = FIGURES[metric][1]
    measured = {d: v[field] for d, v in _devices(out, metric).items() if isinstance(v.get(field), (int, float))}
    return [min(measured, key=measured.get)] if measured else []


def _by_uuid(out: dict, metric: str, uuids: set) -> list[str]:
    return [d for d, v in _devices(out, metric).items() if v.get("uuid") in uuids]


@registers("memory", "confirm")
def plan(out: dict, results: list[dict], asked: list[str], profile: dict | None = None) -> dict | None:
    """{"only": {metric: [CUDA devices]}, "what": "GPU 1 host-to-device"}: benchmarks.memory.run's options that measure
    just what asked (the module docstring), or None: measure the whole step again."""
    by_check = {r["check"]: r for r in results}
    only: dict[str, set] = {}
    for key in asked:
        if "|" in key:  # a comparison's record key: check|metric|context|uuid
            _, metric, _, uuid = key.split("|", 3)
            if metric not in FIGURES:
                return None
            devices = _by_uuid(out, metric, {uuid}) if uuid else _slowest(out, metric)
        else:
            metric, res = METRIC_OF.get(key), by_check.get(key)
            if metric is None or res is None:
                return None
            detail = res.get("detail") or {}
            uuids = {
                (j.get("gpu") or {}).get("uuid")
                for j in detail.get("samples_judged") or []
                if j.get("verdict") in UNSTABLE
            }
            uuids |= {g.get("uuid") for g in detail.get("flagged_gpus") or []}
            devices = _by_uuid(out, metric, uuids - {None}) or _slowest(out, metric)
        if not devices:
            return None
        only.setdefault(metric, set()).update(devices)
    if not only:
        return None
    mon = out.get("monitor") or {}
    what = []
    for metric, devices in only.items():
        for d in sorted(devices, key=int):
            index = cuda_gpu(mon, _devices(out, metric)[d]).get("index")
            what.append(f"{f'GPU {index}' if index is not None else f'CUDA device {d}'} {FIGURES[metric][3]}")
    return {"only": {m: sorted(d, key=int) for m, d in only.items()}, "what": ", ".join(what)}


def _shifted(entry: dict, delta: float, keys: tuple) -> dict:
    out = dict(entry)
    for k in keys:
        if isinstance(out.get(k), (int, float)):
            out[k] = round(out[k] + delta, 3)
        elif isinstance(out.get(k), list):
            out[k] = [round(t + delta, 3) if isinstance(t, (int, float)) else t for t in out[k]]
    return out


def _monitor(before: dict, again: dict) -> dict:
    """The measurement before's sampler summary, with what the sampler of the part measured again saw put on its
    clock: each figure's samples (their ends on the monotonic clock) meet the causes seen while they were taken."""
    if before.get("started_monotonic") is None or again.get("started_monotonic") is None:
        return again
    delta = again["started_monotonic"] - before["started_monotonic"]
    out = dict(before)
    per_gpu = dict(before.get("per_gpu") or {})
    for index, g in (again.get("per_gpu") or {}).items():
        mine = dict(per_gpu.get(index) or g)
        causes = [_shifted(c, delta, ("t_s",)) for c in g.get("causes") or []]
        mine["causes"] = list((per_gpu.get(index) or {}).get("causes") or []) + causes
        mine["throttled"] = sorted(set(mine.get("throttled") or []) | set(g.get("throttled") or []))
        per_gpu[index] = mine
    out["per_gpu"] = per_gpu
    for key in ("foreign", "processes"):
        out[key] = list(before.get(key) or []) + [
            _shifted(p, delta, ("first_s", "last_s")) for p in again.get(key) or []
        ]
    out["host"] = again.get("host") or before.get("host")  # the watch of the figures measured last
    return out


@registers("memory", "combine")
def combined(before: dict, again: dict, profile: dict | None = None) -> dict:
    """The measurement before with the figures the part measured again (`again`, run(only=...)) in their place,
    its summary made again from them, and `method.measured_again` saying what was."""
    out = copy.deepcopy(before)
    for part in ("hbm", "pcie"):
        for d, fig in ((again.get("per_device") or {}).get(part) or {}).items():
            mine = out["per_device"].setdefault(part, {}).setdefault(d, {})
            correct = mine.get("correct", True) and fig.get("correct", True)
            mine.update(fig)
            mine["correct"] = correct
    hbm = [v["hbm_copy_gbps"] for v in out["per_device"]["hbm"].values() if "hbm_copy_gbps" in v]
    h2d = [v["h2d_gbps"] for v in out["per_device"]["pcie"].values() if "h2d_gbps" in v]
    d2h = [v["d2h_gbps"] for v in out["per_device"]["pcie"].values() if "d2h_gbps" in v]
    out["summary"] = {
        "hbm_copy_gbps_min": min(hbm) if hbm else None,
        "hbm_spread_pct": spread_pct(hbm),
        "h2d_gbps_min": min(h2d) if h2d else None,
        "d2h_gbps_min": min(d2h) if d2h else None,
    }
    out["method"] = {
        **out.get("method", {}),
        "measured_again": [*out.get("method", {}).get("measured_again", []), (again.get("method") or {}).get("only")],
    }
    out["monitor"] = _monitor(before.get("monitor") or {}, again.get("monitor") or {})
    return out
