"""A node's failing results grouped by cause, so that one cause is said once.

Results that fail or err in the same words fail for the same thing: on a node without a driver every NVML check
says "no NVIDIA driver: libnvidia-ml.so not found", on a node whose Python lacks torch every benchmark says so. A
cause is such a reason with the checks that gave it; a result without a reason is a cause of its own. The report
(report.json's `causes`, report.md, report.html), drain.txt, the Slurm reasons, the playbook's failure message and
the runner's ending all read `grouped()`, so they name the same causes in the same order: hardware first (what
needs a repair), then the cause that explains the most checks.
"""

from __future__ import annotations

from gpufleet.base import failure_class, schema

FAILING = (schema.FAIL, schema.ERROR)


def _check_id(res: dict) -> str:
    return f"{res['group']}.{res['check']}" if res.get("group") else str(res.get("check"))


def _words(text) -> str:
    return " ".join(str(text or "").split())


def in_shared(res: dict, groups: list[dict]) -> bool:
    """Whether a result is one of the failing results of a cause that several checks share."""
    return res.get("status") in FAILING and any(
        len(g["checks"]) > 1 and g["cause"] == _words(res.get("reason")) for g in groups
    )


def grouped(results: list[dict]) -> list[dict]:
    """One entry per cause of the failing results: {"cause": the shared reason, "status": the worst status,
    "class": the class most of its results have, "remedy": the first remedy given, "checks": [group.check, each
    once]}; hardware first, then by the number of checks, then in the order the results came."""
    groups: dict[str, dict] = {}
    for i, res in enumerate(results):
        if res.get("status") not in FAILING:
            continue
        reason = _words(res.get("reason"))
        key = reason or f"\0{i}"  # no reason: nothing to share
        group = groups.setdefault(
            key,
            {
                "cause": reason or "no reason given",
                "status": res["status"],
                "classes": [],
                "remedy": None,
                "checks": [],
                "first": i,
            },
        )
        group["status"] = schema.worst((group["status"], res["status"]))
        group["classes"].append(failure_class.of(res))
        group["remedy"] = group["remedy"] or _words(res.get("remedy")) or None
        if _check_id(res) not in group["checks"]:
            group["checks"].append(_check_id(res))
    out = []
    for group in groups.values():
        classes = [c for c in group.pop("classes") if c]
        group["class"] = max(
            dict.fromkeys(classes), key=lambda c: (classes.count(c), -failure_class.CLASSES.index(c)), default=None
        )
        out.append(group)
    out.sort(key=lambda g: (g["class"] != failure_class.HARDWARE, -len(g["checks"]), g["first"]))
    for group in out:
        del group["first"]
    return out


def results_of(group: dict, results: list[dict]) -> list[dict]:
    """The failing results a cause of grouped(results) stands for, in their order."""
    return [
        r
        for r in results
        if r.get("status") in FAILING
        and _check_id(r) in group["checks"]
        and (_words(r.get("reason")) or "no reason given") == group["cause"]
    ]


def label(group: dict) -> str:
    """How a cause is named in a line: the check for a cause of one check, else its reason and how many checks."""
    if len(group["checks"]) == 1:
        return group["checks"][0]
    return f"{group['cause']} ({len(group['checks'])} checks)"


def line(group: dict, max_checks: int = 5) -> str:
    """`check: reason` for a cause of one check, else `reason (N checks: a, b, ... and M more)`."""
    checks = group["checks"]
    if len(checks) == 1:
        return f"{checks[0]}: {group['cause']}"
    named = ", ".join(checks[:max_checks]) + (
        f" and {len(checks) - max_checks} more" if len(checks) > max_checks else ""
    )
    return f"{group['cause']} ({len(checks)} checks: {named})"
