"""Check groups. Each group module exposes CHECKS: a list of
(check_name, function(readings, profile) -> result dict).

`readings` is what collect.read_all() returns (or a recording of it):
{"nvml": {...}, "host": {...}}. Checks are pure functions of readings and
profile, so recorded readings replay exactly in tests.
"""

from __future__ import annotations

from gpufleet.checks import gpu_health, gpu_inventory, host_hygiene

GROUPS = {
    "gpu_inventory": gpu_inventory.CHECKS,
    "gpu_health": gpu_health.CHECKS,
    "host_hygiene": host_hygiene.CHECKS,
}
