"""Host hygiene: one file per concern, each check a pure function of readings["host"] (collect.host.read) and the
profile, declared in registry.CHECK_GROUPS and registered as `host_hygiene.<name>` (`@registers`):

    pcie.py           PCIe ACS on the GPU and NIC paths, AER counts
    numa.py           GPU and NIC NUMA placement, automatic NUMA balancing
    infiniband.py     ports, their speeds alike, the HCA beside each GPU (rails), GPUDirect RDMA (peermem)
    kernel.py         IOMMU, CPU governor, fabric manager
    nccl_env.py       the NCCL environment
    bringup_drift.py  drift from what bringup.yml applied
    system_memory.py  the host's memory: errors EDAC counted (per controller and DIMM), machine checks in the
                      kernel log, the memory a job would get
    nvme_health.py    each local NVMe drive's own health log
    readings.py       what they share: the host readings and their sections
"""

from __future__ import annotations

from gpufleet.checks.host_hygiene import (
    bringup_drift,
    infiniband,
    kernel,
    system_memory,
    nccl_env,
    numa,
    nvme_health,
    pcie,
    readings,
)

__all__ = [
    "bringup_drift",
    "infiniband",
    "kernel",
    "nccl_env",
    "numa",
    "nvme_health",
    "pcie",
    "readings",
    "system_memory",
]
