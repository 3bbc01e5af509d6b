"""Host hygiene: one file per concern, each check a pure function of readings["host"] (collect.host.read) and the
profile, declared in registry.CHECK_GROUPS as `file.function`:

    pcie.py        PCIe ACS on the GPU and NIC paths, AER counts
    numa.py        GPU and NIC NUMA placement, automatic NUMA balancing
    infiniband.py  ports, their speeds alike, the HCA beside each GPU (rails), GPUDirect RDMA (peermem)
    kernel.py      IOMMU, CPU governor, fabric manager
    nccl_env.py    the NCCL environment
    bringup.py     drift from what bringup.yml applied
    readings.py    what they share: the host readings and their sections
"""

from __future__ import annotations

from gpufleet.checks.host_hygiene import (
    bringup,
    infiniband,
    kernel,
    nccl_env,
    numa,
    pcie,
    readings,
)

__all__ = ["bringup", "infiniband", "kernel", "nccl_env", "numa", "pcie", "readings"]
