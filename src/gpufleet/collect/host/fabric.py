"""The fabric: every InfiniBand port with its counters, and AER counts of every GPU, HCA and bridge up to the
root port; read_fabric() is what the counter snapshots take."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpufleet.collect.host.edac import read_edac
from gpufleet.collect.host.files import listdir, parse_int, read_text
from gpufleet.collect.host.nvme import read_nvme
from gpufleet.collect.host.pci import BDF, read_pci


def parse_rate_gbps(text: str | None) -> float | int | None:
    """'400 Gb/sec (4X NDR)' -> 400; '2.5 Gb/sec (1X SDR)' -> 2.5."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    if not m:
        return None
    val = float(m.group(1))
    return int(val) if val.is_integer() else val


def _state_name(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'."""
    return text.split(":", 1)[-1].strip() if text else None


def parse_lanes(text: str | None) -> int | None:
    """'400 Gb/sec (4X NDR)' -> 4; '200 Gb/sec (2X NDR)' -> 2."""
    m = re.search(r"\((\d+)X\b", text or "")
    return int(m.group(1)) if m else None


def read_ib_port(pdir: Path) -> dict:
    """One InfiniBand port's sysfs folder (.../infiniband/<hca>/ports/<n>): its state, speed and link layer."""
    state, phys, rate, layer = (read_text(pdir / f)[0] for f in ("state", "phys_state", "rate", "link_layer"))
    return {
        "port": parse_int(pdir.name),
        "state": _state_name(state),
        "phys_state": _state_name(phys),
        "rate_gbps": parse_rate_gbps(rate),
        "rate": rate,
        "lanes": parse_lanes(rate),
        "link_layer": layer,
    }


# hw_counters/lifespan is how many ms the driver caches the others, not a count.
_NOT_COUNTERS = {"lifespan"}


def read_ib_counters(pdir: Path) -> dict:
    """Every counter of a port's counters/ (the IBTA PortCounters and their extended forms), counters_ext/ (where an
    older kernel keeps the extended ones) and hw_counters/ (what the driver adds: mlx5's transport and RoCE
    counters): {"counters": {name: int}, "counters_unreadable": {name: reason}}. A name in two keeps the first."""
    values: dict[str, int] = {}
    unreadable: dict[str, str] = {}
    for sub in ("counters", "counters_ext", "hw_counters"):  # counters_ext: the 64-bit ones of older kernels
        for name in listdir(pdir / sub) or []:
            if name in _NOT_COUNTERS or name in values:
                continue
            text, why = read_text(pdir / sub / name)
            try:
                values[name] = int(text)  # decimal; a leading zero is no octal here
            except (TypeError, ValueError):
                unreadable[name] = why or f"{pdir / sub / name}: not a count ({text!r})"
    return {"counters": values, "counters_unreadable": unreadable}


def read_infiniband(root: Path) -> dict:
    base = root / "sys/class/infiniband"
    hcas = listdir(base)
    if hcas is None:
        return {"present": False, "path": str(base), "reason": f"{base}: not present", "ports": []}
    ports = []
    for hca in hcas:
        bdf = os.path.basename(os.path.realpath(base / hca / "device")) if (base / hca / "device").exists() else None
        for port in listdir(base / hca / "ports") or []:
            pdir = base / hca / "ports" / port
            ports.append(
                {
                    "hca": hca,
                    **read_ib_port(pdir),
                    "pci_bdf": bdf if bdf and BDF.match(bdf) else None,
                    "path": str(pdir),
                    **read_ib_counters(pdir),
                }
            )
    return {"present": True, "path": str(base), "reason": None if hcas else f"{base} is empty", "ports": ports}


AER_SEVERITIES = ("correctable", "nonfatal", "fatal")


def parse_aer(text: str) -> dict:
    """An aer_dev_* file ("RxErr 2" lines, or "Receiver Error 2" on older kernels, then TOTAL_ERR_COR 2):
    {"total": n, "names": {name: n}} with the names that counted (not 0); total None without a TOTAL_ line."""
    names, total = {}, None
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if not name or not count.isdigit():
            continue
        if name.startswith("TOTAL_"):
            total = int(count)
        elif int(count):
            names[name.strip()] = int(count)
    return {"total": total, "names": names}


def read_aer(root: Path, pci: list[dict], hca_bdfs: set[str]) -> dict:
    """The AER counts of every GPU, every HCA (hca_bdfs) and every bridge between each and its root port
    (the resolved sysfs path walked up: `upstream`), each device once."""
    roles: dict[str, str] = {}
    below: dict[str, list[str]] = {}
    for dev in pci:
        role = "gpu" if dev.get("kind") == "gpu" else "hca" if dev.get("bdf") in hca_bdfs else None
        if role is None:
            continue
        roles[dev["bdf"]] = role
        for bdf in dev.get("upstream") or []:
            roles.setdefault(bdf, "bridge")
            below.setdefault(bdf, []).append(dev["bdf"])
    devices, read_any = [], False
    for bdf in sorted(roles):
        ddir = root / "sys/bus/pci/devices" / bdf
        entry: dict[str, Any] = {
            "bdf": bdf,
            "role": roles[bdf],
            "below": sorted(below.get(bdf, [])),
            "path": os.path.realpath(ddir),
            "reason": None,
        }
        why = []
        for sev in AER_SEVERITIES:
            text, reason = read_text(ddir / f"aer_dev_{sev}")
            entry[sev] = parse_aer(text) if text is not None else None
            if text is None:
                why.append(reason)
            else:
                read_any = True
        entry["reason"] = "; ".join(why) or None
        devices.append(entry)
    reason = None
    if not devices:
        reason = "no GPU or HCA on the PCI bus"
    elif not read_any:
        reason = (
            "no aer_dev_* file under any GPU, HCA or bridge above them (a kernel without AER statistics, "
            "4.19 and later with CONFIG_PCIEAER, or AER not granted to the OS by the firmware)"
        )
    return {"present": read_any, "reason": reason, "devices": devices}


def read_fabric(root: str = "/") -> dict:
    """The readings the fabric counter snapshots take: {"infiniband", "aer"}, and the host's own error counters
    beside them, {"edac", "nvme"} (never raises)."""
    rootp = Path(root)
    out: dict[str, Any] = {}
    for name, read, empty in (("edac", read_edac, "controllers"), ("nvme", read_nvme, "drives")):
        try:
            out[name] = read(rootp)
        except Exception as exc:  # a crash is recorded, not raised
            out[name] = {"present": False, empty: [], "reason": f"reading crashed: {type(exc).__name__}: {exc}"}
    try:
        out["infiniband"] = read_infiniband(rootp)
    except Exception as exc:  # a crash is recorded, not raised
        out["infiniband"] = {"present": False, "ports": [], "reason": f"reading crashed: {type(exc).__name__}: {exc}"}
    try:
        out["aer"] = read_aer(rootp, read_pci(rootp), hca_bdfs(out["infiniband"]))
    except Exception as exc:
        out["aer"] = {"present": False, "devices": [], "reason": f"reading crashed: {type(exc).__name__}: {exc}"}
    return out


def hca_bdfs(ib: dict) -> set[str]:
    return {p["pci_bdf"] for p in ib.get("ports") or [] if p.get("pci_bdf")}
