"""Drift from bring-up: what bringup.yml applied (its record) against the node now."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.base.registry import registers
from gpufleet.checks.host_hygiene.readings import section
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, result

RUN_BRINGUP = "run bringup.yml on this node (ansible-playbook bringup.yml -i inventory/<site> --limit <node>)"
_DRIFT_NAMED_MAX = 6  # drifted settings named in a reason; all are in detail


def _drift(item: dict) -> tuple[str, str | None]:
    """('held' | 'drifted' | 'unreadable', what to say) for one expectation the collector read."""
    what, current, why = item.get("what"), item.get("found"), item.get("found_reason")
    where = item.get("glob") or item.get("path")
    if why and ("not present" in why or "no file matches" in why):
        return "drifted", f"{what} ({where}) is gone"
    if why:
        return "unreadable", f"{what}: {why}"
    if "sha256" in item:
        if current == item["sha256"]:
            return "held", None
        return "drifted", f"{what} ({where}) changed since bringup"
    if "exists" in item:
        if bool(current) == bool(item["exists"]):
            return "held", None
        return "drifted", f"{what} ({where}) is {'missing' if item['exists'] else 'present again'}"
    expected = str(item.get("value"))
    if "glob" in item:
        off = {v: n for v, n in (current or {}).items() if v != expected}
        if not off:
            return "held", None
        return (
            "drifted",
            f"{what} is {off} on {sum(off.values())} of {sum(current.values())} ({where}), bringup set {expected}",
        )
    if current == expected:
        return "held", None
    return "drifted", f"{what} is {current} ({where}), bringup set {expected}"


@registers("host_hygiene.bringup_drift", "check")
def check_bringup_drift(readings: dict, profile: dict) -> dict:
    """What bringup.yml recorded in /etc/gpufleet/bringup.json still holds (nccl.conf, sysctls, governor, ACS unit,
    driver): a setting that drifted fails; no record fails where bringup_required is set, else skips."""
    name = "bringup_drift"
    rec, err = section(readings, name, "bringup")
    if err:
        return err
    threshold = profiles.threshold(profile, "bringup_required")
    required = threshold["value"]
    roles = rec.get("roles") or {}
    detail = {"path": rec.get("path"), "roles": roles}
    if not rec.get("present") or (rec.get("readable") and not roles):
        said = (
            f"no bringup record at {rec.get('path')}" if not rec.get("present") else f"{rec.get('path')} names no role"
        )
        if not required:
            return result(
                name,
                SKIP,
                f"bringup.yml has not run on this node ({said}); bringup_required is false",
                threshold=threshold,
                detail=detail,
            )
        return result(
            name,
            FAIL,
            f"bringup.yml has not run on this node since it was imaged ({said})",
            threshold=threshold,
            remedy=RUN_BRINGUP,
            detail=detail,
        )
    if not rec.get("readable"):
        return result(
            name,
            ERROR,
            f"cannot read the bringup record: {rec.get('reason')}",
            threshold=threshold,
            remedy=f"run the check as root, or {RUN_BRINGUP} to write the record again",
            detail=detail,
        )
    drifted, unreadable, held, checked = [], [], 0, {}
    for role, entry in roles.items():
        items = []
        for item in entry.get("expect") or []:
            state, said = _drift(item)
            items.append(item | {"state": state})
            if state == "drifted":
                drifted.append(f"{role}: {said}")
            elif state == "unreadable":
                unreadable.append(f"{role}: {said}")
            else:
                held += 1
        checked[role] = entry | {"expect": items}
    detail |= {"roles": checked, "drifted": drifted, "unreadable": unreadable}
    if drifted:
        said = "; ".join(drifted[:_DRIFT_NAMED_MAX])
        if len(drifted) > _DRIFT_NAMED_MAX:
            said += f"; and {len(drifted) - _DRIFT_NAMED_MAX} more (detail.drifted)"
        return result(
            name,
            FAIL,
            f"{len(drifted)} setting(s) applied by bringup.yml no longer hold: {said}; run bringup.yml",
            value=len(drifted),
            unit="settings",
            threshold=threshold,
            remedy=f"{RUN_BRINGUP}; it applies the settings again and records them (reboot when it says one is pending)",
            detail=detail,
        )
    if unreadable:
        return result(
            name,
            ERROR,
            f"{len(unreadable)} recorded setting(s) could not be read: {'; '.join(unreadable[:_DRIFT_NAMED_MAX])}",
            threshold=threshold,
            remedy="run the check as root (become: true)",
            detail=detail,
        )
    applied = sorted(e.get("applied_at") or "?" for e in roles.values())
    return result(
        name,
        PASS,
        f"all {held} setting(s) bringup.yml recorded for {', '.join(roles)} still hold (last applied {applied[-1]})",
        value=0,
        unit="settings",
        threshold=threshold,
        detail=detail,
    )
