"""The node's platform: facts read once (collect: the kernel's architecture, NVML's C2C mode, sysfs's NUMA nodes) and
carried in the host document (`platform`), so that the checks, the judges and the report branch on what the node
is, never on a model name:

    {"architecture": "aarch64", "host_link": "nvlink_c2c",
     "cpu_numa_nodes": [0, 1, 2, 3], "memory_numa_nodes": [4, 5, ...],
     "gpus": [{"index": 0, "host_link": "nvlink_c2c", "cpu_node": 0, "memory_node": 4}, ...]}

host_link: "nvlink_c2c" when any GPU reaches its CPU over NVLink-C2C (a Grace superchip), "pcie" when GPUs are
there and none does, None without GPUs. A GPU's cpu_node: the NUMA node with CPUs nearest it (its PCI device's node;
where that is a node of memory alone, the CPU node nearest that by the SLIT); memory_node: the NUMA node of its own
memory on a coherent platform (NVML), else None. A node of memory alone has no CPUs to run a job's threads on: a
Grace Hopper node of 4 superchips lists 36 NUMA nodes, 4 of them with CPUs.

Nothing here imports the rest of gpufleet: every layer may read it.
"""

from __future__ import annotations

PCIE, C2C = "pcie", "nvlink_c2c"
HOST_LINK_WORDS = {PCIE: "PCIe", C2C: "NVLink-C2C"}


def _host(readings: dict) -> dict:
    host = readings.get("host")
    return host if isinstance(host, dict) else {}


def _gpus(readings: dict) -> list[dict]:
    nv = readings.get("nvml")
    return (nv.get("gpus") or []) if isinstance(nv, dict) else []


def gpu_host_link(gpu: dict) -> str:
    """NVLink-C2C where NVML says the GPU's C2C is on, else PCIe."""
    return C2C if (gpu.get("c2c") or {}).get("enabled") else PCIE


def host_link(readings: dict) -> str | None:
    links = {gpu_host_link(g) for g in _gpus(readings)}
    return (C2C if C2C in links else PCIE) if links else None


def numa_nodes(readings: dict) -> list[dict]:
    return ((_host(readings).get("numa") or {}).get("nodes")) or []


def cpu_numa_nodes(readings: dict) -> list[int]:
    """The NUMA nodes that have CPUs (a node whose CPU list could not be read counts as one)."""
    return [n["node"] for n in numa_nodes(readings) if n.get("cpus") is None or n["cpus"] > 0]


def memory_numa_nodes(readings: dict) -> list[int]:
    """The NUMA nodes of memory alone: no CPU runs there (a Grace Hopper node's GPU memory)."""
    return [n["node"] for n in numa_nodes(readings) if n.get("cpus") == 0]


def nearest_cpu_node(readings: dict, node: int | None) -> int | None:
    """The CPU node nearest `node` by the SLIT's distances (itself when it has CPUs); None when it cannot be told."""
    cpu_nodes = cpu_numa_nodes(readings)
    if node is None or node < 0:
        return None
    if node in cpu_nodes:
        return node
    row = next((n.get("distance") for n in numa_nodes(readings) if n["node"] == node), None)
    if not row or not cpu_nodes:
        return None
    reachable = [c for c in cpu_nodes if c < len(row)]
    return min(reachable, key=lambda c: (row[c], c)) if reachable else None


def gpu_nodes(readings: dict) -> list[dict]:
    """Each GPU's link to the host, its CPU node and its memory's node."""
    pci_nodes = {d.get("bdf"): d.get("numa_node") for d in _host(readings).get("pci") or [] if isinstance(d, dict)}
    out = []
    for g in _gpus(readings):
        memory_node = g.get("memory_numa_node")
        cpu_node = nearest_cpu_node(readings, pci_nodes.get(g.get("pci_bus_id")))
        if cpu_node is None:
            cpu_node = nearest_cpu_node(readings, memory_node)
        out.append(
            {"index": g.get("index"), "host_link": gpu_host_link(g), "cpu_node": cpu_node, "memory_node": memory_node}
        )
    return out


def facts(readings: dict) -> dict:
    """The host document's `platform` (the module's docstring)."""
    return {
        "architecture": _host(readings).get("architecture"),
        "host_link": host_link(readings),
        "cpu_numa_nodes": cpu_numa_nodes(readings),
        "memory_numa_nodes": memory_numa_nodes(readings),
        "gpus": gpu_nodes(readings),
    }
