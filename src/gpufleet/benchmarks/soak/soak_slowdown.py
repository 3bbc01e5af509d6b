"""soak_slowdown: each GPU's matmul and HBM figures window by window against its own best windows and against its
siblings, and NCCL's bus bandwidth against its best windows; a stretch names the time and what the sampler saw."""

from __future__ import annotations

import statistics

from gpufleet.base import calibration, judge, profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.benchmarks.soak.soak_naming import Flags, soak_when
from gpufleet.base.numbers import significant
from gpufleet.base.schema import FAIL, PASS, result

# A GPU's best windows of a soak are its own reference: every window is judged against their median
# (at most half the windows, so that a short soak's slow stretch is not part of its own reference).
SOAK_BEST_WINDOWS = 3
SLOWDOWN_KEY = "soak_slowdown_pct_max"
# A soak window's figures and the metric each is calibrated as (calibration.py's soak_window_pct).
WINDOW_METRICS = {
    "matmul_tflops": "matmul_bf16_tflops",
    "hbm_gbps": "hbm_copy_gbps",
    "busbw_gbps": "nccl_soak_all_reduce_busbw_gbps",
}


def _drop_pct(base: float, value: float) -> float:
    return round(100 * (base - value) / base, 1) if base else 0.0


def _stretches(drops: list, limit: float | None) -> list[list]:
    """[(window, drop %)] -> runs of consecutive windows more than `limit`% down."""
    stretches: list[list] = []
    for w, d in drops:
        if limit is None or judge.judge(d, judge.Limit(SLOWDOWN_KEY, limit)).status == PASS:
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
        vals = [
            g["windows"][w][key]
            for g in per_gpu.values()
            if w < len(g.get("windows") or []) and g["windows"][w].get(key) is not None
        ]
        if len(vals) >= 2:
            node[w] = statistics.median(vals)
    drops = [
        (w, _drop_pct(node[w["index"]], w[key]))
        for w in per_gpu[rank].get("windows") or []
        if w.get(key) is not None and w["index"] in node
    ]
    return _stretches(drops, limit), node


def _stretch_text(out: dict, g: dict, prefix: str, what: str, unit: str, key: str, stretch: list, against: str) -> str:
    """ "GPU 1: bf16 matmul 700 TFLOPS in the window from <when> and 2 window(s) after it, <against>; the sampler saw..." """
    first = stretch[0][0]
    span = f" and {len(stretch) - 1} window(s) after it" if len(stretch) > 1 else ""
    return (
        f"{prefix}{what} {first[key]:g} {unit} in the window {soak_when(out, first['start_s'], 'from')}{span}, "
        f"{against}; {_sampler_saw(out, g.get('nvml_index'), [w for w, _ in stretch])}"
    )


def _sampler_saw(out: dict, index: int | None, windows: list) -> str:
    """What the soak's sampler saw on one GPU over these windows: clocks, reasons, power and foreign processes."""
    sampled = (((out.get("sampler") or {}).get("per_gpu") or {}).get(str(index)) or {}).get("windows") or []
    rows = [sampled[w["index"]] for w in windows if w["index"] < len(sampled)]
    if not rows:
        return "the sampler saw nothing of this GPU then"
    sm = [r["sm_clock_median_mhz"] for r in rows if r.get("sm_clock_median_mhz") is not None]
    power = [r["power_median_w"] for r in rows if r.get("power_median_w") is not None]
    reasons = sorted({n for r in rows for n in r.get("reasons") or []})
    procs = {(p.get("kind"), p["pid"]): p for r in rows for p in r.get("foreign_processes") or []}
    saw = [
        f"SM clock median {min(sm):g} MHz" if sm else "SM clock unread",
        f"power median {min(power):g} W" if power else "power unread",
        f"clock event reasons {', '.join(reasons)}" if reasons else "no clock event reason",
    ]
    saw.append(
        "foreign process(es) "
        + ", ".join(
            p.get("label") or f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB)"
            for p in procs.values()
        )
        if procs
        else "no foreign process"
    )
    return "the sampler saw then: " + "; ".join(saw)


