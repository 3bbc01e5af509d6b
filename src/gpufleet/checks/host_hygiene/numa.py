"""NUMA: each GPU and its NIC on one NUMA node, and automatic NUMA balancing."""

from __future__ import annotations

from gpufleet.base import host_platform, profiles
from gpufleet.checks.host_hygiene.readings import (
    BRINGUP,
    devices,
    host_readings,
    section,
)
from gpufleet.base.schema import FAIL, PASS, SKIP, WARN, result


def _rdma_nics(readings: dict) -> list[dict]:
    """NICs that back an RDMA device when there are any, else every NIC."""
    nics = devices(readings, "nic")
    ib = host_readings(readings).get("infiniband") or {}
    hca_bdfs = {p.get("pci_bdf") for p in ib.get("ports") or [] if p.get("pci_bdf")}
    rdma = [n for n in nics if n["bdf"] in hca_bdfs]
    return rdma or nics


def _cpu_node(readings: dict, node: int) -> int:
    """A device's NUMA node as the CPU node nearest it (a node of memory alone has no CPU to pin a job near)."""
    nearest = host_platform.nearest_cpu_node(readings, node)
    return node if nearest is None else nearest


def check_numa_affinity(readings: dict, profile: dict) -> dict:
    """The NUMA node of each GPU and of the RDMA NICs beside it: a GPU the firmware places on no node, or on a
    node with no NIC while NICs sit on others, warns. Only the NUMA nodes with CPUs count: a Grace Hopper node's GPU
    memory is NUMA nodes of its own that no thread runs on; each GPU is mapped to its CPU node (detail.gpus_by_node)."""
    name = "numa_affinity"
    gpus = [dict(g, numa_node=_cpu_node(readings, g["numa_node"])) for g in devices(readings, "gpu")]
    if not gpus:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus")
    nodes = host_platform.cpu_numa_nodes(readings)
    memory_only = host_platform.memory_numa_nodes(readings)
    nics = [dict(n, numa_node=_cpu_node(readings, n["numa_node"])) for n in _rdma_nics(readings)]
    table = {
        "numa_nodes": nodes,
        **({"memory_only_numa_nodes": memory_only} if memory_only else {}),
        "gpus": {g["bdf"]: g["numa_node"] for g in gpus},
        "nics": {n["bdf"]: n["numa_node"] for n in nics},
    }
    by_node = host_platform.gpu_nodes(readings)
    if by_node:
        table["gpus_by_node"] = by_node
    alone = f", {len(memory_only)} more of memory alone (GPU memory, no CPU)" if memory_only else ""
    if len(nodes) <= 1:
        return result(
            name,
            PASS,
            f"single NUMA node{' with CPUs' if memory_only else ''} ({len(nodes)} listed{alone}): every GPU and NIC is local",
            detail=table,
        )
    unknown = [g["bdf"] for g in gpus if g["numa_node"] < 0]
    if unknown:
        return result(
            name,
            WARN,
            f"{len(unknown)} GPU(s) report numa_node -1 on a host with {len(nodes)} NUMA nodes ({', '.join(unknown)}): "
            "the firmware does not say which socket they hang off, so jobs cannot be pinned near them",
            value=len(unknown),
            unit="gpus",
            remedy="check the BIOS NUMA/SRAT settings (one NUMA node per socket, ACPI proximity for PCIe) and update firmware",
            detail=table,
        )
    nic_nodes = sorted({n["numa_node"] for n in nics if n["numa_node"] >= 0})
    lonely = [g for g in gpus if nic_nodes and g["numa_node"] not in nic_nodes]
    if lonely:
        on = sorted({g["numa_node"] for g in lonely})
        return result(
            name,
            WARN,
            f"{len(lonely)} GPU(s) sit on NUMA node(s) {on} with no NIC while NICs sit on node(s) {nic_nodes}: "
            "their GPUDirect RDMA traffic crosses the socket interconnect",
            value=len(lonely),
            unit="gpus",
            remedy="check HCA placement and riser cabling against the platform's reference layout",
            detail=table,
        )
    return result(
        name,
        PASS,
        f"{len(gpus)} GPU(s) on NUMA node(s) {sorted({g['numa_node'] for g in gpus})}, "
        f"{len(nics)} NIC(s) on node(s) {nic_nodes}" + (f" (of {len(nodes)} with CPUs{alone})" if memory_only else ""),
        detail=table,
    )


# --- InfiniBand ------------------------------------------------------------------------


def check_numa_balancing(readings: dict, profile: dict) -> dict:
    """Automatic NUMA balancing (kernel.numa_balancing) against numa_balancing_expected (off): another value fails."""
    name = "numa_balancing"
    numa, err = section(readings, name, "numa")
    if err:
        return err
    balancing = numa.get("numa_balancing")
    threshold = profiles.threshold(profile, "numa_balancing_expected")
    expected = threshold["value"]
    detail = {"path": numa.get("numa_balancing_path"), "value": balancing, "reason": numa.get("reason")}
    if balancing is None:
        return result(
            name,
            SKIP,
            f"automatic NUMA balancing not exposed ({numa.get('reason')})",
            threshold=threshold,
            detail=detail,
        )
    if expected is None:
        return result(
            name,
            WARN,
            f"kernel.numa_balancing is {balancing}; numa_balancing_expected is not set",
            value=balancing,
            threshold=threshold,
            remedy="set gpufleet_thresholds.numa_balancing_expected",
            detail=detail,
        )
    if balancing != expected:
        return result(
            name,
            FAIL,
            f"kernel.numa_balancing is {balancing}, expected {expected}",
            value=balancing,
            threshold=threshold,
            remedy=f"{BRINGUP}, or sysctl -w kernel.numa_balancing={expected} and persist it in /etc/sysctl.d",
            detail=detail,
        )
    return result(
        name, PASS, f"kernel.numa_balancing is {balancing}", value=balancing, threshold=threshold, detail=detail
    )
