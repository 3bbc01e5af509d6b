"""A disturbed soak measured again: the windows in which another process used the GPUs, the options to measure
them again (bounded by soak_remeasure_max_s), and the output both parts are judged on."""

from __future__ import annotations

import statistics

from gpufleet import profiles
from gpufleet.numbers import significant


def disturbed_windows(out: dict) -> list[int]:
    """The soak's windows in which its sampler saw a foreign process on any GPU: every GPU of the node loads
    together (each round ends in an all_reduce), so such a window is no GPU's own figure."""
    per_gpu = (out.get("sampler") or {}).get("per_gpu") or {}
    return sorted({w["index"] for g in per_gpu.values() for w in g.get("windows") or [] if w.get("foreign_processes")})


def remeasure_plan(first: dict, profile: dict) -> dict:
    """bench.soak.run's options to measure a disturbed soak's windows again: as long as those windows (two at
    least, to compare), at most soak_remeasure_max_s, whatever the soak's own length."""
    cap = profiles.value(profile, "soak_remeasure_max_s") or 0
    window = min(first.get("window_s") or 30.0, cap / 2) if cap else first.get("window_s") or 30.0
    n = max(2, len(disturbed_windows(first)))
    duration = min(cap, n * window) if cap else n * window
    return {"duration_s": max(duration, 2 * window), "window_s": window}


def combined(first: dict, again: dict) -> dict:
    """What a disturbed soak is judged on: the first soak with its disturbed windows left out of the slowdown
    judgement (their figures kept apart), and the short soak that measured them again (soak() judges both)."""
    gone = set(disturbed_windows(first))
    gpus = {}
    for rank, g in (first.get("gpus") or {}).items():
        windows = [
            w
            if w["index"] not in gone
            else {
                **w,
                "matmul_tflops": None,
                "hbm_gbps": None,
                "disturbed": True,
                "disturbed_figures": {"matmul_tflops": w.get("matmul_tflops"), "hbm_gbps": w.get("hbm_gbps")},
            }
            for w in g.get("windows") or []
        ]
        kept = {k: [w[k] for w in windows if w.get(k) is not None] for k in ("matmul_tflops", "hbm_gbps")}
        gpus[rank] = {
            **g,
            "windows": windows,
            **{f"{k}_median": significant(statistics.median(v)) if v else None for k, v in kept.items()},
        }
    nccl = first.get("nccl")
    if nccl:
        nccl = {
            **nccl,
            "windows": [
                w if w["index"] not in gone else {**w, "busbw_gbps": None, "disturbed": True}
                for w in nccl.get("windows") or []
            ],
        }
    return {**first, "gpus": gpus, "nccl": nccl, "disturbed_windows": sorted(gone), "remeasured": again}
