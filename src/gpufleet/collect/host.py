"""Host readings from sysfs and procfs (never from lspci text).

`read(root, environ)` returns a JSON-able dict and never raises. Every path is
read under `root`, so tests point it at a fake tree. What could not be read is
recorded next to where the value would be, with the reason; a section that
crashed outright, or a top-level value that could not be read, is listed under
"errors".

Keys:
  root, kernel, os, is_root, boot_id (this boot's id, proc/sys/kernel/random/boot_id)
  pci            [{bdf, vendor, device, class, kind, driver, numa_node,
                   current_link_gen, current_link_width, max_link_gen,
                   max_link_width, current_link_speed, max_link_speed,
                   upstream, iommu_group, path}]
  acs            [{bdf, below, config_path, config_bytes, status, reason,
                   ext_caps, cap_offset, acs_cap, ctrl, ctrl_hex, ctrl_bits}]
                 status: ok | no_acs | needs_root | no_ext_config | unreadable
  infiniband     {present, path, reason, ports: [{hca, port, state, phys_state,
                   rate_gbps, rate, lanes, link_layer, pci_bdf, path,
                   counters: {name: int}, counters_unreadable: {name: reason}}]}
                 counters: every file of the port's counters/ and hw_counters/
  aer            {present, reason, devices: [{bdf, role, below, path, correctable,
                   nonfatal, fatal, reason}]}  every GPU, every HCA and every bridge
                 between each and its root port; each severity {total, names: {name: n}}
                 from aer_dev_correctable|nonfatal|fatal, or null with the reason
  modules        {path, readable, reason, count, loaded: {name: bool}}
  iommu          {groups_path, groups_present, group_count, gpu_groups:
                   [{bdf, group, type, mode}], cmdline, cmdline_flags, reason}
  numa           {nodes: [{node, cpulist}], numa_balancing, paths, reason}
  cpu_governors  {present, counts: {governor: n}, cpus, cpus_without_cpufreq, path, reason}
  fabricmanager  {asked, state, rc, command, reason}  (asked only with an NVSwitch)
  nccl           {env, conf: {path, present, values, ignored_lines},
                  effective: {name: {value, source}}, interfaces: {name: operstate}}
  bringup        {path, present, readable, reason, schema_version, roles:
                  {role: {applied_at, settings, expect: [{what, path|glob,
                   sha256|value|exists, found, found_reason}]}}}
  errors         [{section, reason}]
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping

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
_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_MODULES_OF_INTEREST = ("nvidia", "nvidia_uvm", "nvidia_peermem", "nv_peer_mem", "ib_core")
_IOMMU_FLAGS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")
FABRICMANAGER_UNIT = "nvidia-fabricmanager"
SYSTEMCTL_TIMEOUT_S = 10


# --- small readers ---------------------------------------------------------


def read_text(path: Path) -> tuple[str | None, str | None]:
    """(stripped text, None) or (None, reason)."""
    try:
        return path.read_text(errors="replace").strip(), None
    except FileNotFoundError:
        return None, f"{path}: not present"
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def parse_int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _listdir(path: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


# --- PCI -------------------------------------------------------------------


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
    return [p for p in parts[start + 1 : -1] if _BDF.match(p)]


def _pci_device(devdir: Path) -> dict:
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
        "driver": _link_name(devdir / "driver"),
        "numa_node": -1 if numa is None else numa,
        "current_link_speed": cur_speed,
        "max_link_speed": max_speed,
        "current_link_gen": parse_link_speed(cur_speed),
        "max_link_gen": parse_link_speed(max_speed),
        "current_link_width": parse_int(field("current_link_width")),
        "max_link_width": parse_int(field("max_link_width")),
        "upstream": upstream_chain(resolved),
        "iommu_group": _link_name(devdir / "iommu_group"),
        "path": resolved,
    }


def _read_pci(root: Path) -> list[dict]:
    base = root / "sys/bus/pci/devices"
    return [_pci_device(base / name) for name in (_listdir(base) or [])]


# --- PCIe config space and ACS -------------------------------------------------


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


def _read_acs(root: Path, pci: list[dict]) -> list[dict]:
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


# --- InfiniBand ------------------------------------------------------------------


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
    return {"port": parse_int(pdir.name), "state": _state_name(state), "phys_state": _state_name(phys),
            "rate_gbps": parse_rate_gbps(rate), "rate": rate, "lanes": parse_lanes(rate), "link_layer": layer}


# hw_counters/lifespan is how many ms the driver caches the others, not a count.
_NOT_COUNTERS = {"lifespan"}


def read_ib_counters(pdir: Path) -> dict:
    """Every counter of a port's counters/ (the IBTA PortCounters and their extended forms), counters_ext/ (where an
    older kernel keeps the extended ones) and hw_counters/ (what the driver adds: mlx5's transport and RoCE
    counters): {"counters": {name: int}, "counters_unreadable": {name: reason}}. A name in two keeps the first."""
    values: dict[str, int] = {}
    unreadable: dict[str, str] = {}
    for sub in ("counters", "counters_ext", "hw_counters"):  # counters_ext: the 64-bit ones of older kernels
        for name in _listdir(pdir / sub) or []:
            if name in _NOT_COUNTERS or name in values:
                continue
            text, why = read_text(pdir / sub / name)
            try:
                values[name] = int(text)  # decimal; a leading zero is no octal here
            except (TypeError, ValueError):
                unreadable[name] = why or f"{pdir / sub / name}: not a count ({text!r})"
    return {"counters": values, "counters_unreadable": unreadable}


def _read_infiniband(root: Path) -> dict:
    base = root / "sys/class/infiniband"
    hcas = _listdir(base)
    if hcas is None:
        return {"present": False, "path": str(base), "reason": f"{base}: not present", "ports": []}
    ports = []
    for hca in hcas:
        bdf = os.path.basename(os.path.realpath(base / hca / "device")) if (base / hca / "device").exists() else None
        for port in _listdir(base / hca / "ports") or []:
            pdir = base / hca / "ports" / port
            ports.append({"hca": hca, **read_ib_port(pdir), "pci_bdf": bdf if bdf and _BDF.match(bdf) else None,
                          "path": str(pdir), **read_ib_counters(pdir)})
    return {"present": True, "path": str(base), "reason": None if hcas else f"{base} is empty", "ports": ports}


# --- PCIe AER ----------------------------------------------------------------------

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
        entry: dict[str, Any] = {"bdf": bdf, "role": roles[bdf], "below": sorted(below.get(bdf, [])),
                                 "path": os.path.realpath(ddir), "reason": None}
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
        reason = ("no aer_dev_* file under any GPU, HCA or bridge above them (a kernel without AER statistics, "
                  "4.19 and later with CONFIG_PCIEAER, or AER not granted to the OS by the firmware)")
    return {"present": read_any, "reason": reason, "devices": devices}


def read_fabric(root: str = "/") -> dict:
    """The readings the fabric counter snapshots take: {"infiniband", "aer"} (never raises)."""
    rootp = Path(root)
    out: dict[str, Any] = {}
    try:
        out["infiniband"] = _read_infiniband(rootp)
    except Exception as exc:  # a crash is recorded, not raised
        out["infiniband"] = {"present": False, "ports": [], "reason": f"reading crashed: {type(exc).__name__}: {exc}"}
    try:
        out["aer"] = read_aer(rootp, _read_pci(rootp), _hca_bdfs(out["infiniband"]))
    except Exception as exc:
        out["aer"] = {"present": False, "devices": [], "reason": f"reading crashed: {type(exc).__name__}: {exc}"}
    return out


def _hca_bdfs(ib: dict) -> set[str]:
    return {p["pci_bdf"] for p in ib.get("ports") or [] if p.get("pci_bdf")}


# --- modules, IOMMU, NUMA, cpufreq ---------------------------------------------


def _read_modules(root: Path) -> dict:
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


def _read_iommu(root: Path, pci: list[dict]) -> dict:
    groups_path = root / "sys/kernel/iommu_groups"
    groups = _listdir(groups_path)
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


def _read_numa(root: Path) -> dict:
    base = root / "sys/devices/system/node"
    nodes = []
    for name in _listdir(base) or []:
        if re.fullmatch(r"node\d+", name):
            nodes.append({"node": int(name[4:]), "cpulist": read_text(base / name / "cpulist")[0]})
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


def _read_cpu_governors(root: Path) -> dict:
    base = root / "sys/devices/system/cpu"
    cpus = [n for n in _listdir(base) or [] if re.fullmatch(r"cpu\d+", n)]
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


# --- fabric manager ------------------------------------------------------------------


def systemctl_is_active(unit: str, environ: Mapping[str, str], timeout_s: float = SYSTEMCTL_TIMEOUT_S) -> dict:
    """Ask `systemctl is-active UNIT`, finding systemctl on environ's PATH."""
    search = environ.get("PATH", os.defpath)
    exe = shutil.which("systemctl", path=search)
    if not exe:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": None,
            "reason": f"systemctl not found on PATH ({search})",
        }
    cmd = [exe, "is-active", unit]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env={"PATH": search, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": cmd,
            "reason": f"{' '.join(cmd)} gave no answer within {timeout_s} s",
        }
    except OSError as exc:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": cmd,
            "reason": f"{' '.join(cmd)} could not run: {exc.strerror or exc}",
        }
    lines = proc.stdout.strip().splitlines()
    return {
        "asked": True,
        "state": lines[0].strip() if lines else None,
        "rc": proc.returncode,
        "command": cmd,
        "stderr": proc.stderr.strip()[-500:] or None,
        "reason": None if lines else f"{' '.join(cmd)} printed nothing (rc {proc.returncode})",
    }