def _limits(profile: dict) -> tuple[float | None, dict, dict]:
    """(the limit against the siblings, {window figure: the limit against the GPU's own best windows}, {metric: the
    own-window limits that are calibrated}). A calibrated model's limit for a GPU's windows against its own best is
    per figure: the spread of a healthy GPU's windows (calibration.py, soak_window_pct), a point or two. A GPU
    against its siblings keeps the profile's limit: healthy chips at their power cap differ by more than one chip's
    windows do (3.7% between the two GPUs of a healthy 2 x H200 in every window,
    docs/results/2026-11-28-h200-x2-one-judge-soaks), and no calibration measures that spread in a soak yet."""
    entries = {k: calibration.entry(profile["thresholds"], SLOWDOWN_KEY, m) for k, m in WINDOW_METRICS.items()}
    own_calibrated = {e["metric"]: e["value"] for e in entries.values() if e["calibrated"]}
    return profiles.value(profile, SLOWDOWN_KEY), {k: e["value"] for k, e in entries.items()}, own_calibrated


def slow_windows(out: dict, profile: dict) -> list[int]:
    """The windows soak_slowdown would name: any GPU's matmul or HBM figure past a limit against its own best
    windows or its siblings, or NCCL's bus bandwidth against its best. Every GPU of the node loads together (each
    round ends in an all_reduce), so such a window is measured again for all of them (benchmarks/soak/remeasure.py),
    as a disturbed one is."""
    limit, limits, _ = _limits(profile)
    per_gpu = out.get("gpus") or {}
    out_windows: set[int] = set()
    for rank, g in per_gpu.items():
        for key in ("matmul_tflops", "hbm_gbps"):
            stretches = _slowed(g.get("windows") or [], key, limits[key])[0]
            stretches += _behind_siblings(per_gpu, rank, key, limit)[0]
            out_windows |= {w["index"] for stretch in stretches for w, _ in stretch}
    stretches = _slowed((out.get("nccl") or {}).get("windows") or [], "busbw_gbps", limits["busbw_gbps"])[0]
    out_windows |= {w["index"] for stretch in stretches for w, _ in stretch}
    return sorted(out_windows)


