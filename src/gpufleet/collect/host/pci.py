"""PCI devices from sysfs (kind, link, NUMA node, upstream bridges, IOMMU group) and the ACS capability of
every bridge from its config space."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

from gpufleet.collect.host.files import link_name, listdir, parse_int, read_text

NVIDIA = "0x10de"

ACS_CAP_ID = 0x000D
# ACS control register bits (PCIe base spec, ACS extended capability, offset 6).
ACS_CTRL_BITS = {
    "source_validation": 0,
    "translation_blocking": 1,
    "p2p_request_redirect": 2,
    "p2p_completion_redirect": 3,
    "upstream_forwarding": 4,
    "p2p_egress_control": 5,
    "direct_translated_p2p": 6,
}
# Without CAP_SYS_ADMIN the kernel returns only the standard header.
UNPRIVILEGED_CONFIG_BYTES = 64
NEEDS_ROOT = "needs root to read PCIe extended config space"

# GT/s per lane -> PCIe generation.
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pci_kind(vendor: str | None, pci_class: str | None) -> str:
    cls = (pci_class or "").lower()
    base = cls[:6]  # "0x0302" of "0x030200"
    if vendor == NVIDIA and base in ("0x0300", "0x0302"):
        return "gpu"
    if vendor == NVIDIA and base == "0x0680":
        return "nvswitch"
    # Ethernet or InfiniBand controller: ConnectX HCAs (vendor 0x15b3) show up as either.
    if base in ("0x0200", "0x0207"):
        return "nic"
    if base == "0x0604":
        return "bridge"
    return "other"


def parse_link_speed(text: str | None) -> int | None:
    """'32.0 GT/s PCIe' -> 5; 'Unknown' or garbage -> None."""
    m = re.match(r"\s*([\d.]+)\s*GT/s", text or "")
    return _GEN_BY_GTS.get(float(m.group(1))) if m else None


def upstream_chain(resolved_path: str) -> list[str]:
    """Bridge BDFs above a device, from its resolved sysfs path.

    /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0 -> ["0000:00:01.0"]
    """
    parts = Path(resolved_path).parts
    # From the first root bus ("pci0000:00"); VMD domains nest a second "pci10000:e0" further down.
    start = next((i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p), None)
    if start is None:
        return []
    return [p for p in parts[start + 1 : -1] if BDF.match(p)]


def pci_device(devdir: Path) -> dict:
    def field(name: str) -> str | None:
        return read_text(devdir / name)[0]

    vendor, pci_class = field("vendor"), field("class")
    numa = parse_int(field("numa_node"))
    cur_speed, max_speed = field("current_link_speed"), field("max_link_speed")
    resolved = os.path.realpath(devdir)
    return {
        "bdf": devdir.name,
        "vendor": vendor,
        "device": field("device"),
        "class": pci_class,
        "kind": pci_kind(vendor, pci_class),
        "driver": link_name(devdir / "driver"),
        "numa_node": -1 if numa is None else numa,
        "current_link_speed": cur_speed,
        "max_link_speed": max_speed,
        "current_link_gen": parse_link_speed(cur_speed),
        "max_link_gen": parse_link_speed(max_speed),
        "current_link_width": parse_int(field("current_link_width")),
        "max_link_width": parse_int(field("max_link_width")),
        "upstream": upstream_chain(resolved),
        "iommu_group": link_name(devdir / "iommu_group"),
        "path": resolved,
    }


def read_pci(root: Path) -> list[dict]:
    base = root / "sys/bus/pci/devices"
    return [pci_device(base / name) for name in (listdir(base) or [])]


def _u16(data: bytes, off: int) -> int:
    return struct.unpack_from("<H", data, off)[0]


def _u32(data: bytes, off: int) -> int:
    return struct.unpack_from("<I", data, off)[0]


def _has_pcie_cap(data: bytes) -> bool:
    """Walk the standard capability list for the PCI Express capability (0x10)."""
    if len(data) < 0x40 or not _u16(data, 0x06) & 0x10:
        return False
    ptr, seen = data[0x34] & 0xFC, set()
    while 0x40 <= ptr < len(data) - 1 and ptr not in seen:
        seen.add(ptr)
        if data[ptr] == 0x10:
            return True
        ptr = data[ptr + 1] & 0xFC
    return False


def ext_capabilities(data: bytes) -> list[tuple[int, int, int]]:
    """(cap_id, version, offset) for each extended capability from 0x100.

    Header dword: id in bits 0-15, version 16-19, next offset 20-31.
    """
    caps, off, seen = [], 0x100, set()
    while 0x100 <= off <= len(data) - 4 and off not in seen:
        seen.add(off)
        hdr = _u32(data, off)
        if hdr in (0, 0xFFFFFFFF):
            break
        caps.append((hdr & 0xFFFF, (hdr >> 16) & 0xF, off))
        off = (hdr >> 20) & 0xFFC
    return caps


def decode_acs(data: bytes) -> dict:
    """ACS state from raw config space bytes (what <dev>/config returns)."""
    if len(data) <= UNPRIVILEGED_CONFIG_BYTES:
        return {"status": "needs_root", "reason": f"{NEEDS_ROOT} (only {len(data)} bytes readable)"}
    if len(data) <= 0x100:
        if _has_pcie_cap(data):
            return {
                "status": "no_ext_config",
                "reason": "PCIe device but only 256 bytes of config space: extended config (ECAM) not accessible",
            }
        return {"status": "no_acs", "reason": "conventional PCI device: no extended capabilities, so no ACS"}
    caps = ext_capabilities(data)
    out: dict[str, Any] = {"ext_caps": [f"0x{cid:04x}@0x{off:03x}" for cid, _, off in caps]}
    acs = next((off for cid, _, off in caps if cid == ACS_CAP_ID), None)
    if acs is None or acs + 8 > len(data):
        return {**out, "status": "no_acs", "reason": "no ACS extended capability"}
    ctrl = _u16(data, acs + 6)
    return {
        **out,
        "status": "ok",
        "reason": None,
        "cap_offset": f"0x{acs:03x}",
        "acs_cap": f"0x{_u16(data, acs + 4):04x}",
        "ctrl": ctrl,
        "ctrl_hex": f"0x{ctrl:04x}",
        "ctrl_bits": {name: bool(ctrl >> bit & 1) for name, bit in ACS_CTRL_BITS.items()},
    }


def read_acs(root: Path, pci: list[dict]) -> list[dict]:
    by_bdf = {d["bdf"]: d for d in pci}
    below: dict[str, list[dict]] = {}
    for dev in pci:
        if dev["kind"] not in ("gpu", "nic"):
            continue
        for bdf in dev["upstream"]:
            # Only real bridges carry ACS for the path; VMD and other hosts are not bridges.
            if by_bdf.get(bdf, {}).get("kind") == "bridge":
                below.setdefault(bdf, []).append({"bdf": dev["bdf"], "kind": dev["kind"]})
    out = []
    for bdf in sorted(below):
        cfg = root / "sys/bus/pci/devices" / bdf / "config"
        entry: dict[str, Any] = {"bdf": bdf, "below": below[bdf], "config_path": str(cfg)}
        try:
            data = cfg.read_bytes()
        except OSError as exc:
            entry.update(status="unreadable", reason=f"{cfg}: {exc.strerror or exc}", config_bytes=None)
        else:
            entry.update(config_bytes=len(data), **decode_acs(data))
        out.append(entry)
    return out
