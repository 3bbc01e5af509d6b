"""One comparison as a row, its sentence, and the result that carries the comparisons of one check.

A row past its limit is judged by the one rule of confirm.py: it stands (`confirmed`) when the node measured the
figure again and it stayed past; otherwise it is `inconclusive`, named in the reason apart, and changes no verdict:
a check whose rows are only inconclusive is `info`, its trust `inconclusive`."""

from __future__ import annotations

from typing import Any

from gpufleet.base import schema
from gpufleet.comparisons import GROUP, flagged, gpu_text, figure_text
from gpufleet.base.calibration import UNCALIBRATED
from gpufleet.comparisons.confirm import INCONCLUSIVE, NOT_COMPARED
from gpufleet.comparisons.trusted import judged as trusted_row
from gpufleet.comparisons.robust import judge
from gpufleet.comparisons.thresholds import Thresholds
from gpufleet.base.judge import below_pct, judge as one_judge
from gpufleet.base.registry import ENVIRONMENT
from gpufleet.base.schema import FAIL, INFO, PASS, SKIP, WARN


CPU_PREFIX = "CPU run: logic check only, not a performance figure"
MAX_LISTED = 6  # findings named in a reason; all of them are in detail


def comparison_row(
    m: dict,
    reference: float,
    ref_text: str,
    thresholds: Thresholds,
    warn: str,
    fail: str,
    held_against: dict | None = None,
    **extra,
) -> dict:
    """Figure m against its reference, with what its trust (and that of held_against, the node's own figure it is
    held against, where it is one) allows: comparisons.trusted."""
    limit = thresholds.limit(warn, fail, m["key"])
    status, deviation = judge(m["value"], reference, limit)
    interval = m.get("interval")  # the figure's 95% interval, where its samples give one: near a level of the limit
    near = (
        bool(interval)
        and one_judge(
            -deviation, limit, interval=(below_pct(interval[0], reference), below_pct(interval[1], reference))
        ).near
    )
    row = {
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
        "context": m.get("context"),
        **({"near": True} if near else {}),
        **extra,
    }
    return trusted_row(row, m, thresholds, warn, fail, held_against)


def comparison_sentence(c: dict, thresholds: Thresholds, warn: str, fail: str, who: str = "") -> str:
    below = -c["deviation_pct"]
    status = c.get("would_be") or c["status"]  # an inconclusive row names the limit it is past
    which = fail if status == FAIL else warn
    limit = thresholds.value(which, c["metric"])
    words = "fail threshold" if status == FAIL else "threshold"
    note = f", {UNCALIBRATED}" if thresholds.uncalibrated(warn, c["metric"]) else ""
    head = f"{who}{c['label']} {figure_text(c['value'])} {c['unit']}"
    own = c.get("own_past") or {}
    if own.get("changed") and status == WARN:  # inside the healthy spread, but not where this GPU used to be
        usual = own["usual_below_pct"]
        return (
            f"{head} is {pct_text(below, limit)}% below {c['reference_is']} {figure_text(c['reference'])}; over its last "
            f"{own['runs']} runs it was {abs(usual):.1f}% {'below' if usual >= 0 else 'above'} it: {own['change_pct']:.1f}% "
            f"lower, a change against its own past (threshold {figure_text(own['limit_pct'])}%)"
        )
    z = f", robust z {c['robust_z']}" if c.get("robust_z") is not None else ""
    why = "".join(f": {c[k]}" for k in ("environment", "repeated") if c.get(k))
    return (
        f"{head} is {pct_text(below, limit)}% below {c['reference_is']} {figure_text(c['reference'])}{z} "
        f"({words} {figure_text(limit)}%{note}){why}"
    )


def pct_text(value: float, limit: Any = None) -> str:
    """One decimal, two where one would read as the threshold itself (5.02% over a 5% threshold is not '5.0%')."""
    text = f"{value:.1f}"
    return f"{value:.2f}" if isinstance(limit, (int, float)) and float(text) == float(limit) else text


def limit_text(thresholds: Thresholds, key: str, metrics: list[str]) -> str:
    """The limit a passing reason names: "5%", or the range of the per-metric limits; "generic" where the model is
    not calibrated for any of them, how many are calibrated where only some are."""
    values = sorted({thresholds.value(key, m) for m in metrics if thresholds.value(key, m) is not None})
    if not values:
        return "?"
    text = (
        f"{figure_text(values[0])}%" if len(values) == 1 else f"{figure_text(values[0])}% to {figure_text(values[-1])}%"
    )
    notes = ["per metric"] if len(values) > 1 else []
    named, generic = set(metrics), {m for m in metrics if thresholds.uncalibrated(key, m)}
    if generic and generic == named:
        notes.append(UNCALIBRATED)
    elif generic:  # some figures have a calibrated limit and some the generic one: said as it is
        notes.append(
            f"calibrated for {len(named) - len(generic)} of {len(named)} metrics, the generic limit for the other {len(generic)}"
        )
    return text + (f" ({'; '.join(notes)})" if notes else "")


def listed_text(parts: list[str]) -> str:
    more = len(parts) - MAX_LISTED
    return "; ".join(parts[:MAX_LISTED]) + (f"; and {more} more (detail.comparisons)" if more > 0 else "")


