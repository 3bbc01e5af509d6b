"""The one rule by which a figure held against a reference warns or fails: one measurement is not the node's.

A figure past any of its limits (its minimum, its siblings, its own past, the baseline run, the baseline's fleet)
is measured again on the node, before its stage ends (measure.watched); so is one whose 95% interval reaches
across a limit, while the step's confirm_budget_s lasts. The node keeps, for every figure that was ever past or
near a limit, its state in each measurement (`detail.held` of the step's results: record()). Wherever the figure is
judged, a comparison past its limit stands only when the figure was past it in its last two measurements;
otherwise it is `inconclusive` (settle()). A site that turns confirmation off (confirm_remeasure_max 0) judges on
one measurement, as it asked.

    record_key(check, row)       the key a figure's comparison is kept and looked up by
    state(row)                   what one measurement of it said: {"status", "below_pct", "near"}
    settle(check, row, record)   the row as it stands: confirmed, passed, or inconclusive
"""

from __future__ import annotations

from gpufleet.base.schema import FAIL, INFO, SKIP, WARN

INCONCLUSIVE = "inconclusive"  # a comparison's row past its limit in one measurement only
NOT_COMPARED = (
    "not_compared"  # a row whose figure the judge did not trust (comparisons/trusted.py): compared with nothing
)
BEYOND = (WARN, FAIL)
RECORD = "held"  # the detail key of a step's results that keeps the record


def record_key(check: str, row: dict) -> str:
    """check|metric|context|uuid: one figure against one reference, the same on the node and the controller."""
    metric = row.get("metric") or row.get("key")  # a sample spread's row names its metric `key`
    return "|".join((check, str(metric), str(row.get("context") or ""), str(row.get("uuid") or "")))


def state(row: dict) -> dict:
    out = {"status": row["status"], "below_pct": round(-row["deviation_pct"], 2)}
    if row.get("near"):
        out["near"] = True
    return out


def beyond(st: dict | None) -> bool:
    return bool(st) and st["status"] in BEYOND


def settle(check: str, row: dict, record: dict | None, *, confirming: bool = True, unrecorded: str = "") -> dict:
    """A comparison row as it stands, by the module's rule. `record`: {record_key: [state per measurement]} from the
    node; `unrecorded`: why a figure has no record (it was measured where nobody could measure it again: across
    nodes, or only this run's fleet shows it). A passing row keeps its measurements where there were several."""
    attempts = (record or {}).get(record_key(check, row))
    if row["status"] not in BEYOND or row.get("cpu"):  # a CPU run's figure is never judged: nothing to confirm
        return {**row, "attempts": attempts} if attempts and len(attempts) > 1 else row
    if not confirming:
        return row  # the site judges on one measurement (confirm_remeasure_max 0)
    if attempts and len(attempts) >= 2 and all(beyond(a) for a in attempts[-2:]):
        return {**row, "confirmed": True, "attempts": attempts}
    why = f"past its limit in {'the last' if attempts else 'one'} measurement only" + (
        "" if attempts else f": {unrecorded or 'not measured again on the node'}"
    )
    return {**row, "status": INCONCLUSIVE, "would_be": row["status"], "attempts": attempts, "unconfirmed": why}


def status_of(row: dict) -> str:
    """A row's status as a result's: an inconclusive row is information; one not compared, skip."""
    return {INCONCLUSIVE: INFO, NOT_COMPARED: SKIP}.get(row["status"], row["status"])


def record(results: list[dict]) -> dict:
    """{record_key: [state per measurement]} of a node's results: what its steps kept (detail.held)."""
    out: dict = {}
    for r in results:
        held = (r.get("detail") or {}).get(RECORD) if isinstance(r.get("detail"), dict) else None
        if isinstance(held, dict):
            out.update(held)
    return out
