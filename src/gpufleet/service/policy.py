"""The remediation ladder's policy: which steps, in which order, for a node's root cause.

steps      retest, reset_gpu, reboot, rma (ladder.py takes them); reaccept, for a replaced board
policy     the profile's `remediation` (generic.yml; a model profile's entries over it): by the failure class
           of the cause, or by its check where the cause is one check with a ladder of its own (fleet/remediation.py,
           which the report's recommended action per finding reads too)
the cause  the node's first cause (causes.grouped: hardware first, then the cause most checks share), the one
           its report and drain reason name first; a cause none of whose results is confirmed
           (schema.confirmed: a figure measured once) gets a re-test, never a reset, reboot or RMA (ladder.py)
"""

from __future__ import annotations

from gpufleet.base import causes, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet.remediation import STEPS, policy, steps_for

__all__ = ["ACTABLE", "REACCEPT", "STEPS", "fault_of", "parse_act", "policy", "steps_for"]

REACCEPT = "reaccept"
ACTABLE = (*STEPS, REACCEPT)


def fault_of(node: dict) -> dict | None:
    """The node's root cause: the first of its causes (causes.grouped: hardware first, then the cause most checks
    share), the one its report and drain reason name first; with its class, its checks, the GPUs its results name,
    and whether it stands (schema.confirmed: a figure measured once does not)."""
    results = [r for r in node.get("results") or [] if isinstance(r, dict)]
    groups = node.get("causes") if isinstance(node.get("causes"), list) else causes.grouped(results)
    if not groups:
        return None
    lead = groups[0]
    members = causes.results_of(lead, results)
    gpus: dict = {}
    for r in members:
        detail = r.get("detail") if isinstance(r.get("detail"), dict) else {}
        for g in detail.get("flagged_gpus") or []:
            if isinstance(g, dict):
                gpus.setdefault(
                    g.get("index"), {"index": g.get("index"), "uuid": g.get("uuid"), "serial": g.get("serial")}
                )
    return {
        "class": lead["class"],
        "check": causes.label(lead),
        "checks": lead["checks"],
        "reason": lead["cause"],
        "gpus": list(gpus.values()),
        "confirmed": any(schema.confirmed(r) for r in members) or not members,
    }


def parse_act(values: list[str] | None) -> set[str]:
    """--act STEP (repeatable) or all: the steps the operator opted in to."""
    chosen = set()
    for value in values or []:
        for step in (v.strip() for v in str(value).split(",") if v.strip()):
            if step not in (*ACTABLE, "all"):
                raise InputError(
                    f"gpufleet_ladder_act (--act) {step!r}; expected steps of {', '.join(ACTABLE)}, or all"
                )
            chosen |= set(ACTABLE) if step == "all" else {step}
    return chosen
