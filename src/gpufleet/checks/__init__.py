"""Check groups: each check a pure function(readings, profile) -> result of its group's file (or package),
declared in registry.CHECK_GROUPS (name, class, thresholds, function); GROUPS maps each group to its
[(name, function)] in the declared order.

`readings` is what collect.read_all() returns (or a recording of it):
{"nvml": {...}, "host": {...}}. Checks are pure functions of readings and
profile, so recorded readings replay exactly in tests.
"""

from __future__ import annotations

from gpufleet import registry
from gpufleet.checks import gpu_health, gpu_inventory, host_hygiene

# The file of each declared group's checks.
_FILES = {"gpu_inventory": gpu_inventory, "gpu_health": gpu_health, "host_hygiene": host_hygiene}


def _function(group: str, path: str):
    """The function a declaration names: `name` in the group's file, or `file.name` in the group's package."""
    target = _FILES[group]
    for part in path.split("."):
        target = getattr(target, part)
    return target


GROUPS = {g.name: [(c.name, _function(g.name, c.function or c.name)) for c in g.checks] for g in registry.CHECK_GROUPS}
