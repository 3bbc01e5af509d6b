"""Whether the host is a virtual machine, and what says so: its firmware's DMI strings naming a hypervisor's
platform (/sys/class/dmi/id: sys_vendor, product_name, bios_vendor), the CPU's `hypervisor` flag (/proc/cpuinfo:
set by the hypervisor for its guests), and CPU steal (the host watch's reading, added by benchmarks.host). On such a host
the hypervisor's other guests share the CPUs and memory, so a host figure's drop is the environment's unless it
repeats over runs (comparisons/trusted.py). Never raises: what cannot be read says nothing."""

from __future__ import annotations

from pathlib import Path

from gpufleet.collect.host.files import read_text

DMI = ("sys_vendor", "product_name", "bios_vendor")
# Words of a hypervisor's platform in those strings (systemd-detect-virt's DMI table, in short).
PLATFORMS = (
    "KVM",
    "QEMU",
    "VMware",
    "VirtualBox",
    "innotek",
    "Xen",
    "Amazon EC2",
    "Google Compute Engine",
    "OpenStack",
    "Bochs",
    "Parallels",
    "BHYVE",
    "Virtual Machine",
    "Cloud Hypervisor",
)


def read(root: str = "/") -> dict:
    """{"virtual": bool, "why": "DMI product_name 'KVM'; CPU flag hypervisor" or None}."""
    base = Path(root)
    why = []
    for name in DMI:
        text, _ = read_text(base / "sys/class/dmi/id" / name)
        if text and any(p.lower() in text.lower() for p in PLATFORMS):
            why.append(f"DMI {name} {text!r}")
    cpuinfo, _ = read_text(base / "proc/cpuinfo")
    flags = next(
        (line.split(":", 1)[1].split() for line in (cpuinfo or "").splitlines() if line.startswith("flags")), []
    )
    if "hypervisor" in flags:
        why.append("CPU flag hypervisor")
    return {"virtual": bool(why), "why": "; ".join(why) or None}


def with_steal(machine: dict, steal_ticks: int | None) -> dict:
    """The reading with the CPU steal the host watch counted (clock ticks the hypervisor gave to other guests)."""
    if not steal_ticks:
        return machine
    why = "; ".join(x for x in (machine.get("why"), f"CPU steal ({steal_ticks} ticks while measured)") if x)
    return {"virtual": True, "why": why}
