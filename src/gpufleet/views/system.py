"""What `gpufleet hw` reads beyond collect/: CPUs, NUMA nodes and memory (procfs, sysfs), the NVIDIA PCI
devices and the NUMA node of each, InfiniBand HCAs and their ports, the kernel, and the torch, CUDA and NCCL
versions the engine's Python sees.

read(root) never raises and reads every path under `root`, so tests point it at a fake tree. A value that
could not be read is None and named in "unreadable" ({dotted key: reason}).

    {"root": "/", "kernel": "6.8.0-49-generic", "os": "Ubuntu 22.04.5 LTS",
     "cpu": {"model", "vendor", "sockets", "cores", "threads"},
     "memory": {"total_mib", "available_mib"},
     "numa": [{"node", "cpulist", "cpu_count", "memory_total_mib"}],
     "pci": {"gpus": [{"bdf", "device", "driver", "numa_node"}], "nvswitches": [same]},
     "infiniband": {"present", "reason", "hcas": [{"name", "pci_bdf", "numa_node", "fw_ver", "board_id", "hca_type",
                    "ports": [{"port", "state", "phys_state", "rate_gbps", "rate", "link_layer"}]}]},
     "fabric": collect.host.read_fabric(root): {"infiniband" (each port's counters), "aer"},
     "unreadable": {"cpu.model": "...", ...}}

toolkit() (separate: it imports torch, which takes seconds) gives
    {"torch_version", "torch_cuda_version", "nccl_version", "nccl_source", "unreadable"}
nccl_source: "torch.cuda.nccl.version()" or "<path of libnccl>, found by the dynamic loader".
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Any

from gpufleet.collect.host import os_pretty_name, parse_int, pci_kind, read_fabric, read_ib_port, read_text
from gpufleet.collect.software import nccl_version_text

KIB = 1024


def _listdir(path: Path) -> tuple[list[str], str | None]:
    try:
        return sorted(os.listdir(path)), None
    except FileNotFoundError:
        return [], f"{path}: not present"
    except OSError as exc:
        return [], f"{path}: {exc.strerror or exc}"


def _node_key(name: str) -> int:
    return int(name[4:]) if name[4:].isdigit() else 1 << 30


def cpulist_count(cpulist: str | None) -> int | None:
    """'0-55,112-167' -> 112; '' -> 0 (a memory-only NUMA node); garbage -> None."""
    if cpulist is None:
        return None
    count = 0
    for part in filter(None, cpulist.strip().split(",")):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        count += int(hi) - int(lo) + 1 if hi else 1
    return count


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical CPU (blocks separated by blank lines)."""
    cpus, block = [], {}
    for line in text.splitlines():
        if not line.strip():
            if block:
                cpus.append(block)
            block = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            block.setdefault(key.strip(), value.strip())
    if block:
        cpus.append(block)
    return [c for c in cpus if "processor" in c]


def _sysfs_topology(root: Path) -> tuple[set, set, int]:
    """(packages, (package, core) pairs, logical CPUs) from sys/devices/system/cpu/cpu*/topology."""
    base = root / "sys/devices/system/cpu"
    names, _ = _listdir(base)
    packages, cores, threads = set(), set(), 0
    for name in names:
        if not re.fullmatch(r"cpu\d+", name):
            continue
        pkg = parse_int(read_text(base / name / "topology/physical_package_id")[0])
        core = parse_int(read_text(base / name / "topology/core_id")[0])
        if pkg is None or core is None:
            continue
        threads += 1
        packages.add(pkg)
        cores.add((pkg, core))
    return packages, cores, threads


def read_cpu(root: Path, unreadable: dict) -> dict:
    out: dict[str, Any] = {"model": None, "vendor": None, "sockets": None, "cores": None, "threads": None}
    path = root / "proc/cpuinfo"
    text, reason = read_text(path)
    cpus = parse_cpuinfo(text) if text is not None else []
    if cpus:
        first = cpus[0]
        # x86 names the model; some Arm kernels give only implementer/part numbers.
        out["model"] = first.get("model name") or first.get("Model") or first.get("cpu model")
        out["vendor"] = first.get("vendor_id") or first.get("CPU implementer")
        out["threads"] = len(cpus)
        if all("physical id" in c and "core id" in c for c in cpus):
            out["sockets"] = len({c["physical id"] for c in cpus})
            out["cores"] = len({(c["physical id"], c["core id"]) for c in cpus})
    elif text is not None:
        reason = f"{path}: no processor entries"
    if out["sockets"] is None:  # Arm and some VMs: the topology in sysfs
        packages, cores, threads = _sysfs_topology(root)
        if packages:
            out["sockets"], out["cores"] = len(packages), len(cores)
            out["threads"] = out["threads"] or threads
    topology = root / "sys/devices/system/cpu"
    for key in out:
        if out[key] is None:
            unreadable[f"cpu.{key}"] = reason or (
                f"{path} names no {key}"
                if key in ("model", "vendor")
                else f"neither {path} (physical id, core id) nor {topology}/cpu*/topology gives it"
            )
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """'MemTotal:  263856404 kB' (or the per-node 'Node 0 MemTotal: ...') -> {"MemTotal": bytes}."""
    out = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        words = rest.split()
        if words and words[0].isdigit():
            scale = KIB if len(words) > 1 and words[1].lower() == "kb" else 1
            out[key.split()[-1]] = int(words[0]) * scale
    return out


