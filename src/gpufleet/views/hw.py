"""`gpufleet hw`: this node's hardware, from NVML, sysfs and procfs (never a tool's output).

    gpufleet hw [--root DIR] [--json] [--readings FILE]

Plain text by default, `--json` for the document. `--root` reads sysfs/procfs under DIR (tests);
`--readings` takes the GPUs from a `gpufleet collect` recording instead of NVML.

    {"schema_version": 1, "view": "hw", "host", "read_at", "root", "kernel", "os",
     "cpu": {"model", "vendor", "sockets", "cores", "threads"},
     "memory": {"total_mib", "available_mib"},
     "numa": [{"node", "cpulist", "cpu_count", "memory_total_mib"}],
     "nvml": {"available": bool, "error": str|null, "source": "nvml" | "recording <file>"},
     "gpus": [{"index", "name", "serial", "uuid", "vbios_version", "inforom_image_version", "memory_total_mib", "pci_bus_id",
               "pcie": {"gen_current", "gen_max", "gen_gpu_max", "width_current", "width_max"},
               "numa_node",
               "nvlink": {"links_active", "links": [{"link", "remote_pci_bus_id", "remote_kind", "remote_gpu"}],
                          "reaches": [{"to", "remote_kind", "remote_gpu", "links": [int]}]},
               "unreadable": {field: reason}}],
     "pci_gpus": [{"bdf", "device", "driver", "numa_node"}],      NVIDIA GPUs on the PCI bus (sysfs)
     "nvswitches": [{"bdf", "device", "driver", "numa_node"}],
     "infiniband": {"present", "reason", "hcas": [{"name", "pci_bdf", "numa_node", "fw_ver", "board_id", "hca_type",
                    "ports": [{"port", "state", "phys_state", "rate_gbps", "rate", "link_layer"}]}]},
     "port_errors": {"mlx5_0/1": {counter: n}},   each port's error counters that are not 0 (counters/, hw_counters/)
     "aer": {"present", "reason", "devices": [{"bdf", "role", "below", "correctable", "nonfatal", "fatal", "reason"}]},
                                    AER counts since boot of every GPU, HCA and bridge between each and its root port
     "versions": {"driver", "cuda_driver", "nvml", "torch", "torch_cuda", "nccl", "nccl_source", "kernel", "os"},
     "software": collect.software.read(): OFED, rdma-core, every libnccl the loader finds, the NCCL net plugin,
     "unreadable": {dotted key: reason}}

remote_kind is "gpu" (remote_gpu is its NVML index when it is a GPU of this node), "switch" (an NVSwitch),
"ibmnpu" or "unknown"; it comes from NVML's remote device type where that was read, else from the remote PCI
bus id (a GPU of this node, an NVSwitch on this node's PCI bus).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

from gpufleet import collect
from gpufleet.base import schema
from gpufleet.collect import nvml, software
from gpufleet.base.errors import InputError
from gpufleet.views import gpu as gpu_reads
from gpufleet.views import system
from gpufleet.views.status import index_ranges

_GPU_KEYS = (
    "index",
    "name",
    "serial",
    "uuid",
    "vbios_version",
    "inforom_image_version",
    "memory_total_mib",
    "pci_bus_id",
    "pcie",
)
_GPU_UNREADABLE = ("handle", *_GPU_KEYS[1:], "nvlink")


def _remote(bus: str | None, nvml_kind: str | None, gpu_by_bus: dict, switch_buses: set) -> tuple[str, int | None]:
    if bus in gpu_by_bus:
        return "gpu", gpu_by_bus[bus]
    if nvml_kind:
        return nvml_kind, None
    if bus in switch_buses:
        return "switch", None
    return "unknown", None


def _reach_label(kind: str, remote_gpu: int | None, bus: str | None, switch_buses: set) -> str:
    if remote_gpu is not None:
        return f"GPU{remote_gpu}"
    if kind == "switch":
        return f"NVSwitch {bus}" if bus in switch_buses else "NVSwitch"
    if kind == "gpu":
        return f"GPU at {bus} (not one of this node's)"
    return f"{kind} device at {bus or 'unknown bus id'}"


def _nvlink(g: dict, types: dict, gpu_by_bus: dict, switch_buses: set, unreadable: dict) -> dict:
    src = g.get("nvlink")
    if src is None:
        return {"links_active": None, "links": [], "reaches": []}
    links, reaches = [], {}
    for link in src:
        if not link.get("active"):
            continue
        bus = link.get("remote_pci_bus_id")
        kind, remote_gpu = _remote(bus, types.get(link["link"]), gpu_by_bus, switch_buses)
        links.append({"link": link["link"], "remote_pci_bus_id": bus, "remote_kind": kind, "remote_gpu": remote_gpu})
        label = _reach_label(kind, remote_gpu, bus, switch_buses)
        entry = reaches.setdefault(label, {"to": label, "remote_kind": kind, "remote_gpu": remote_gpu, "links": []})
        entry["links"].append(link["link"])
    if not src and "nvlink" not in unreadable:
        unreadable["nvlink"] = "no NVLink"
    return {"links_active": len(links), "links": links, "reaches": list(reaches.values())}


def build(
    nvml_reading: dict,
    system_reading: dict,
    toolkit: dict,
    remote_types: dict | None = None,
    *,
    source: str = "nvml",
    host: str | None = None,
    software_reading: dict | None = None,
) -> dict:
    """The hw document from readings: collect.nvml.read() (or a recording), system.read(), system.toolkit(),
    and optionally views.gpu.nvlink_remote_types() and collect.software.read()."""
    unreadable = dict(system_reading.get("unreadable") or {})
    pci = system_reading.get("pci") or {}
    switch_buses = {s["bdf"] for s in pci.get("nvswitches") or []}
    pci_gpus = {d["bdf"]: d for d in pci.get("gpus") or []}
    src_gpus = nvml_reading.get("gpus") or []
    gpu_by_bus = {g["pci_bus_id"]: g["index"] for g in src_gpus if g.get("pci_bus_id")}
    gpus = []
    for g in src_gpus:
        src_unreadable = g.get("unreadable") or {}
        out = {key: g.get(key) for key in _GPU_KEYS}
        out["unreadable"] = gpu_unreadable = {  # what this view shows; not the error counters
            k: v
            for k, v in src_unreadable.items()
            if k.split(".")[0] in _GPU_UNREADABLE and not k.startswith("nvlink.errors")
        }
        bus = g.get("pci_bus_id")
        out["numa_node"] = pci_gpus[bus]["numa_node"] if bus in pci_gpus else None
        reason = unreadable.pop(f"pci.{bus}.numa_node", None)
        if out["numa_node"] is None:
            gpu_unreadable["numa_node"] = reason or (
                f"{bus} is not under {Path(system_reading.get('root', '/')) / 'sys/bus/pci/devices'}"
                if bus
                else "no PCI bus id"
            )
        out["nvlink"] = _nvlink(g, (remote_types or {}).get(g["index"], {}), gpu_by_bus, switch_buses, gpu_unreadable)
        gpus.append(out)
    tk = toolkit or {}
    versions = {
        "driver": nvml_reading.get("driver_version"),
        "cuda_driver": nvml_reading.get("cuda_driver_version"),
        "nvml": nvml_reading.get("nvml_version"),
        "torch": tk.get("torch_version"),
        "torch_cuda": tk.get("torch_cuda_version"),
        "nccl": tk.get("nccl_version"),
        "nccl_source": tk.get("nccl_source"),
        "kernel": system_reading.get("kernel"),
        "os": system_reading.get("os"),
    }
    nvml_error = (
        nvml_reading.get("error")
        if nvml_reading.get("available")
        else (nvml_reading.get("error") or "NVML is not available")
    )
    for key, name in (("driver", "driver_version"), ("cuda_driver", "cuda_driver_version"), ("nvml", "nvml_version")):
        if versions[key] is None:
            unreadable[f"versions.{key}"] = (nvml_reading.get("unreadable") or {}).get(name) or nvml_error or "not read"
    for key, name in (("torch", "torch_version"), ("torch_cuda", "torch_cuda_version"), ("nccl", "nccl_version")):
        if versions[key] is None:
            unreadable[f"versions.{key}"] = (tk.get("unreadable") or {}).get(name) or "not read"
    fabric = system_reading.get("fabric") or {}
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "view": "hw",
        "host": host or socket.gethostname(),
        "read_at": schema.utc_now(),
        "root": system_reading.get("root"),
        "kernel": system_reading.get("kernel"),
        "os": system_reading.get("os"),
        "cpu": system_reading.get("cpu") or {},
        "memory": system_reading.get("memory") or {},
        "numa": system_reading.get("numa") or [],
        "nvml": {"available": bool(nvml_reading.get("available")), "error": nvml_error, "source": source},
        "gpus": gpus,
        "pci_gpus": list(pci_gpus.values()),
        "nvswitches": pci.get("nvswitches") or [],
        "infiniband": system_reading.get("infiniband") or {"present": False, "reason": None, "hcas": []},
        "port_errors": _port_errors(fabric.get("infiniband") or {}),
        "aer": fabric.get("aer") or {"present": False, "reason": "not read", "devices": []},
        "versions": versions,
        "software": software_reading or {},
        "unreadable": unreadable,
    }


# The counters of a port that count traffic or waiting, not errors: left out of port_errors.
_TRAFFIC = re.compile(r"(_data|_packets|_pkts|_requests|_wait|_handled|_sent|_ignored|_marked_roce_packets|_connect)$")


def _port_errors(ib: dict) -> dict:
    return {
        f"{p.get('hca')}/{p.get('port')}": {
            n: v for n, v in sorted((p.get("counters") or {}).items()) if v and not _TRAFFIC.search(n)
        }
        for p in ib.get("ports") or []
    }


# --- text -------------------------------------------------------------------------------------------


def _v(value, fmt: str = "{}") -> str:
    return "?" if value is None else fmt.format(value)


def _gib(mib) -> str:
    return _v(None if mib is None else mib / 1024, "{:.1f} GiB")


def _pcie(p: dict | None) -> str:
    p = p or {}
    now = f"Gen{_v(p.get('gen_current'))} x{_v(p.get('width_current'))}"
    return f"{now} (max Gen{_v(p.get('gen_max'))} x{_v(p.get('width_max'))})"


def _columns(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_text(doc: dict) -> str:
    lines = []

    def row(label: str, value: str) -> None:
        lines.append(f"{label:<11}{value}".rstrip())

    root = "" if doc["root"] in ("/", None) else f", root {doc['root']}"
    row("host", f"{doc['host']}  (read {doc['read_at']}{root})")
    row("system", f"{_v(doc['os'])}, kernel {_v(doc['kernel'])}")
    cpu = doc["cpu"]
    row("CPU", f"{_v(cpu.get('sockets'))} socket(s) x {_v(cpu.get('model'))}: {_v(cpu.get('cores'))} cores, "
               f"{_v(cpu.get('threads'))} threads")  # fmt: skip
    mem = doc["memory"]
    row("memory", f"{_gib(mem.get('total_mib'))} total, {_gib(mem.get('available_mib'))} available")
    for i, node in enumerate(doc["numa"] or [None]):
        text = (
            "not read"
            if node is None
            else (
                f"node {node['node']}: CPUs {_v(node['cpulist'])} ({_v(node['cpu_count'])}), "
                f"{_gib(node['memory_total_mib'])} memory"
            )
        )
        row("NUMA" if i == 0 else "", text)
    v = doc["versions"]
    nccl = f"NCCL {_v(v['nccl'])}" + (f" (from {v['nccl_source']})" if v.get("nccl_source") else "")
    row("versions", f"driver {_v(v['driver'])}, CUDA {_v(v['cuda_driver'])} (driver), torch {_v(v['torch'])} "
                    f"(CUDA {_v(v['torch_cuda'])}), {nccl}")  # fmt: skip

    gpus = doc["gpus"]
    if gpus:
        names = sorted({g.get("name") or "?" for g in gpus})
        mems = sorted({g.get("memory_total_mib") for g in gpus}, key=lambda m: m or 0)
        row("GPUs", f"{len(gpus)} x {', '.join(names)}, {', '.join(_v(m, '{} MiB') for m in mems)} each")
        table = [["GPU", "PCI bus id", "NUMA", "PCIe now (max)", "serial", "VBIOS", "InfoROM", "UUID"]]
        for g in gpus:
            table.append([str(g["index"]), _v(g["pci_bus_id"]), _v(g["numa_node"], "{}"), _pcie(g["pcie"]),
                          _v(g["serial"]), _v(g["vbios_version"]), _v(g.get("inforom_image_version")), _v(g["uuid"])])  # fmt: skip
        lines += _columns(table)
        row("NVLink", "" if any(g["nvlink"]["links_active"] for g in gpus) else "no active NVLink")
        same: dict[str, list[int]] = {}  # GPUs reaching the same devices over the same links share a line
        for g in gpus:
            nv = g["nvlink"]
            if nv["links_active"]:
                reach = ", ".join(f"links {index_ranges(r['links'])} -> {r['to']}" for r in nv["reaches"])
                text = f"{nv['links_active']} active: {reach}"
            else:
                reason = g["unreadable"].get("nvlink")
                text = "no active link" + (f" ({reason})" if reason else "")
            same.setdefault(text, []).append(g["index"])
        for text, indices in same.items():
            lines.append(f"  GPU {index_ranges(indices)}: {text}")
    else:
        row("GPUs", f"none seen by NVML: {doc['nvml']['error'] or 'no GPU'}")
        pci_gpus = doc["pci_gpus"]
        if pci_gpus:
            row("", f"{len(pci_gpus)} NVIDIA GPU(s) on the PCI bus (sysfs):")
            for d in pci_gpus:
                lines.append(f"  {d['bdf']}  device {_v(d['device'])}  NUMA {_v(d['numa_node'])}  "
                             f"driver {d['driver'] or 'none bound'}")  # fmt: skip
        else:
            row("", "no NVIDIA GPU on the PCI bus either")
    if doc["nvswitches"]:
        row("NVSwitches", f"{len(doc['nvswitches'])} on the PCI bus: " + ", ".join(s["bdf"] for s in doc["nvswitches"]))

    ib = doc["infiniband"]
    if ib["hcas"]:
        row("HCAs", f"{len(ib['hcas'])}, {sum(len(h['ports']) for h in ib['hcas'])} port(s)")
        table = []
        for h in ib["hcas"]:
            for p in h["ports"] or [{}]:
                table.append([h["name"], _v(h["pci_bdf"]), f"NUMA {_v(h['numa_node'])}", f"fw {_v(h['fw_ver'])}",
                              f"board {_v(h.get('board_id'))}",
                              f"port {_v(p.get('port'))}", f"{_v(p.get('state'))} ({_v(p.get('phys_state'))})",
                              _v(p.get("rate_gbps"), "{} Gb/s"), _v(p.get("link_layer"))])  # fmt: skip
        lines += _columns(table)
    else:
        row("HCAs", f"none ({ib.get('reason') or 'no InfiniBand device'})")

    if doc["infiniband"]["hcas"]:
        errs = {port: c for port, c in doc["port_errors"].items() if c}
        row(
            "port errs",
            "none on any port"
            if not errs
            else "; ".join(f"{port} " + ", ".join(f"{n} {v}" for n, v in c.items()) for port, c in errs.items()),
        )
    aer = doc["aer"]
    if not aer.get("present"):
        row("PCIe AER", f"not read ({aer.get('reason')})")
    else:
        read = [d for d in aer["devices"] if d.get("correctable") is not None]
        counted = [d for d in read if any((d.get(s) or {}).get("total") for s in ("correctable", "nonfatal", "fatal"))]
        row(
            "PCIe AER",
            f"since boot, {len(read)} device(s) (GPUs, HCAs, the bridges up to their root ports): "
            + ("no error" if not counted else f"errors on {len(counted)}"),
        )
        for d in counted:
            where = f"{d['role']} {d['bdf']}" + (f" above {', '.join(d['below'])}" if d["role"] == "bridge" else "")
            sev = ", ".join(
                f"{s} {(d.get(s) or {}).get('total')}"
                + (
                    f" ({', '.join(f'{n} {c}' for n, c in (d.get(s) or {}).get('names', {}).items())})"
                    if (d.get(s) or {}).get("names")
                    else ""
                )
                for s in ("correctable", "nonfatal", "fatal")
            )
            lines.append(f"  {where}: {sev}")

    lines += _software_lines(doc.get("software") or {}, row)
    notes = [f"{k}: {r}" for k, r in sorted(doc["unreadable"].items())]
    notes += [f"GPU{g['index']} {k}: {r}" for g in gpus for k, r in sorted(g["unreadable"].items())]
    if notes:
        lines.append("not read:")
        lines += [f"  {n}" for n in notes]
    return "\n".join(lines)


def _read_or_why(part: dict, key: str = "version") -> str:
    return str(part[key]) if part.get(key) is not None else f"none ({part.get('reason') or 'not read'})"


def _software_lines(sw: dict, row) -> list[str]:
    """OFED, rdma-core, NCCL and its net plugin (collect.software); rows go through `row`, extra lines returned."""
    if not sw:
        return []
    row("OFED", f"{_read_or_why(sw.get('ofed') or {})}; rdma-core {_read_or_why(sw.get('rdma_core') or {})}")
    nccl = sw.get("nccl") or {}
    torch_nccl = nccl.get("torch") or {}
    row("NCCL", f"torch's {_read_or_why(torch_nccl)}" + (f" ({torch_nccl['path']})" if torch_nccl.get("path") else ""))
    extra = [f"  {lib['path']}: {_v(lib.get('version'))}" for lib in nccl.get("libraries") or []]
    plugin = sw.get("nccl_net_plugin") or {}
    loads = plugin.get("loads")
    row("net plugin", f"{loads['path']} (sha256 {loads.get('sha256')})" if loads else f"none ({plugin.get('reason')})")
    return extra


# --- command -------------------------------------------------------------------------------------------


def read_live(root: str) -> dict:
    """Every reading of this node, then the document."""
    nv = nvml.read()
    active = {
        g["index"]: [link["link"] for link in g.get("nvlink") or [] if link.get("active")] for g in nv.get("gpus") or []
    }
    types, _ = gpu_reads.nvlink_remote_types({i: links for i, links in active.items() if links})
    return build(nv, system.read(root), system.toolkit(), types, software_reading=software.read(root))


def cmd_hw(args) -> int:
    if not os.path.isdir(args.root):
        raise InputError(
            f"--root {args.root} is not a directory; expected the filesystem root to read sysfs/procfs under"
        )
    if args.readings:
        nv = collect.load_recording(args.readings, parts=("nvml",))["nvml"]
        doc = build(
            nv,
            system.read(args.root),
            system.toolkit(),
            source=f"recording {args.readings}",
            software_reading=software.read(args.root),
        )
    else:
        doc = read_live(args.root)
    print(json.dumps(doc, sort_keys=True) if args.json else render_text(doc))
    # The views' rule (errors.EXIT_CODES): 1 when no GPU could be read, after showing what could be, as status does.
    if doc["nvml"]["available"] and doc["gpus"]:
        return 0
    print(f"gpufleet hw: no GPU read: {doc['nvml']['error'] or 'NVML sees no GPU on this node'}", file=sys.stderr)
    return 1


def add_parser(sub) -> None:
    h = sub.add_parser("hw", help="this node's hardware: CPUs, NUMA, memory, GPUs, NVLink, HCAs, versions")
    h.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    h.add_argument("--json", action="store_true", help="print the document as JSON")
    h.add_argument("--readings", help="take the GPUs from a `gpufleet collect` recording instead of NVML")
    h.set_defaults(func=cmd_hw)