def soak_slowdown(out, profile, base_detail, gpus, cpu) -> dict:
    limit, limits, own_calibrated = _limits(profile)
    threshold = profiles.threshold(
        profile,
        SLOWDOWN_KEY,
        max=limit,
        best_windows=SOAK_BEST_WINDOWS,
        **({"own_windows_by_metric": own_calibrated} if own_calibrated else {}),
    )
    per_gpu = {
        r: {k: g.get(k) for k in ("uuid", "nvml_index", "name", "windows", "matmul_tflops_median", "hbm_gbps_median")}
        for r, g in (out.get("gpus") or {}).items()
    }
    detail = {**base_detail, "per_gpu": per_gpu, "nccl": out.get("nccl")}
    n_windows = out.get("n_windows") or 0
    if cpu:
        return result(
            "soak_slowdown",
            schema.SKIP,
            f"{n_windows} windows of {out.get('window_s'):g} s on {len(per_gpu)} CPU processes; {CPU_NOTE}",
            threshold=threshold,
            detail=detail,
        )
    f, flags = Findings(), Flags()
    worst = 0.0
    judged = False
    metrics = (("matmul_tflops", "bf16 matmul", "TFLOPS"), ("hbm_gbps", "HBM copy", "GB/s"))
    remedy = (
        "a GPU that cannot hold its throughput: compare its clocks, temperature and power per window "
        "(soak_throttle detail) with the other GPUs; check cooling and power, and whether another process "
        "used the GPU (gpu_health.processes)"
    )
    for rank, g in sorted(per_gpu.items(), key=lambda kv: int(kv[0])):
        index, prefix = gpus.label(rank)
        for key, what, unit in metrics:
            stretches, best, drops = _slowed(g.get("windows") or [], key, limits[key])
            if best is None:
                continue
            judged = True
            worst = max([worst] + [d for _, d in drops])
            for stretch in stretches:
                low, low_drop = max(stretch, key=lambda wd: wd[1])
                head = stretch[0][0][key]
                f.add(
                    FAIL,
                    _stretch_text(
                        out,
                        g,
                        prefix,
                        what,
                        unit,
                        key,
                        stretch,
                        f"{_drop_pct(best, head):g}% below its best windows' median {significant(best):g} {unit} "
                        f"(lowest {low[key]:g} {unit}, {low_drop:g}% below)",
                    ),
                    gpu=index,
                    remedy=remedy,
                )
                flags.add(FAIL, gpus.by_rank.get(rank))
            # Window by window against its siblings: a stretch the whole node shared is not this GPU's.
            own = {w["index"] for stretch in stretches for w, _ in stretch}
            behind, node = _behind_siblings(per_gpu, rank, key, limit)
            for stretch in behind:
                if all(w["index"] in own for w, _ in stretch):
                    continue  # named already against its own best windows
                first, drop = stretch[0]
                worst = max([worst] + [d for _, d in stretch])
                f.add(
                    FAIL,
                    _stretch_text(
                        out,
                        g,
                        prefix,
                        what,
                        unit,
                        key,
                        stretch,
                        f"{drop:g}% below the node's median GPU in that window "
                        f"({significant(node[first['index']]):g} {unit})",
                    ),
                    gpu=index,
                    remedy=remedy,
                )
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
            if limit is not None and judge.judge(drop, judge.Limit(SLOWDOWN_KEY, limit)).status != PASS:
                index, prefix = gpus.label(rank)
                f.add(
                    FAIL,
                    f"{prefix}{what} median {m:g} {unit} over the soak, {drop:g}% below the node's median GPU "
                    f"({significant(node):g} {unit})",
                    gpu=index,
                    remedy=remedy,
                )
                flags.add(FAIL, gpus.by_rank.get(rank))
    nccl = out.get("nccl") or {}
    stretches, best, drops = _slowed(nccl.get("windows") or [], "busbw_gbps", limits["busbw_gbps"])
    if best is not None:
        worst = max([worst] + [d for _, d in drops])
        for stretch in stretches:
            first = stretch[0][0]
            f.add(
                FAIL,
                f"all_reduce busbw {first['busbw_gbps']:g} GB/s in the window {soak_when(out, first['start_s'], 'from')}, "
                f"{_drop_pct(best, first['busbw_gbps']):g}% below the best windows' median {significant(best):g} GB/s",
                remedy="NVLink or NVSwitch bandwidth fell under load: check gpu_health.nvlink and the NVLink error counters "
                "(soak_errors), and the fabric manager",
            )
    if not judged:
        return result(
            "soak_slowdown",
            schema.SKIP,
            f"{n_windows} window(s) of {out.get('window_s'):g} s: a slowdown needs two or more, to compare "
            "each window with the best; soak longer",
            threshold=threshold,
            detail=detail,
        )
    own_limits_text = (
        ", ".join(
            f"{limits[k]:g}% ({what})"
            for k, what in (("matmul_tflops", "matmul"), ("hbm_gbps", "HBM"), ("busbw_gbps", "all_reduce"))
        )
        if own_calibrated
        else f"{limit:g}%"
    )
    ok = (
        f"every window of every GPU within {own_limits_text} of its best windows and {limit:g}% of its siblings over "
        f"{n_windows} windows of {out.get('window_s'):g} s"
        if limit is not None
        else f"{n_windows} windows judged"
    )
    return flags.apply(f.result("soak_slowdown", ok, value=worst, unit="%", threshold=threshold, detail=detail))
