"""Robust statistics: the median and MAD of a set of figures, a figure's robust z-score, and a figure judged
against its reference by how far below it is (judge.py).
"""

from __future__ import annotations

import statistics

from gpufleet.base.judge import Limit, below_pct, judge as one_judge


def robust(values: list[float]) -> tuple[float, float]:
    """(median, MAD)."""
    med = statistics.median(values)
    return med, statistics.median(abs(v - med) for v in values)


def robust_z(x: float, med: float, mad: float) -> float | None:
    return round(0.6745 * (x - med) / mad, 2) if mad > 0 else None


def judge(value: float, reference: float, limit: Limit) -> tuple[str, float]:
    """(status, deviation %) of a figure below its reference, through the one judge (judge.judge): negative
    deviation is below the reference; more than limit's warn level below warns, its fail level fails."""
    below = below_pct(value, reference)
    return one_judge(below, limit).status, -below