INCONCLUSIVE_REMEDY = (
    "nothing to act on yet: the figure was past its limit in one measurement only; run the node's benchmarks again "
    "(validate.yml --limit NODE): a figure past its limit in two measurements in a row is the node's"
)


ENVIRONMENT_REMEDY = (
    "nothing to service yet: on a virtual machine the host's CPUs and memory are shared with other guests of the "
    "hypervisor; validate again later (validate.yml --limit NODE): a drop that repeats over runs is the node's, and "
    "one that keeps coming back is a question for the provider (dedicated cores)"
)


def fleet_result(check: str, status: str, reason: str, *, cpu: bool = False, **fields) -> dict:
    """One fleet result; on a CPU run a would-be pass, warn or fail becomes skip, saying so. A result whose rows
    past a limit are all inconclusive says what to do about it; one whose rows past a limit are all the
    environment's (comparisons.trusted: a virtual machine's host figures) is class environment, and says so."""
    detail = fields.pop("detail", {}) or {}
    if fields.get("trust") == schema.INCONCLUSIVE:
        fields["remedy"] = INCONCLUSIVE_REMEDY
    beyond = [c for c in detail.get("comparisons") or [] if c.get("status") in (WARN, FAIL)]
    if status in (WARN, FAIL) and beyond and all(c.get("class") == ENVIRONMENT for c in beyond):
        fields.update(failure_class=ENVIRONMENT, remedy=ENVIRONMENT_REMEDY)
    if cpu and status in (PASS, WARN, FAIL, INFO):
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
    "would_be",
    "confirmed",
    "attempts",
    "unconfirmed",
    "not_compared",
    "information",
    "class",
    "environment",
    "repeated",
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
    """The worst status of the rows that stand (an inconclusive row changes no verdict, nor one not compared)."""
    return schema.worst((c["status"] for c in comparisons if c["status"] not in (INCONCLUSIVE, NOT_COMPARED)))


def judge_comparisons(
    comparisons: list[dict], thresholds: Thresholds, warn: str, fail: str, who
) -> tuple[str, str | None, float, str | None]:
    """(status, reason, largest gap, trust) of a check's rows, settled by confirm.settle where it was applied.

    status: the worst of the rows that stand; `info` where the only rows past a limit are inconclusive, or
    information (comparisons.trusted: a host figure not calibrated yet); `skip` where no row's figure was compared
    (not the node's: trusted). reason: the sentences of the rows that did not pass, the largest gap first, each led
    by who(row), the information after "information, not a warning:", the inconclusive ones after "inconclusive:"
    (None when every row passed). The largest gap below the reference in % of the rows compared (0 when none is
    below). trust: `confirmed` where a standing row past its limit was measured again, `inconclusive` where only
    inconclusive rows are past one, else None."""
    compared = [c for c in comparisons if c["status"] != NOT_COMPARED]
    if not compared:
        return SKIP, "no figure of this node could be compared", 0.0, None
    standing = sorted((c for c in compared if c["status"] in (WARN, FAIL)), key=lambda c: c["deviation_pct"])
    told = sorted((c for c in compared if c["status"] == INFO), key=lambda c: c["deviation_pct"])
    unsure = sorted((c for c in compared if c["status"] == INCONCLUSIVE), key=lambda c: c["deviation_pct"])
    parts = [comparison_sentence(c, thresholds, warn, fail, who=who(c)) for c in standing]
    if told:
        parts.append(
            "information, not a warning: "
            + "; ".join(comparison_sentence(c, thresholds, warn, fail, who=who(c)) for c in told[:MAX_LISTED])
            + f" ({told[0]['information']})"
        )
    if unsure:
        parts.append(
            "inconclusive: "
            + "; ".join(
                f"{comparison_sentence(c, thresholds, warn, fail, who=who(c))}, {c['unconfirmed']}"
                for c in unsure[:MAX_LISTED]
            )
        )
    reason = listed_text(parts) if parts else None
    below_pct = max(max((-c["deviation_pct"] for c in compared), default=0.0), 0.0)
    status = worst_status(comparisons)
    trust = None
    if standing and any(c.get("confirmed") for c in standing):
        trust = schema.CONFIRMED
    elif unsure and status in (PASS, INFO):
        status, trust = INFO, schema.INCONCLUSIVE
    return status, reason, round(below_pct, 2), trust


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
    """The largest gap below a reference, and the figures the node measured again before they passed (of the
    figures compared)."""
    comparisons = [c for c in comparisons if c["status"] != NOT_COMPARED] or comparisons
    worst = min(comparisons, key=lambda c: c["deviation_pct"])
    again = [c for c in comparisons if c["status"] == PASS and len(c.get("attempts") or []) > 1]
    said = (
        "; measured again on the node before passing: "
        + listed_text(
            [
                f"{gpu_text(c) + ' ' if c.get('index') is not None or c.get('uuid') else ''}{c['label']} "
                + ", then ".join(f"{a['below_pct']:g}%" for a in c["attempts"] if "below_pct" in a)
                + f" below {c['reference_is']}"
                for c in again
            ]
        )
        if again
        else ""
    )
    if worst["deviation_pct"] >= 0:
        return "none below its reference" + said
    who = f"{gpu_text(worst)} " if worst.get("index") is not None or worst.get("uuid") else ""
    return f"largest gap: {who}{worst['label']} {-worst['deviation_pct']:.1f}% below {worst['reference_is']}{said}"
