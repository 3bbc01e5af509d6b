"""One way to judge a figure against a limit, and a figure's samples: every check that holds a number against a
threshold comes here (the node's benchmark checks, the soak's windows, the fleet's comparisons, the confirmations).

    Limit(key, value, fail=..., kind="max"|"min")  a profile threshold as the judge reads it: `value` the first
                        level (warn, or the only one), `fail` the second where there are two; kind "max": a figure
                        over it does not pass, "min": a figure under it; exactly at a limit passes
    judge(figure, limit, interval=(lo, hi))        -> Judgement(status, margin, near): near when the figure's
                        interval reaches across a level, so that measuring again could change the status
    below_pct(value, reference)                    how far a figure is below its reference, in percent
    median_interval(values)                        the distribution-free 95% interval of a median
    samples(values, drop_pct, ...)                 a figure's timed samples judged together (judge_samples)

A figure is judged, not a sample: one low sample is this platform's normal (a pinned PCIe copy on a quiet H100
fell 43% below its median once in 20), so samples() decides from how many fell, how far, and whether the sampler
saw a cause at that moment (a process, a clock event, a throttle reason, PCIe replays).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from gpufleet.base.schema import FAIL, PASS, WARN

MAX, MIN = "max", "min"
# Low samples a figure may have without a cause before it is not yet the node's (the rule: one is not a
# disturbance by itself), and how far the deepest of them may go, in multiples of the drop limit.
ISOLATED_DEPTH_FACTOR = 3.0
Z95 = 1.96


@dataclass(frozen=True)
class Limit:
    key: str
    value: float | None
    fail: float | None = None
    kind: str = MAX
    breach: str = FAIL  # the status of a figure past a one-level limit (value only)

    def levels(self) -> list[tuple[float, str]]:
        """(level, status past it), the harsher first."""
        if self.fail is None:
            return [(self.value, self.breach)] if self.value is not None else []
        return [(lvl, st) for lvl, st in ((self.fail, FAIL), (self.value, WARN)) if lvl is not None]


@dataclass(frozen=True)
class Judgement:
    status: str
    margin: float | None  # how far inside (+) or past (-) the first level the figure is, in its unit
    near: bool  # its interval reaches across a level


def _past(figure: float, level: float, kind: str) -> bool:
    return figure > level if kind == MAX else figure < level


def judge(figure: float, limit: Limit, *, interval: tuple[float, float] | None = None) -> Judgement:
    """The one judgement of a figure against a limit (module docstring). A limit without a level passes."""
    levels = limit.levels()
    if not levels:
        return Judgement(PASS, None, False)
    status = next((st for lvl, st in levels if _past(figure, lvl, limit.kind)), PASS)
    first = min(lvl for lvl, _ in levels) if limit.kind == MAX else max(lvl for lvl, _ in levels)
    margin = (first - figure) if limit.kind == MAX else (figure - first)
    near = False
    if interval is not None:
        lo, hi = min(interval), max(interval)
        near = any(lo < lvl < hi for lvl, _ in levels)
    return Judgement(status, round(margin, 9), near)


def below_pct(value: float, reference: float) -> float:
    """Percent below the reference (negative: above it); 5% below is 5.0, not 5.000000000000004."""
    return round((reference - value) / reference * 100, 9)


def median_interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% interval of the median of `values` from their order statistics (no assumption about their
    distribution); None under 6 values, where it would span them all."""
    n = len(values)
    if n < 6:
        return None
    ordered = sorted(values)
    half = Z95 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half) - 1), min(n - 1, math.ceil(n / 2 + half))
    return ordered[lo], ordered[hi]


# ---------------------------------------------------------------- a figure's samples

STEADY, ISOLATED, FELL, DISTURBED = "steady", "isolated", "fell", "disturbed"


def samples(
    values: list[float],
    drop_pct: float | None,
    *,
    allowed: int = 1,
    causes: list[dict] | None = None,
    ends_s: list[float] | None = None,
) -> dict:
    """A figure's timed samples judged together.

    values: every timed sample (higher is better); drop_pct: how far below their median a sample may fall before
    it counts as low; allowed: low samples a healthy figure may have; causes: what the sampler saw on this GPU
    while the step ran, each {"what", "t_s": [from, to] or None} (seconds on the same clock as ends_s; None: at an
    unknown moment of the step); ends_s: when each sample ended.

    Returns {"verdict", "low": [{"i", "value", "drop_pct"}], "deepest_pct", "median", "causes": the causes seen
    at a low sample's moment}. verdict: steady (none low), isolated (at most `allowed` low, none deeper than
    ISOLATED_DEPTH_FACTOR x drop_pct, and no cause seen with them: the figure stands), disturbed (a cause seen
    when samples fell: the figure is not the node's), fell (more fell, or deeper, with no cause seen: the figure
    is not yet the node's, measure again).
    """
    median = statistics.median(values) if values else None
    out = {"verdict": STEADY, "low": [], "deepest_pct": 0.0, "median": median, "allowed": allowed, "causes": []}
    if not values or not median or drop_pct is None:
        return out
    limit = Limit("sample_drop_pct_max", drop_pct)
    drops = [(i, v, below_pct(v, median)) for i, v in enumerate(values)]
    out["deepest_pct"] = round(max(d for _, _, d in drops), 2)
    low = [(i, v, d) for i, v, d in drops if judge(d, limit).status != PASS]
    out["low"] = [{"i": i, "value": v, "drop_pct": round(d, 2)} for i, v, d in low]
    if not low:
        return out
    seen = [c for c in causes or [] if _at_moment(c, [i for i, _, _ in low], ends_s)]
    out["causes"] = seen
    if seen:
        out["verdict"] = DISTURBED
    elif len(low) <= allowed and out["deepest_pct"] <= ISOLATED_DEPTH_FACTOR * drop_pct:
        out["verdict"] = ISOLATED
    else:
        out["verdict"] = FELL
    return out


def _at_moment(cause: dict, low: list[int], ends_s: list[float] | None) -> bool:
    """A cause counts when it was seen while a low sample ran (from the previous sample's end to its own), or at
    an unknown moment of the step (older documents, or a sampler without times)."""
    span = cause.get("t_s")
    if not span or not ends_s:
        return True
    lo, hi = span
    for i in low:
        if i >= len(ends_s):
            return True
        start = ends_s[i - 1] if i > 0 else ends_s[i] - (ends_s[1] - ends_s[0] if len(ends_s) > 1 else 1.0)
        if lo <= ends_s[i] and hi >= start:
            return True
    return False
