"""GPU health: one file per concern, each check a pure function of the NVML readings (collect.nvml), the kernel
log readings (collect.kernel_log) and the profile, taking `(readings, gpus, profile)` under
`@gpu_check("name")` (checks.gpu_inventory) and declared in registry.CHECK_GROUPS as `file.function`:

    hbm.py         ecc, row_remapping, retired_pages
    faults.py      xid
    throttling.py  clock_events, temperature, power_limit
    links.py       pcie_link (c2c.py: a GPU on NVLink-C2C), nvlink
    occupancy.py   processes

Readings are a snapshot: a throttle or link-speed check sees the GPU as it was at that instant, so idle GPUs
are judged as idle.
"""

from __future__ import annotations

from gpufleet.checks.gpu_health import faults, links, hbm, occupancy, throttling

__all__ = ["faults", "hbm", "links", "occupancy", "throttling"]
