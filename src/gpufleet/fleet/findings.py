"""One comparison as a row, its sentence, and the fleet result that carries the comparisons of one check."""

from __future__ import annotations

from typing import Any

from gpufleet import schema
from gpufleet.fleet import GROUP, flagged, gpu_text, figure_text
from gpufleet.calibration import UNCALIBRATED
from gpufleet.fleet.robust import judge
from gpufleet.fleet.thresholds import Thresholds
from gpufleet.schema import FAIL, PASS, SKIP, WARN


CPU_PREFIX = "CPU run: logic check only, not a performance figure"
MAX_LISTED = 6  # findings named in a reason; all of them are in detail


def comparison_row(
    m: dict, reference: float, ref_text: str, thresholds: Thresholds, warn: str, fail: str, **extra
) -> dict:
    status, deviation = judge(m["value"], reference, thresholds.limit(warn, fail, m["key"]))
    return {
        "metric": m["key"],
        "label": m["label"],
        "unit": m["unit"],
        "index": m.get("index"),
        "uuid": m.get("uuid"),
        "serial": m.get("serial"),
        "cuda_index": m.get("cuda_index"),
        "mapped_by": m.get("mapped_by"),
        "value": m["value"],
        "reference": reference,
        "reference_is": ref_text,
        "deviation_pct": round(deviation, 2),
        "status": status,
        "cpu": m.get("cpu", False),
        **extra,
    }


def comparison_sentence(c: dict, thresholds: Thresholds, warn: str, fail: str, who: str = "") -> str:
    below = -c["deviation_pct"]
    which = fail if c["status"] == FAIL else warn
    limit = thresholds.value(which, c["metric"])
    words = "fail threshold" if c["status"] == FAIL else "threshold"
    note = f", {UNCALIBRATED}" if thresholds.uncalibrated(warn, c["metric"]) else ""
    head = f"{who}{c['label']} {figure_text(c['value'])} {c['unit']}"
    own = c.get("own_past") or {}
    if own.get("changed") and c["status"] == WARN:  # inside the healthy spread, but not where this GPU used to be
        usual = own["usual_below_pct"]
        return (
            f"{head} is {pct_text(below, limit)}% below {c['reference_is']} {figure_text(c['reference'])}; over its last "
            f"{own['runs']} runs it was {abs(usual):.1f}% {'below' if usual >= 0 else 'above'} it: {own['change_pct']:.1f}% "
            f"lower, a change against its own past (threshold {figure_text(own['limit_pct'])}%)"
        )
    z = f", robust z {c['robust_z']}" if c.get("robust_z") is not None else ""
    return f"{head} is {pct_text(below, limit)}% below {c['reference_is']} {figure_text(c['reference'])}{z} ({words} {figure_text(limit)}%{note})"


def pct_text(value: float, limit: Any = None) -> str:
    """One decimal, two where one would read as the threshold itself (5.02% over a 5% threshold is not '5.0%')."""
    text = f"{value:.1f}"
    return f"{value:.2f}" if isinstance(limit, (int, float)) and float(text) == float(limit) else text


def limit_text(thresholds: Thresholds, key: str, metrics: list[str]) -> str:
    """The limit a passing reason names: "5%", or the range of the per-metric limits; "generic" where the model is
    not calibrated for them."""
    values = sorted({thresholds.value(key, m) for m in metrics if thresholds.value(key, m) is not None})
    text = (
        f"{figure_text(values[0])}%"
        if len(values) == 1
        else f"{figure_text(values[0])}% to {figure_text(values[-1])}% (per metric)"
        if values
        else "?"
    )
    return text + (f" ({UNCALIBRATED})" if any(thresholds.uncalibrated(key, m) for m in metrics) else "")


def listed_text(parts: list[str]) -> str:
    more = len(parts) - MAX_LISTED
    return "; ".join(parts[:MAX_LISTED]) + (f"; and {more} more (detail.comparisons)" if more > 0 else "")


def fleet_result(check: str, status: str, reason: str, *, cpu: bool = False, **fields) -> dict:
    """One fleet result; on a CPU run a would-be pass, warn or fail becomes skip, saying so."""
    detail = fields.pop("detail", {}) or {}
    if cpu and status in (PASS, WARN, FAIL):
        detail = {**detail, "would_be": status, "cpu_run": True}
        status, reason = SKIP, f"{CPU_PREFIX}: {reason}"
        fields.pop("remedy", None)
    if status == PASS:
        fields.pop("remedy", None)
    return schema.result(
        check, status, reason, group=GROUP, detail=detail, started=schema.utc_now(), seconds=0.0, **fields
    )


EVIDENCE_KEYS = (
    "metric",
    "index",
    "uuid",
    "serial",
    "value",
    "reference",
    "deviation_pct",
    "robust_z",
    "n",
    "status",
    "baseline_host",
    "own_past",
)


def evidence_rows(comparisons: list[dict]) -> list[dict]:
    """The comparisons as detail keeps them: the numbers and who, without what the metric key already says."""
    out = []
    for c in comparisons:
        e = {k: c[k] for k in EVIDENCE_KEYS if c.get(k) is not None}
        if c.get("index") is None and c.get("cuda_index") is not None:
            e["cuda_index"] = c["cuda_index"]
        if c.get("mapped_by") == "position":
            e["mapped_by"] = "position"
        out.append(e)
    return out


def worst_status(comparisons: list[dict]) -> str:
    return schema.worst((c["status"] for c in comparisons), default=PASS)


def judge_comparisons(
    comparisons: list[dict], thresholds: Thresholds, warn: str, fail: str, who
) -> tuple[str, str | None, float]:
    """The worst status; the sentences of the comparisons that did not pass, the largest gap first (None when every
    one passed), each led by who(comparison); and the largest gap below the reference in % (0 when none is below)."""
    bad = sorted((c for c in comparisons if c["status"] != PASS), key=lambda c: c["deviation_pct"])
    reason = listed_text([comparison_sentence(c, thresholds, warn, fail, who=who(c)) for c in bad]) if bad else None
    below_pct = max(max((-c["deviation_pct"] for c in comparisons), default=0.0), 0.0)
    return worst_status(comparisons), reason, round(below_pct, 2)


def flagged_from(comparisons: list[dict]) -> list[dict]:
    seen, out = set(), []
    for c in comparisons:
        if c["status"] in (WARN, FAIL) and (c.get("index") is not None or c.get("uuid")):
            key = (c.get("index"), c.get("uuid"))
            if key not in seen:
                seen.add(key)
                out.append(flagged(c))
    return out


def gap_text(comparisons: list[dict]) -> str:
    worst = min(comparisons, key=lambda c: c["deviation_pct"])
    if worst["deviation_pct"] >= 0:
        return "none below its reference"
    who = f"{gpu_text(worst)} " if worst.get("index") is not None or worst.get("uuid") else ""
    return f"largest gap: {who}{worst['label']} {-worst['deviation_pct']:.1f}% below {worst['reference_is']}"
