"""A soak measured again in part: the windows in which another process used the GPUs (disturbed) or a figure fell
past its limit with nothing seen (slowed, soak_slowdown's), the options to measure them again (bounded by
soak_remeasure_max_s), and the output both parts are judged on.

A re-measure is a short soak of its own, and its first window is its warm-up (the GPUs' clocks and NCCL's
communicator starting again): that window is kept apart, never judged, and the re-measure's other windows join the
first soak's clean ones as windows of the same soak, each judged against the same soak's best windows and siblings,
as any window is (benchmarks/soak/slowdown.py). A re-measure is judged like a measure.

The windows measured again are kept apart, their figures under `disturbed_figures` or `slowed_figures`: a window
that slowed once and not in the re-measure was not the GPU's (the node passes, the report says it measured again);
a slowdown that the re-measure's windows show too stands, confirmed (node.measure.watched, comparisons.confirm's
rule: past a limit twice in a row)."""

from __future__ import annotations

import statistics

from gpufleet.base.registry import registers
from gpufleet.base import profiles
from gpufleet.base.numbers import significant
from gpufleet.benchmarks.soak.soak_slowdown import slow_windows

WARM_UP_WINDOWS = 1  # a re-measure's first window: its warm-up, left out of the judgement
FIGURES = ("matmul_tflops", "hbm_gbps")


def disturbed_windows(out: dict) -> list[int]:
    """The soak's windows in which its sampler saw a foreign process on any GPU: every GPU of the node loads
    together (each round ends in an all_reduce), so such a window is no GPU's own figure."""
    per_gpu = (out.get("sampler") or {}).get("per_gpu") or {}
    return sorted({w["index"] for g in per_gpu.values() for w in g.get("windows") or [] if w.get("foreign_processes")})


@registers("soak", "again")
def remeasure_plan(first: dict, profile: dict) -> dict:
    """benchmarks.soak.soak_measure.run's options to measure a soak's disturbed or slowed windows again: a warm-up window, then as many
    windows as were disturbed (two at least, to compare; slowed windows ask for no more: two say whether the
    slowdown holds, and a GPU slow in every window of a long soak would otherwise cut the re-measure into windows
    too short to judge), the whole at most soak_remeasure_max_s, whatever the soak's length."""
    cap = profiles.value(profile, "soak_remeasure_max_s") or 0
    n = WARM_UP_WINDOWS + max(2, len(disturbed_windows(first)))
    window = first.get("window_s") or 30.0
    if cap:
        window = min(window, cap / n)
    return {"duration_s": n * window, "window_s": window}


def _blank(w: dict, keys: tuple, why: str) -> dict:
    """A window kept apart: its figures out of the judgement, kept under `<why>_figures`."""
    return {**w, **{k: None for k in keys}, why: True, f"{why}_figures": {k: w.get(k) for k in keys}}


def _joined(first: list, again: list, offset_s: float, keys: tuple) -> list:
    """The first soak's windows, then the re-measure's after its warm-up, numbered on and timed from the first
    soak's start (offset_s: when the re-measure started, in the first soak's seconds)."""
    out = list(first)
    for w in again:
        if w["index"] < WARM_UP_WINDOWS:
            continue
        out.append({**w, "index": len(out), "start_s": round(w["start_s"] + offset_s, 1), "remeasured": True})
    return out


@registers("soak", "combine")
def combined(first: dict, again: dict, profile: dict | None = None) -> dict:
    """What a soak measured again in part is judged on: the first soak with its disturbed windows and (given the
    profile) its slowed ones kept apart (their figures under disturbed_figures, slowed_figures), the re-measure's
    windows after its warm-up added as windows of the same soak, and the re-measure itself under `remeasured` (its
    throttle and error events are judged too: benchmarks.soak.soak_judge)."""
    disturbed = set(disturbed_windows(first))
    slowed = set(slow_windows(first, profile)) - disturbed if profile is not None else set()
    gone = disturbed | slowed

    def kept_apart(w: dict, keys: tuple) -> dict:
        if w["index"] not in gone:
            return w
        return _blank(w, keys, "disturbed" if w["index"] in disturbed else "slowed")

    if first.get("started_epoch") is not None and again.get("started_epoch") is not None:
        offset = again["started_epoch"] - first["started_epoch"]
    else:
        offset = first.get("ran_s") or 0.0
    again_gpus = again.get("gpus") or {}
    gpus = {}
    for rank, g in (first.get("gpus") or {}).items():
        kept = [kept_apart(w, FIGURES) for w in g.get("windows") or []]
        windows = _joined(kept, (again_gpus.get(rank) or {}).get("windows") or [], offset, FIGURES)
        judged = {k: [w[k] for w in windows if w.get(k) is not None] for k in FIGURES}
        gpus[rank] = {
            **g,
            "windows": windows,
            **{f"{k}_median": significant(statistics.median(v)) if v else None for k, v in judged.items()},
        }
    nccl = first.get("nccl")
    if nccl:
        kept = [kept_apart(w, ("busbw_gbps",)) for w in nccl.get("windows") or []]
        windows = _joined(kept, (again.get("nccl") or {}).get("windows") or [], offset, ("busbw_gbps",))
        nccl = {**nccl, "windows": windows}
    sampler = first.get("sampler") or {}
    again_sampled = (again.get("sampler") or {}).get("per_gpu") or {}
    per_gpu = {
        i: {
            **g,
            "windows": _joined(g.get("windows") or [], (again_sampled.get(i) or {}).get("windows") or [], offset, ()),
        }
        for i, g in (sampler.get("per_gpu") or {}).items()
    }
    warm_up = {
        rank: [w for w in g.get("windows") or [] if w["index"] < WARM_UP_WINDOWS] for rank, g in again_gpus.items()
    }
    return {
        **first,
        "gpus": gpus,
        "nccl": nccl,
        "sampler": {**sampler, "per_gpu": per_gpu},
        "n_windows": max((len(g["windows"]) for g in gpus.values()), default=first.get("n_windows")),
        "disturbed_windows": sorted(disturbed),
        "slowed_windows": sorted(slowed),
        "remeasured": again,
        "remeasure_warm_up": warm_up,
    }