def read_memory(root: Path, unreadable: dict) -> dict:
    path = root / "proc/meminfo"
    text, reason = read_text(path)
    values = parse_meminfo(text) if text is not None else {}
    out = {}
    for key, name in (("total_mib", "MemTotal"), ("available_mib", "MemAvailable")):
        out[key] = values[name] // (KIB * KIB) if name in values else None
        if out[key] is None:
            unreadable[f"memory.{key}"] = reason or f"{path}: no {name}"
    return out


def read_numa(root: Path, unreadable: dict) -> list[dict]:
    base = root / "sys/devices/system/node"
    names, reason = _listdir(base)
    nodes = []
    for name in sorted((n for n in names if re.fullmatch(r"node\d+", n)), key=_node_key):
        node = int(name[4:])
        cpulist, cpu_reason = read_text(base / name / "cpulist")
        meminfo, mem_reason = read_text(base / name / "meminfo")
        total = parse_meminfo(meminfo).get("MemTotal") if meminfo is not None else None
        entry = {
            "node": node,
            "cpulist": cpulist,
            "cpu_count": cpulist_count(cpulist),
            "memory_total_mib": total // (KIB * KIB) if total is not None else None,
        }
        if cpulist is None:
            unreadable[f"numa.{node}.cpulist"] = cpu_reason
        if total is None:
            unreadable[f"numa.{node}.memory_total_mib"] = mem_reason or f"{base / name / 'meminfo'}: no MemTotal"
        nodes.append(entry)
    if not nodes:
        unreadable["numa"] = reason or f"{base}: no node* entries"
    return nodes


def pci_numa_node(root: Path, bdf: str | None) -> tuple[int | None, str | None]:
    """The NUMA node sysfs gives a PCI device; (None, reason) where it gives none (-1) or cannot be read."""
    if not bdf:
        return None, "no PCI bus id"
    path = root / "sys/bus/pci/devices" / bdf / "numa_node"
    text, reason = read_text(path)
    if text is None:
        return None, reason
    value = parse_int(text)
    if value is None:
        return None, f"{path}: not a number ({text!r})"
    if value < 0:
        return None, f"{path} is {value}: the platform reports no NUMA node for this device (one-node machine or VM)"
    return value, None


def read_pci(root: Path, unreadable: dict) -> dict:
    """The NVIDIA GPUs and NVSwitches on the PCI bus, whether or not a driver has them."""
    base = root / "sys/bus/pci/devices"
    names, reason = _listdir(base)
    out: dict[str, list] = {"gpus": [], "nvswitches": []}
    for bdf in names:
        vendor, cls = read_text(base / bdf / "vendor")[0], read_text(base / bdf / "class")[0]
        kind = pci_kind(vendor, cls)
        if kind not in ("gpu", "nvswitch"):
            continue
        driver = os.path.basename(os.readlink(base / bdf / "driver")) if (base / bdf / "driver").is_symlink() else None
        numa, numa_reason = pci_numa_node(root, bdf)
        if numa_reason:
            unreadable[f"pci.{bdf}.numa_node"] = numa_reason
        out[f"{kind}s" if kind == "gpu" else "nvswitches"].append(
            {"bdf": bdf, "device": read_text(base / bdf / "device")[0], "driver": driver, "numa_node": numa}
        )
    if reason:
        unreadable["pci"] = reason
    return out


