"""The PCIe links of every NIC (InfiniBand and Ethernet) and GPU and of the switches and bridges above them, as
trained: each link's speed and width now against the most both of its ends can do.

A function's Link Status (sysfs current_link_speed, current_link_width) describes one link: an endpoint's or a
switch upstream port's, the link above it; a root port's or a switch downstream port's, the link below it. On the
path from a root port down to a device the ports alternate (root port, upstream port, downstream port, upstream
port, ...), so the links are (child, parent) pairs: the device and the port above it, each upstream port and the
port above it; the link's most is the lower of both ends' max_link_* (the parent's is the slot's). A path that does
not alternate so (a conventional PCI bridge on it) holds its device's own link only, against its own maximum.

`plan(pci)` names the links once, from collect.host.pci's devices; `read(root, links)` reads their speed and width
now (what a sampler repeats while the benchmarks load them: an idle GPU link trains down on purpose).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.collect.host.files import parse_int, read_text
from gpufleet.collect.host.pci import parse_link_speed, read_pci

ENDPOINT_KINDS = ("nic", "gpu")


def _max(dev: dict) -> tuple:
    return dev.get("max_link_gen"), dev.get("max_link_width")


def _lower(a, b):
    return b if a is None else a if b is None else min(a, b)


def plan(pci: list[dict]) -> list[dict]:
    """The links of every NIC and GPU and of the ports above them, each once: [{"bdf" (the child end, whose Link
    Status is read), "kind" (nic, gpu, bridge), "parent" (the port above, None on a root bus), "below" (the NICs
    and GPUs under it), "max_gen", "max_width" (the lower of both ends' maxima), "device_max", "slot_max"}]."""
    by_bdf = {d["bdf"]: d for d in pci}
    links: dict[str, dict] = {}
    for dev in pci:
        if dev.get("kind") not in ENDPOINT_KINDS or dev.get("max_link_gen") is None:
            continue
        chain = [b for b in dev.get("upstream") or [] if b in by_bdf]
        # (child, parent): the device under the last port; each upstream port (odd place) under the port above it
        pairs = [(dev["bdf"], chain[-1] if chain else None)]
        if len(chain) % 2 == 1:
            pairs += [(chain[i + 1], chain[i]) for i in range(0, len(chain) - 1, 2)]
        for child, parent in pairs:
            c, p = by_bdf[child], by_bdf.get(parent) if parent else None
            entry = links.get(child)
            if entry is None:
                gen, width = _max(c)
                slot = _max(p) if p else (None, None)
                entry = links[child] = {
                    "bdf": child,
                    "kind": c.get("kind") if child == dev["bdf"] else "bridge",
                    "parent": parent,
                    "below": [],
                    "device_max": {"gen": gen, "width": width},
                    "slot_max": {"gen": slot[0], "width": slot[1]},
                    "max_gen": _lower(gen, slot[0]),
                    "max_width": _lower(width, slot[1]),
                    "path": c.get("path"),
                }
            entry["below"].append(dev["bdf"])
    return sorted(links.values(), key=lambda e: e["bdf"])


def read(root: Path, links: list[dict]) -> dict:
    """{bdf: {"gen", "width", "speed"} or {"error"}}: each link's Link Status now."""
    out = {}
    for link in links:
        folder = root / "sys/bus/pci/devices" / link["bdf"]
        speed, why = read_text(folder / "current_link_speed")
        width_text, why_w = read_text(folder / "current_link_width")
        gen, width = parse_link_speed(speed), parse_int(width_text)
        if gen is None or not width:
            out[link["bdf"]] = {"error": why or why_w or f"unreadable: speed {speed!r}, width {width_text!r}"}
        else:
            out[link["bdf"]] = {"gen": gen, "width": width, "speed": speed}
    return out


def links_of(root: str = "/") -> list[dict]:
    """The links to watch on this host (plan over its PCI devices); [] when none reads."""
    return plan(read_pci(Path(root)))