def _read_fabricmanager(pci: list[dict], environ: Mapping[str, str]) -> dict:
    if not any(d["kind"] == "nvswitch" for d in pci):
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": None,
            "reason": "no NVSwitch on the PCI bus; fabric manager not needed",
        }
    return systemctl_is_active(FABRICMANAGER_UNIT, environ)


# --- NCCL ------------------------------------------------------------------------------


def parse_nccl_conf(text: str) -> tuple[dict, list[dict]]:
    """NAME=VALUE lines the way NCCL reads them: split at the first '=', no trimming.

    Returns (values, ignored_lines). NCCL keeps spaces in names and values, so a
    line like 'NCCL_X = 1' sets a variable NCCL never looks up; those are
    reported as ignored with the reason.
    """
    values, ignored = {}, []
    for num, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            ignored.append({"line": num, "text": line, "reason": "no '=': NCCL skips it"})
        elif name != name.strip() or not name:
            ignored.append({"line": num, "text": line, "reason": "spaces around the name: NCCL reads a different name"})
        else:
            values.setdefault(name, value)  # NCCL's setenv(..., 0): the first line wins
    return values, ignored


def _read_nccl(root: Path, environ: Mapping[str, str]) -> dict:
    # NCCL_VERSION is what NVIDIA's container images set to name the package, not a setting NCCL reads.
    env = {k: v for k, v in environ.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}
    conf_path = root / "etc/nccl.conf"
    text, reason = read_text(conf_path)
    values, ignored = parse_nccl_conf(text) if text is not None else ({}, [])
    effective = {k: {"value": v, "source": str(conf_path)} for k, v in values.items()}
    effective.update({k: {"value": v, "source": "environment"} for k, v in env.items()})  # env wins, as in NCCL
    net = root / "sys/class/net"
    interfaces = {name: read_text(net / name / "operstate")[0] for name in _listdir(net) or []}
    return {
        "env": env,
        "conf": {
            "path": str(conf_path),
            "present": text is not None,
            "values": values,
            "ignored_lines": ignored,
            "reason": reason,
        },
        "effective": effective,
        "interfaces": interfaces,
        "interfaces_path": str(net),
        "not_read": "~/.nccl.conf of the job's user (sits between the environment and /etc/nccl.conf)",
    }