def read_infiniband(root: Path, unreadable: dict) -> dict:
    base = root / "sys/class/infiniband"
    names, reason = _listdir(base)
    if reason:
        return {"present": False, "reason": reason, "hcas": []}
    hcas = []
    for name in names:
        hdir = base / name
        device = hdir / "device"
        bdf = os.path.basename(os.path.realpath(device)) if device.exists() else None
        numa, numa_reason = pci_numa_node(root, bdf) if bdf else (None, f"{device}: not present")
        if numa is None:
            unreadable[f"infiniband.{name}.numa_node"] = numa_reason
        ports = [read_ib_port(hdir / "ports" / port) for port in _listdir(hdir / "ports")[0]]
        hcas.append(
            {
                "name": name,
                "pci_bdf": bdf,
                "numa_node": numa,
                "fw_ver": read_text(hdir / "fw_ver")[0],
                "board_id": read_text(hdir / "board_id")[0],
                "hca_type": read_text(hdir / "hca_type")[0],
                "ports": ports,
            }
        )
    # present: an InfiniBand device is; a class folder with none in it (ib_core loaded, no HCA) is not that.
    return {"present": bool(hcas), "reason": None if hcas else f"{base} is empty", "hcas": hcas}


def read(root: str = "/") -> dict:
    """The host side of `gpufleet hw` under `root`; never raises."""
    rootp = Path(root)
    unreadable: dict[str, str] = {}
    out: dict[str, Any] = {"root": str(rootp)}
    if os.path.realpath(root) == "/":
        out["kernel"] = os.uname().release
    else:
        out["kernel"], reason = read_text(rootp / "proc/sys/kernel/osrelease")
        if reason:
            unreadable["kernel"] = reason
    out["os"], reason = os_pretty_name(rootp)
    if reason:
        unreadable["os"] = reason
    for key, fn, empty in (
        ("cpu", read_cpu, {}),
        ("memory", read_memory, {}),
        ("numa", read_numa, []),
        ("pci", read_pci, {"gpus": [], "nvswitches": []}),
        ("infiniband", read_infiniband, {"present": False, "reason": None, "hcas": []}),
    ):
        try:
            out[key] = fn(rootp, unreadable)
        except Exception as exc:  # one broken section must not hide the others
            out[key] = empty
            unreadable[key] = f"reading it failed: {type(exc).__name__}: {exc}"
    out["fabric"] = read_fabric(root)  # never raises
    out["unreadable"] = unreadable
    return out


# --- torch, CUDA, NCCL --------------------------------------------------------------------------


def _loaded_path(fragment: str) -> str | None:
    """Path of a shared library this process has mapped (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if fragment in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def _nccl_from_loader() -> tuple[str | None, str | None, str | None]:
    """(version, source, None) from the libnccl the dynamic loader finds, or (None, None, reason)."""
    errors = []
    for soname in ("libnccl.so.2", "libnccl.so"):
        try:
            lib = ctypes.CDLL(soname)
        except OSError as exc:
            errors.append(str(exc))
            continue
        code = ctypes.c_int(0)
        try:
            rc = lib.ncclGetVersion(ctypes.byref(code))
        except AttributeError:
            return None, None, f"{soname} has no ncclGetVersion"
        if rc != 0:
            return None, None, f"{soname}: ncclGetVersion returned {rc}"
        return nccl_version_text(code.value), f"{_loaded_path('libnccl') or soname}, found by the dynamic loader", None
    return None, None, "; ".join(errors)


def toolkit() -> dict:
    """torch, its CUDA and NCCL: torch.cuda.nccl.version() when torch imports, else the libnccl the dynamic
    loader finds, else None with both reasons. Never raises."""
    out: dict[str, Any] = {
        "torch_version": None,
        "torch_cuda_version": None,
        "nccl_version": None,
        "nccl_source": None,
        "unreadable": {},
    }
    unreadable = out["unreadable"]
    torch_reason = None
    try:
        import torch

        out["torch_version"] = str(torch.__version__)
        out["torch_cuda_version"] = torch.version.cuda
        if out["torch_cuda_version"] is None:
            unreadable["torch_cuda_version"] = f"torch {torch.__version__} is a build without CUDA"
        try:
            out["nccl_version"] = nccl_version_text(torch.cuda.nccl.version())
            out["nccl_source"] = "torch.cuda.nccl.version()"
        except Exception as exc:  # a CPU build has no NCCL
            torch_reason = f"torch {torch.__version__} gives no NCCL version ({type(exc).__name__}: {exc})"
    except Exception as exc:  # ImportError, or a broken install
        torch_reason = f"torch does not import ({type(exc).__name__}: {exc})"
        unreadable["torch_version"] = unreadable["torch_cuda_version"] = torch_reason
    if out["nccl_version"] is None:
        try:
            version, source, loader_reason = _nccl_from_loader()
        except Exception as exc:
            version, source, loader_reason = None, None, f"{type(exc).__name__}: {exc}"
        if version is not None:
            out["nccl_version"], out["nccl_source"] = version, source
        else:
            unreadable["nccl_version"] = f"{torch_reason}; no libnccl found by the dynamic loader: {loader_reason}"
    return out
