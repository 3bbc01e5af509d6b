"""The soak as its pictures show it, as data: report.html draws it (svg_soak.py), report.md writes it as tables.

    soak_timelines(results)   one timeline per soak part: {"title", "started", "window_s", "n_windows", "span_s",
                              "limit_pct",
                              "lanes": per GPU and figure (and NCCL's all_reduce): every window's figure, the
                                       windows kept apart (disturbed, slowed) with the figure measured then, the
                                       windows measured again, the limit under the GPU's best windows,
                              "telemetry": per GPU, every window's hottest temperature, median and highest power,
                                       median and lowest SM clock and the clock-event (throttle) reasons the sampler
                                       saw, with the GPU's power limit and slowdown temperature (gpu_health) and
                                       each reason's seconds over the soak,
                              "foreign": every process of another user the soak's steps saw, on a GPU or on the
                                       host's CPUs: {"pid", "name", "index" (None: the host), "kind" ("gpu" or
                                       "host_cpu"), "first_s", "last_s", "label", "used_memory_mib"},
                              "gaps": [(from_s, to_s)] where no window measured (drawn as such, never bridged)}

A disturbed soak measured again is one timeline where the judge joined the windows measured again to the soak's
(`remeasured` windows, benchmarks/soak/remeasure.py): the re-measure's processes are placed by its attempt's start. A
document from before that kept them apart (`detail.remeasured`) gives two: the soak, then its windows measured again.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpufleet.report.formatting import decided_limit

SOAK_CHECK = "soak_slowdown"  # the soak result whose detail holds every window of every GPU
THROTTLE_CHECK = "soak_throttle"  # ... whose detail holds what the sampler saw in each window
PROCESSES_CHECK = "soak_processes"  # ... whose detail holds every foreign process of each attempt
SOAK_FIGURES = (("matmul_tflops", "bf16 matmul", "TFLOPS"), ("hbm_gbps", "HBM copy", "GB/s"))
TELEMETRY = (
    "temperature_max_c",
    "power_median_w",
    "power_max_w",
    "sm_clock_median_mhz",
    "sm_clock_min_mhz",
    "mem_clock_min_mhz",
    "samples",
)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _reference(values: list[float], threshold: dict) -> float | None:
    """What a soak window is held against (benchmarks/soak/slowdown.py): the median of the GPU's best windows, at most
    half of them; a document from before that, the median of its first windows (`baseline_windows`)."""
    if len(values) < 2:
        return None
    if threshold.get("best_windows"):
        n = min(int(threshold["best_windows"]), max(1, len(values) // 2))
        return statistics.median(sorted(values, reverse=True)[:n])
    if threshold.get("baseline_windows"):
        return statistics.median(values[: int(threshold["baseline_windows"])])
    return None


def _lane(who: dict, key: str, label: str, unit: str, windows: list, threshold: dict, limit_pct: Any) -> dict:
    rows = []
    for w in windows:
        if not isinstance(w, dict) or not isinstance(w.get("index"), int):
            continue
        value = w.get(key)
        rows.append(
            {
                "index": w["index"],
                "start_s": w.get("start_s"),
                "value": value if _finite(value) else None,
                "disturbed": bool(w.get("disturbed")),
                "slowed": bool(w.get("slowed")),  # past a limit with nothing seen: kept apart, measured again
                "remeasured": bool(w.get("remeasured")),  # a window measured again after the soak, joined to it
                # the figure of a window kept apart (disturbed or slowed), left out of the judgement
                "disturbed_value": (w.get("disturbed_figures") or w.get("slowed_figures") or {}).get(key),
            }
        )
    best = _reference([r["value"] for r in rows if r["value"] is not None], threshold)
    limit = best * (1 - limit_pct / 100) if best is not None and _finite(limit_pct) else None
    for r in rows:
        r["below"] = limit is not None and r["value"] is not None and r["value"] < limit
    return {**who, "metric": key, "label": label, "unit": unit, "windows": rows, "best": best, "limit": limit}


def _per_gpu_of(results: list[dict], check: str, field: str) -> dict:
    """{NVML index: a field of gpu_health.<check>'s per-GPU detail} (the power limit, the slowdown temperature)."""
    res = next((r for r in results if r.get("group") == "gpu_health" and r.get("check") == check), None)
    rows = ((res or {}).get("detail") or {}).get("per_gpu") if isinstance((res or {}).get("detail"), dict) else None
    return {g["index"]: g.get(field) for g in rows or [] if isinstance(g, dict) and "index" in g}


def _telemetry(throttle: dict, limits: dict, slowdown: dict) -> list[dict]:
    out = []
    for idx, g in sorted((throttle.get("per_gpu") or {}).items(), key=lambda kv: int(kv[0])):
        if not isinstance(g, dict) or not g.get("windows"):
            continue
        windows = [
            {
                "index": w.get("index"),
                "start_s": w.get("start_s"),
                "remeasured": bool(w.get("remeasured")),
                "reasons": list(w.get("reasons") or []),
                **{k: w.get(k) if _finite(w.get(k)) else None for k in TELEMETRY},
            }
            for w in g["windows"]
            if isinstance(w, dict) and isinstance(w.get("index"), int)
        ]
        index = int(idx)
        out.append(
            {
                "gpu": f"GPU {index}",
                "index": index,
                "serial": g.get("serial"),
                "windows": windows,
                "power_limit_w": limits.get(index),
                "slowdown_c": slowdown.get(index),
                "throttle": {
                    reason: s.get("seconds") for reason, s in (g.get("throttle") or {}).items() if isinstance(s, dict)
                },
                "ran_s": throttle.get("ran_s"),
            }
        )
    return out


def _foreign(attempts: list[dict], offsets: list[float]) -> list[dict]:
    """Every foreign process of these attempts (soak_processes' detail: GPU and host), each attempt's spans moved
    by its offset into the timeline."""
    out = []
    for attempt, offset in zip(attempts, offsets):
        for p in attempt.get("foreign") or []:
            if not isinstance(p, dict) or p.get("own") is True or not _finite(p.get("first_s")):
                continue
            host = p.get("kind") == "host_cpu"
            last = p.get("last_s") if _finite(p.get("last_s")) else p["first_s"]
            out.append(
                {
                    "pid": p.get("pid"),
                    "name": p.get("name"),
                    "index": None if host else p.get("index"),
                    "kind": "host_cpu" if host else "gpu",
                    "first_s": round(p["first_s"] + offset, 1),
                    "last_s": round(last + offset, 1),
                    "label": p.get("label")
                    or f"pid {p.get('pid')} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB)",
                    "used_memory_mib": p.get("used_memory_mib"),
                    "attempt": attempt.get("attempt"),
                }
            )
    return out


def _gaps(lanes: list[dict], window_s: float, span_s: float) -> list[tuple[float, float]]:
    """The stretches of the timeline no window of any lane covers (the soak's end to a re-measure's first window)."""
    spans = sorted(
        (w["start_s"], w["start_s"] + window_s) for lane in lanes for w in lane["windows"] if _finite(w["start_s"])
    )
    out, reach = [], 0.0
    for a, b in spans:
        if a - reach > window_s * 0.1:
            out.append((round(reach, 1), round(a, 1)))
        reach = max(reach, b)
    if span_s - reach > window_s * 0.1 and reach > 0:
        out.append((round(reach, 1), round(span_s, 1)))
    return out


def _soak_part(title, detail, threshold, limit_pct, foreign, telemetry) -> dict | None:
    lanes = []
    for rank, g in sorted((detail.get("per_gpu") or {}).items(), key=lambda kv: int(kv[0])):
        index = g.get("nvml_index")
        who = {"gpu": f"GPU {index}" if index is not None else f"rank {rank}", "index": index}
        for key, label, unit in SOAK_FIGURES:
            lane = _lane(who, key, label, unit, g.get("windows") or [], threshold, limit_pct)
            if any(w["value"] is not None or w["disturbed_value"] is not None for w in lane["windows"]):
                lanes.append(lane)
    nccl = detail.get("nccl") or {}
    if nccl.get("windows"):
        who = {"gpu": "all GPUs", "index": None}
        lane = _lane(who, "busbw_gbps", "NCCL all_reduce", "GB/s", nccl["windows"], threshold, limit_pct)
        if any(w["value"] is not None or w["disturbed_value"] is not None for w in lane["windows"]):
            lanes.append(lane)
    if not lanes:
        return None
    window_s = detail.get("window_s") or 0
    ends = [w["start_s"] + window_s for lane in lanes for w in lane["windows"] if _finite(w["start_s"])]
    span_s = max(ends + [detail.get("ran_s") or 0, *(p["last_s"] for p in foreign)])
    return {
        "title": title,
        "started": detail.get("started"),
        "window_s": window_s,
        "n_windows": max(len(lane["windows"]) for lane in lanes),  # with the windows measured again, where joined
        "span_s": span_s,
        "limit_pct": limit_pct,
        "lanes": lanes,
        "telemetry": telemetry,
        "foreign": foreign,
        "gaps": _gaps(lanes, window_s, span_s) if window_s else [],
    }


def _attempts(res: dict | None) -> list[dict]:
    detail = (res or {}).get("detail")
    return [a for a in (detail or {}).get("attempts") or [] if isinstance(a, dict)] if isinstance(detail, dict) else []


def _gpu_processes(attempt: dict) -> dict:
    """A soak_slowdown attempt's GPU processes as soak_processes gives them (documents without soak_processes)."""
    return {
        **attempt,
        "foreign": [p for p in attempt.get("processes") or [] if isinstance(p, dict) and p.get("own") is False],
    }


def soak_timelines(results: list[dict]) -> list[dict]:
    """Each soak's timeline (module docstring)."""
    by_check = {r.get("check"): r for r in results if isinstance(r.get("detail"), dict)}
    res = by_check.get(SOAK_CHECK)
    if res is None:
        return []
    detail = res["detail"]
    limit = decided_limit(res) or {}
    threshold = res.get("threshold") if isinstance(res.get("threshold"), dict) else {}
    attempts = _attempts(by_check.get(PROCESSES_CHECK)) or [_gpu_processes(a) for a in _attempts(res)]
    throttle = (by_check.get(THROTTLE_CHECK) or {}).get("detail") or {}
    limits, slowdown = (
        _per_gpu_of(results, "power_limit", "power_limit_w"),
        _per_gpu_of(results, "temperature", "temperature_slowdown_c"),
    )
    again = detail.get("remeasured") if isinstance(detail.get("remeasured"), dict) else None
    if again is None:  # one timeline: each attempt's processes placed by its start against the first's
        epochs = [a.get("started_epoch") for a in attempts]
        offsets = [e - epochs[0] if _finite(e) and _finite(epochs[0]) else 0.0 for e in epochs]
        parts = [("soak", detail, _foreign(attempts, offsets), _telemetry(throttle, limits, slowdown))]
    else:
        parts = [
            ("soak", detail, _foreign(attempts[:1], [0.0]), _telemetry(throttle, limits, slowdown)),
            (
                "its disturbed windows measured again",
                again,
                _foreign(attempts[1:2], [0.0]),
                _telemetry(throttle.get("remeasured") or {}, limits, slowdown),
            ),
        ]
    out = []
    for title, part, foreign, telemetry in parts:
        timeline = _soak_part(title, part, threshold, limit.get("value"), foreign, telemetry)
        if timeline:
            out.append(timeline)
    return out
