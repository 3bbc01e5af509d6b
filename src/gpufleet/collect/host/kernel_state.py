"""The kernel's state: loaded modules, IOMMU groups and command line, NUMA nodes and balancing, cpufreq
governors."""

from __future__ import annotations

import re
from pathlib import Path

from gpufleet.collect.host.files import parse_cpulist, listdir, parse_int, read_text

_MODULES_OF_INTEREST = ("nvidia", "nvidia_uvm", "nvidia_peermem", "nv_peer_mem", "ib_core")
_IOMMU_FLAGS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")


def read_modules(root: Path) -> dict:
    path = root / "proc/modules"
    text, reason = read_text(path)
    if text is None:
        return {"path": str(path), "readable": False, "reason": reason, "count": None, "loaded": {}}
    names = {line.split()[0] for line in text.splitlines() if line.strip()}
    return {
        "path": str(path),
        "readable": True,
        "reason": None,
        "count": len(names),
        "loaded": {m: m in names for m in _MODULES_OF_INTEREST},
    }


def iommu_cmdline_flags(cmdline: str | None) -> dict:
    flags = {}
    for tok in (cmdline or "").split():
        key, _, val = tok.partition("=")
        if key in _IOMMU_FLAGS:
            flags[key] = val
    return flags


def _iommu_mode(group_type: str | None) -> str | None:
    if group_type == "identity":
        return "passthrough"
    if group_type and group_type.startswith("DMA"):
        return "translated"
    return None


def read_iommu(root: Path, pci: list[dict]) -> dict:
    groups_path = root / "sys/kernel/iommu_groups"
    groups = listdir(groups_path)
    cmdline_path = root / "proc/cmdline"
    cmdline, cmd_reason = read_text(cmdline_path)
    gpu_groups = []
    for dev in pci:
        if dev["kind"] != "gpu":
            continue
        tpath = root / "sys/bus/pci/devices" / dev["bdf"] / "iommu_group" / "type"
        gtype, reason = read_text(tpath) if dev["iommu_group"] is not None else (None, "device has no iommu_group link")
        gpu_groups.append(
            {
                "bdf": dev["bdf"],
                "group": dev["iommu_group"],
                "type": gtype,
                "mode": _iommu_mode(gtype),
                "path": str(tpath),
                "reason": reason,
            }
        )
    return {
        "groups_path": str(groups_path),
        "groups_present": bool(groups),
        "group_count": len(groups) if groups is not None else 0,
        "gpu_groups": gpu_groups,
        "cmdline_path": str(cmdline_path),
        "cmdline": cmdline,
        "cmdline_flags": iommu_cmdline_flags(cmdline),
        "reason": cmd_reason,
    }


def read_numa(root: Path) -> dict:
    base = root / "sys/devices/system/node"
    nodes = []
    for name in listdir(base) or []:
        if re.fullmatch(r"node\d+", name):
            cpulist = read_text(base / name / "cpulist")[0]
            distance = read_text(base / name / "distance")[0]
            nodes.append(
                {
                    "node": int(name[4:]),
                    "cpulist": cpulist,
                    # 0: memory alone (a Grace Hopper node's GPU memory); None: the list could not be read
                    "cpus": None if cpulist is None else len(parse_cpulist(cpulist)),
                    "distance": [int(d) for d in distance.split()] if distance else None,
                }
            )
    nodes.sort(key=lambda n: n["node"])
    bal_path = root / "proc/sys/kernel/numa_balancing"
    bal, bal_reason = read_text(bal_path)
    return {
        "nodes": nodes,
        "nodes_path": str(base),
        "numa_balancing": parse_int(bal),
        "numa_balancing_path": str(bal_path),
        "reason": bal_reason,
    }


def read_cpu_governors(root: Path) -> dict:
    base = root / "sys/devices/system/cpu"
    cpus = [n for n in listdir(base) or [] if re.fullmatch(r"cpu\d+", n)]
    counts: dict[str, int] = {}
    without = 0
    for cpu in cpus:
        gov = read_text(base / cpu / "cpufreq/scaling_governor")[0]
        if gov is None:
            without += 1
        else:
            counts[gov] = counts.get(gov, 0) + 1
    present = bool(counts)
    return {
        "present": present,
        "counts": counts,
        "cpus": len(cpus),
        "cpus_without_cpufreq": without,
        "path": str(base / "cpu*/cpufreq/scaling_governor"),
        "reason": None if present else "no CPU frequency scaling exposed (cpufreq absent)",
    }