# --- bringup record ---------------------------------------------------------------------

# Written by bringup.yml (module gpufleet.cluster.bringup_record): role -> the
# settings it applied and how to tell they still hold.
BRINGUP_RECORD = "etc/gpufleet/bringup.json"


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _sha256(path: Path) -> tuple[str | None, str | None]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest(), None
    except FileNotFoundError:
        return None, f"{path}: not present"
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def bringup_expectation(root: Path, item: Any) -> dict:
    """What one expectation of the record finds on the node now.

    An expectation names a file (`path`) or a set of files (`glob`) and what
    bringup left there: `sha256` of the content, the stripped text `value`, or
    whether it `exists`. `found` is the same kind of thing read now; whether it
    still holds is the check's business.
    """
    if not isinstance(item, dict):
        return {"what": str(item), "found": None, "found_reason": "expectation is not a mapping"}
    out = {k: item[k] for k in ("what", "path", "glob", "sha256", "value", "exists") if k in item}
    out.setdefault("what", item.get("path") or item.get("glob") or "?")
    where = item.get("glob") or item.get("path")
    if not isinstance(where, str) or not where.startswith("/"):
        return out | {"found": None, "found_reason": f"expectation has no absolute 'path' or 'glob': {where!r}"}
    if "glob" in item:
        values: dict[str, int] = {}
        matched = sorted(glob.glob(str(_under(root, where))))
        for name in matched:
            text, reason = read_text(Path(name))
            key = text if text is not None else f"unreadable ({reason})"
            values[key] = values.get(key, 0) + 1
        return out | {"found": values, "found_reason": None if matched else f"no file matches {_under(root, where)}"}
    path = _under(root, where)
    if "sha256" in item:
        found, reason = _sha256(path)
    elif "exists" in item:
        found, reason = os.path.lexists(path), None  # an enabled unit is a symlink to an absolute path
    elif "value" in item:
        found, reason = read_text(path)
    else:
        found, reason = None, "expectation has none of sha256, value, exists"
    return out | {"found": found, "found_reason": reason}


