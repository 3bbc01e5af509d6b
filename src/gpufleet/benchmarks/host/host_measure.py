"""The host's own throughput, one step of the acceptance tier: its memory bandwidth per NUMA node
(host_memory.py), its local drive on the operator's scratch folder (host_disk.py) and a data loader's samples a
second a GPU (host_loader.py), one after another, the sampler watching (GpuMonitor: the GPUs' processes, the host's
neighbours, the PCIe links; bench.io_watch the drive).

The CPUs this process may use, and what gave it them (collect.host.platform), go with the figures that depend on
them. The figures are the node's where it has GPUs (`device` "cuda": the GPUs stay idle here, `gpus_idle`); on a machine
without them the same code runs at tiny sizes and its figures are a logic check (`device` "cpu", `skip`). `machine`
says whether the host is a virtual machine and why (collect.host.virtual, with the CPU steal the watch counted).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.base.registry import registers
from gpufleet.bench.monitor import GpuMonitor
from gpufleet.benchmarks.host import host_disk, host_loader, host_memory
from gpufleet.collect.host import virtual
from gpufleet.collect.host.platform import read_cpu_allocation


@registers("host", "measure")
def run(depth: str = "quick") -> dict:
    gpus = host_loader.gpu_count()
    size = depth if gpus else "cpu"
    with GpuMonitor() as mon:
        parts = {}
        for name, bench in (("memory", host_memory), ("disk", host_disk), ("loader", host_loader)):
            try:
                parts[name] = bench.run(size)
            except Exception as exc:  # one part's failure keeps the others' figures
                parts[name] = {"error": f"{type(exc).__name__}: {exc}"}
    monitor = mon.summary()
    if monitor["error"] is None:  # where the GPUs are watched, a drive neighbour disturbs as a CPU one does
        monitor["foreign"] += parts["disk"].get("foreign") or []
    steal = ((monitor.get("host") or {}).get("steal") or {}).get("ticks")
    return {
        "benchmark": "host",
        "device": "cuda" if gpus else "cpu",
        "gpus_idle": True,
        "requested_tier": depth,
        # The CPUs the memory triad and the loader ran on, and what gave them (a cgroup cpuset, a Slurm allocation).
        "cpu_allocation": read_cpu_allocation(Path("/")),
        **parts,
        "machine": virtual.with_steal(virtual.read(), steal),  # a virtual machine's host figures move with its guests
        "monitor": monitor,
    }
