"""How far a measured figure can be trusted, by comparisons.confirm's rule: what a step's measurement asks of the
next one (a figure past a limit for the first time, or near one), the record of its comparisons' states, and each
result's `trust` and status once the step is measured (measure.watched measures; this module decides)."""

from __future__ import annotations

from gpufleet.base import registry, schema
from gpufleet.comparisons.confirm import RECORD, beyond
from gpufleet.base.schema import ERROR, Result

# Results whose figure may be measured again to confirm it (detail.measure_again, checks.figures); a soak measures
# only its windows past a limit again (benchmarks/soak/remeasure.py), as it does its disturbed ones.
CONFIRMED_CHECKS = tuple(c.name for b in registry.BENCHMARKS for c in b.checks if c.confirmed)


def is_figure(r: dict) -> bool:
    """A confirmed check's result with a figure held against a limit (a warning that no limit is set is no figure
    past one): what a measurement again can confirm or clear."""
    limited = (r.get("threshold") or {}).get("value") is not None or (r.get("detail") or {}).get("measure_again")
    return (
        r["check"] in CONFIRMED_CHECKS
        and r["status"] not in (schema.SKIP, ERROR)
        and r.get("value") is not None
        and bool(limited)
    )


def state_of(r: dict) -> dict:
    st = {"status": r["status"]}
    if (r.get("detail") or {}).get("measure_again"):
        st["near"] = True  # its samples fell, or its interval reaches across its limit
    return st


def asks(res: list[dict], history: list[dict]) -> tuple[list[tuple[str, str]], bool]:
    """(what asks to be measured again and why, whether any figure is past a limit for the first time): by
    comparisons.confirm's rule, a figure past a limit is measured again until it is past it twice in a row or clear
    of it, one near a limit while the budget lasts. history: one entry a measurement not disturbed."""
    now, before = history[-1], history[-2] if len(history) > 1 else {"results": {}, "held": {}}
    asks, first = [], False
    by_check = {r["check"]: r for r in res}
    for kind in ("results", "held"):
        for what, st in now[kind].items():
            if beyond(st) and beyond(before[kind].get(what)):
                continue  # past its limit twice in a row: confirmed
            new_past = beyond(st)
            if not (new_past or st.get("near")):
                continue
            first = first or new_past
            if kind == "results":
                r = by_check[what]
                why = (r.get("detail") or {}).get("measure_again") or f"past its limit: {r.get('reason')}"
            else:
                why = f"{'past' if new_past else 'near'} its limit: {st['below_pct']:g}% below its reference"
            asks.append((what, why))
    return asks, first


def record_of(history: list[dict]) -> dict:
    """{key: [its state in each measurement]} of the comparisons that were past or near a limit in any of them:
    what the controller judges them by (comparisons.confirm.settle)."""
    keys = [k for h in history for k, st in h["held"].items() if beyond(st) or st.get("near")]
    return {k: [h["held"].get(k, {"status": "not measured"}) for h in history] for k in dict.fromkeys(keys)}


def trusted(
    res: Result,
    first: dict | None,
    attempts: list,
    confirm_s: float,
    history: list[dict],
    record: dict,
    confirming: bool,
) -> Result:
    """How far the figure can be trusted, said in `trust` and in the reason (comparisons.confirm's rule); every
    measurement kept, and the record of the step's comparisons (detail.held)."""
    detail = {**res["detail"], "attempts": attempts, **({RECORD: record} if record else {})}
    if res["status"] in (schema.SKIP, ERROR) or res.get("value") is None:
        return res.replace(detail=detail)  # trust describes a figure: a result without one has none to describe
    states = [h["results"][res["check"]] for h in history if res["check"] in h["results"]]
    if not states:  # a check measured again for no figure of its own
        return res.replace(detail=detail, trust=schema.CONFIRMED if first else schema.CLEAN)
    n = len(states)
    stopped = attempts[-1].get("confirm_stopped") or "no more measurement"
    if n == 1:
        if beyond(states[0]) and confirming:
            return unconfirmed(res, detail, stopped)
        if states[0].get("near"):
            return res.replace(
                detail=detail,
                trust=schema.INCONCLUSIVE,
                reason=f"{res['reason']}; still {res['detail'].get('measure_again')} ({stopped})",
            )
        return res.replace(detail=detail, trust=schema.CLEAN)
    detail["confirmation_s"] = confirm_s
    alone = ", ".join(dict.fromkeys(a["measured"] for a in attempts if a.get("measured")))
    more = f"{confirm_s:g} s more" + (f", {alone} measured again alone" if alone else "")
    was = (
        f"{first.get('value')}, then {res.get('value')} {res.get('unit') or ''}".rstrip() if first else res.get("value")
    )
    asked = (first or {}).get("detail", {}).get("measure_again") or "the first measurement was past its limit"
    if beyond(states[-1]) and beyond(states[-2]):
        return res.replace(
            detail=detail,
            trust=schema.CONFIRMED,
            reason=f"confirmed: {res['reason']}; measured {n} times (first {was}; {more}, because {asked})",
        )
    if beyond(states[-1]):
        return unconfirmed(res, detail, f"measured {n} times (first {was}; {more}; {stopped})")
    if states[-1].get("near"):
        return res.replace(
            detail=detail,
            trust=schema.INCONCLUSIVE,
            reason=f"{res['reason']}; measured {n} times (first {was}; {more}), still "
            f"{res['detail'].get('measure_again')} ({stopped})",
        )
    first_said = first["reason"] if first else asked
    return res.replace(
        detail=detail,
        trust=schema.CONFIRMED,
        reason=f"{res['reason']}; passed on confirmation (first {was}; {more}; the first measurement said: "
        f"{first_said})",
    )


def unconfirmed(res: Result, detail: dict, how: str) -> Result:
    """A figure past its limit in its last measurement only: inconclusive, which changes no verdict."""
    return res.replace(
        detail={**detail, "would_be": res["status"]},
        status=schema.INFO,
        trust=schema.INCONCLUSIVE,
        reason=f"inconclusive: {res['reason']}; past its limit in the last measurement only ({how})",
        remedy="run the node's benchmarks again on an idle node (validate.yml --limit NODE): a figure past its "
        "limit in two measurements in a row is the node's",
    )
