"""Check groups: each check a pure function(readings, profile) -> result of its group's file (or package),
declared in registry.CHECK_GROUPS (name, class, thresholds, the "module:function" that makes it); GROUPS maps each
group to its [(name, function)] in the declared order.

`readings` is what collect.read_all() returns (or a recording of it):
{"nvml": {...}, "host": {...}}. Checks are pure functions of readings and
profile, so recorded readings replay exactly in tests.
"""

from __future__ import annotations

from gpufleet.base import registry

# Each group's checks, the function each declaration names (imported here, once: a check group runs them all).
GROUPS = {g.name: [(c.name, registry.check_function(g, c)) for c in g.checks] for g in registry.CHECK_GROUPS}
