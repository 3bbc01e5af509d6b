"""Check groups: each check a pure function(readings, profile) -> result of its group's file (or package),
declared in registry.CHECK_GROUPS (name, class, thresholds) and registered there by its module (`check` of
`<group>.<check>`); GROUPS maps each group to its [(name, function)] in the declared order.

`readings` is what collect.read_all() returns (or a recording of it):
{"nvml": {...}, "host": {...}}. Checks are pure functions of readings and
profile, so recorded readings replay exactly in tests.
"""

from __future__ import annotations

from gpufleet.base import registry
from gpufleet.checks import gpu_health, gpu_inventory, host_hygiene  # noqa: F401 (the index: each registers its checks)

# Each group's checks, the function each registered (imported here, once: a check group runs them all).
GROUPS = {
    g.name: [(c.name, registry.registered(f"{g.name}.{c.name}", "check")) for c in g.checks]
    for g in registry.CHECK_GROUPS
}
