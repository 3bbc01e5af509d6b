"""Robust statistics: the median and MAD of a set of figures, a figure's robust z-score, and a figure judged
against its reference by how far below it is.
"""

from __future__ import annotations

import statistics

from gpufleet.schema import FAIL, PASS, WARN


def robust(values: list[float]) -> tuple[float, float]:
    """(median, MAD)."""
    med = statistics.median(values)
    return med, statistics.median(abs(v - med) for v in values)


def robust_z(x: float, med: float, mad: float) -> float | None:
    return round(0.6745 * (x - med) / mad, 2) if mad > 0 else None


def judge(value: float, reference: float, warn_pct: float | None, fail_pct: float | None) -> tuple[str, float]:
    """(status, deviation %): negative deviation is below the reference; more than warn_pct below warns."""
    deviation = (value - reference) / reference * 100
    below = round(-deviation, 9)  # 5% below is 5%, not 5.000000000000004%
    if fail_pct is not None and below > fail_pct:
        return FAIL, deviation
    if warn_pct is not None and below > warn_pct:
        return WARN, deviation
    return PASS, deviation
