"""What to do about a finding: the remediation ladder's policy per profile, and one recommended action per finding.

steps        retest, reset_gpu, reboot, rma: the ladder's rungs (service/ladder.py takes them one a run)
policy       the profile's `remediation` (generic.yml; a model profile's entries over it): by the failure class of
             the cause, or by its check where the cause is one check with a ladder of its own
action       one word per finding, as NVSentinel's health events carry a RecommendedAction (NVIDIA/NVSentinel
             data-models/protobufs/health_event.proto: NONE, COMPONENT_RESET, RESTART_BM, CONTACT_SUPPORT, ...) and
             gpud's a list of RepairActionType (leptonai/gpud api/v1/types.go: IGNORE_NO_ACTION_REQUIRED,
             REBOOT_SYSTEM, HARDWARE_INSPECTION, CHECK_USER_APP_AND_GPU): none, re-test, reset, reboot or RMA.

The action of one run's finding (recommended()): nothing for what passed, warned or only informs; a re-test for a
figure not confirmed (measured once, beside another process, never settled) and for a cause beside the board
(environment, configuration, software: once the process is gone or the setting fixed); for a confirmed hardware
finding, the first rung of its ladder after the re-test its confirmation already was (a reset where a GPU is named,
else the next rung). The ladder itself (service/ladder.py) climbs further run by run.
"""

from __future__ import annotations

import functools

from gpufleet.base import failure_class, profiles, schema
from gpufleet.base.errors import InputError

STEPS = ("retest", "reset_gpu", "reboot", "rma")
NONE, RETEST, RESET, REBOOT, RMA = "none", "re-test", "reset", "reboot", "RMA"
ACTIONS = (NONE, RETEST, RESET, REBOOT, RMA)
STEP_ACTION = {"retest": RETEST, "reset_gpu": RESET, "reboot": REBOOT, "rma": RMA}
# The nearest action of each of the two, for an operator who runs them beside gpufleet (the names their docs give).
THEIRS = {
    NONE: "NVSentinel NONE, gpud IGNORE_NO_ACTION_REQUIRED",
    RETEST: "NVSentinel RUN_DCGMEUD, gpud CHECK_USER_APP_AND_GPU",
    RESET: "NVSentinel COMPONENT_RESET",
    REBOOT: "NVSentinel RESTART_BM, gpud REBOOT_SYSTEM",
    RMA: "NVSentinel CONTACT_SUPPORT, gpud HARDWARE_INSPECTION",
}
FAILING = (schema.FAIL, schema.ERROR)


def policy(profile_name: str | None, profile_dir=None) -> dict:
    """{"classes": {class: [steps]}, "checks": {group.check: [steps]}}: generic.yml's `remediation`, the named
    profile's entries over it."""
    known = profiles.load_all(profile_dir)
    out: dict = {"classes": {}, "checks": {}}
    for name in dict.fromkeys([profiles.GENERIC, profile_name or profiles.GENERIC]):
        doc = known.get(name)
        section = (doc or {}).get("remediation") or {}
        where = f"profile file {(doc or {}).get('path', name)}: remediation"
        if not isinstance(section, dict):
            raise InputError(f"{where} must be a mapping with classes and checks")
        for part in ("classes", "checks"):
            entries = section.get(part) or {}
            if not isinstance(entries, dict):
                raise InputError(f"{where}.{part} must be a mapping of name -> list of steps")
            for key, steps in entries.items():
                if part == "classes" and key not in failure_class.CLASSES:
                    raise InputError(
                        f"{where}.classes.{key}: not a failure class; expected one of {', '.join(failure_class.CLASSES)}"
                    )
                if not isinstance(steps, list) or any(s not in STEPS for s in steps):
                    raise InputError(
                        f"{where}.{part}.{key} = {steps!r}; expected a list of steps from {', '.join(STEPS)}"
                    )
                out[part][key] = list(steps)
    return out


def steps_for(pol: dict, fault: dict) -> list[str]:
    """The check's own ladder where the cause is one check with one, else its class's."""
    return pol["checks"][fault["check"]] if fault["check"] in pol["checks"] else pol["classes"].get(fault["class"], [])


@functools.lru_cache(maxsize=32)
def _policy_of(profile_name: str | None) -> dict | None:
    try:
        return policy(profile_name)
    except InputError:  # a site profile that does not load: the actions fall back to the class alone
        return None


def _check_id(res: dict) -> str:
    return f"{res['group']}.{res['check']}" if res.get("group") else str(res.get("check"))


def _names_gpu(res: dict) -> bool:
    detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
    rows = [c for c in detail.get("comparisons") or [] if isinstance(c, dict) and c.get("status") not in (None, "pass")]
    return bool(detail.get("flagged_gpus")) or any(c.get("index") is not None or c.get("uuid") for c in rows)


def recommended(res: dict, profile_name: str | None = None) -> dict:
    """{"action": one of ACTIONS, "why": in words} for one result (module docstring)."""
    status, trust = res.get("status"), res.get("trust")
    if status == schema.INFO and trust == schema.INCONCLUSIVE:
        return {"action": RETEST, "why": "past its limit in one measurement only: measure again"}
    if status not in FAILING:
        return {"action": NONE, "why": "accepted" if status == schema.WARN else "nothing to act on"}
    if not schema.confirmed(res):
        return {"action": RETEST, "why": f"a figure not confirmed (trust {trust}): measure again on an idle node"}
    cls = failure_class.of(res)
    if cls != failure_class.HARDWARE:
        why = {
            failure_class.ENVIRONMENT: "once what stood beside the node is gone",
            failure_class.CONFIGURATION: "once the setting is fixed",
        }.get(cls, "once the remedy is applied")
        return {"action": RETEST, "why": f"{cls or 'not the board'}: run again {why}"}
    pol = _policy_of(profile_name)
    ladder = steps_for(pol, {"class": cls, "check": _check_id(res)}) if pol else list(STEPS)
    rungs = [s for s in ladder if s != "retest" and (s != "reset_gpu" or _names_gpu(res))]
    if not rungs:
        return {"action": RMA, "why": "hardware that stands, and its ladder has no step past the re-test"}
    return {
        "action": STEP_ACTION[rungs[0]],
        "why": f"hardware that stands: its ladder's first step after the re-test ({', '.join(ladder)})",
    }