def _read_bringup(root: Path) -> dict:
    path = root / BRINGUP_RECORD
    out: dict[str, Any] = {"path": str(path), "present": False, "readable": False, "reason": None, "roles": {}}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out | {"reason": f"{path}: not present"}
    except OSError as exc:
        return out | {"present": True, "reason": f"{path}: {exc.strerror or exc}"}
    out["present"] = True
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return out | {"reason": f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}"}
    if not isinstance(doc, dict) or not isinstance(doc.get("roles"), dict):
        return out | {"reason": f"{path}: expected an object with a 'roles' mapping"}
    roles = {}
    for role, entry in sorted(doc["roles"].items()):
        entry = entry if isinstance(entry, dict) else {}
        expect = entry.get("expect") if isinstance(entry.get("expect"), list) else []
        roles[role] = {
            "applied_at": entry.get("applied_at"),
            "settings": entry.get("settings") or {},
            "expect": [bringup_expectation(root, item) for item in expect],
        }
    return out | {"readable": True, "schema_version": doc.get("schema_version"), "roles": roles}


# --- top level -------------------------------------------------------------------------


def read_boot_id(root: str = "/") -> tuple[str | None, str | None]:
    """(this boot's id, None) or (None, reason): counters read in two boots cannot be subtracted."""
    return read_text(Path(root) / "proc/sys/kernel/random/boot_id")


def os_pretty_name(root: Path) -> tuple[str | None, str | None]:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        text, reason = read_text(root / rel)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "PRETTY_NAME":
                return val.strip().strip("\"'"), None
        return None, f"{root / rel}: no PRETTY_NAME"
    return None, f"{root / 'etc/os-release'}: not present"


def read(root: str = "/", environ: Mapping[str, str] | None = None) -> dict:
    """All host readings under `root`; never raises.

    `environ` (default os.environ) supplies the NCCL_* variables and the PATH on
    which systemctl is looked up, so a test can hand in a PATH holding a tiny
    systemctl of its own.
    """
    environ = os.environ if environ is None else environ
    rootp = Path(root)
    real_root = os.path.realpath(root) == "/"
    out: dict[str, Any] = {"root": str(rootp), "is_root": os.geteuid() == 0, "errors": []}

    def section(name: str, fn: Callable[[], Any], empty: Any) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # one broken section must not hide the others
            out[name] = empty
            out["errors"].append({"section": name, "reason": f"{type(exc).__name__}: {exc}"})

    if real_root:
        out["kernel"] = os.uname().release
    else:
        out["kernel"], reason = read_text(rootp / "proc/sys/kernel/osrelease")
        if reason:
            out["errors"].append({"section": "kernel", "reason": reason})
    out["os"], reason = os_pretty_name(rootp)
    if reason:
        out["errors"].append({"section": "os", "reason": reason})
    out["boot_id"], _ = read_boot_id(root)  # None where absent (a test tree); the counter snapshots say why
    section("pci", lambda: _read_pci(rootp), [])
    pci = out["pci"]
    section("acs", lambda: _read_acs(rootp, pci), [])
    section("infiniband", lambda: _read_infiniband(rootp), {"present": False, "ports": [], "reason": "crashed"})
    section("aer", lambda: read_aer(rootp, pci, _hca_bdfs(out["infiniband"])), {"present": False, "devices": [], "reason": "crashed"})
    section("modules", lambda: _read_modules(rootp), {"readable": False, "loaded": {}, "reason": "crashed"})
    section("iommu", lambda: _read_iommu(rootp, pci), {})
    section("numa", lambda: _read_numa(rootp), {})
    section("cpu_governors", lambda: _read_cpu_governors(rootp), {})
    section("fabricmanager", lambda: _read_fabricmanager(pci, environ), {})
    section("nccl", lambda: _read_nccl(rootp, environ), {})
    section(
        "bringup",
        lambda: _read_bringup(rootp),
        {"present": True, "readable": False, "roles": {}, "reason": "reading the record crashed (see errors)"},
    )
    if not pci:
        out["errors"].append({"section": "pci", "reason": f"{rootp / 'sys/bus/pci/devices'}: no PCI devices listed"})
    return out
