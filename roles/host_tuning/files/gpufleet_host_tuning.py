# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Runtime host tuning for GPU nodes: what does not survive a reboot.

Installed by the gpufleet host_tuning role and run by it once, then at every
boot by gpufleet-host-tuning.service:

    python3 gpufleet_host_tuning.py --acs-off --governor performance \\
        --sysctl kernel.numa_balancing=0 [--root /] [--check]

--acs-off       clears the PCIe ACS control register of every bridge above an
                NVIDIA GPU or a network/InfiniBand controller, found through
                sysfs the way gpufleet's collect/host/pci.py finds them (with ACS
                P2P redirect on, GPU-GPU and GPU-NIC traffic detours through
                the root complex). Written through the device's sysfs config
                file, the way `setpci -s BDF ECAP_ACS+6.w=0` does.
--governor G    sets every CPU's cpufreq scaling governor to G.
--sysctl K=V    sets /proc/sys/K (dots as slashes) to V.
--root R        reads and writes under R instead of / (tests use a fake tree).
--check         says what it would change and changes nothing.

Prints one JSON object: {"root", "check", "changed": [...], "held": n,
"skipped": [...], "errors": [...]}; exits 1 when anything could not be done.
Standard library only: it runs at boot, before any environment exists.
"""

import argparse
import glob
import json
import os
import re
import struct
import sys

NVIDIA = "0x10de"
ACS_CAP_ID = 0x000D
ACS_CTRL_OFFSET = 6  # ACS control register, from the start of the ACS extended capability
_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def read_text(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def pci_kind(vendor, pci_class):
    base = (pci_class or "").lower()[:6]
    if vendor == NVIDIA and base in ("0x0300", "0x0302"):
        return "gpu"
    if base in ("0x0200", "0x0207"):  # Ethernet or InfiniBand controller
        return "nic"
    if base == "0x0604":
        return "bridge"
    return "other"


def upstream_chain(resolved_path):
    """Bridge BDFs above a device, from its resolved sysfs path (as collect/host/pci.py does)."""
    parts = resolved_path.split("/")
    start = next((i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p), None)
    if start is None:
        return []
    return [p for p in parts[start + 1:-1] if _BDF.match(p)]


def bridges_above_gpus_and_nics(root):
    """{bridge bdf: [(kind, bdf) of the GPUs and NICs below it]}."""
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    kinds = {}
    chains = {}
    for bdf in names:
        devdir = os.path.join(base, bdf)
        kinds[bdf] = pci_kind(read_text(os.path.join(devdir, "vendor")), read_text(os.path.join(devdir, "class")))
        chains[bdf] = upstream_chain(os.path.realpath(devdir))
    below = {}
    for bdf, kind in kinds.items():
        if kind not in ("gpu", "nic"):
            continue
        for up in chains[bdf]:
            if kinds.get(up) == "bridge":
                below.setdefault(up, []).append((kind, bdf))
    return below


def acs_control_offset(data):
    """Offset of the ACS control register in config space bytes, or None without an ACS capability."""
    off, seen = 0x100, set()
    while 0x100 <= off <= len(data) - 4 and off not in seen:
        seen.add(off)
        header = struct.unpack_from("<I", data, off)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return off + ACS_CTRL_OFFSET if off + ACS_CTRL_OFFSET + 2 <= len(data) else None
        off = (header >> 20) & 0xFFC
    return None


def acs_off(root, check, report):
    below = bridges_above_gpus_and_nics(root)
    if not below:
        report["skipped"].append({"what": "pcie_acs", "reason": "no PCIe bridge above a GPU or NIC"})
        return
    for bridge in sorted(below):
        config = os.path.join(root, "sys/bus/pci/devices", bridge, "config")
        what = "ACS control of %s (above %s)" % (bridge, ", ".join("%s %s" % kb for kb in below[bridge]))
        try:
            with open(config, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            report["errors"].append({"what": what, "path": config, "reason": exc.strerror or str(exc)})
            continue
        if len(data) <= 64:
            report["errors"].append({"what": what, "path": config, "reason": "needs root to read extended config space"})
            continue
        if len(data) <= 0x100:
            report["skipped"].append({"what": what, "path": config,
                                      "reason": "only 256 bytes of config space: extended config (ECAM) not accessible"})
            continue
        offset = acs_control_offset(data)
        if offset is None:
            report["held"] += 1  # no ACS capability: nothing to redirect
            continue
        ctrl = struct.unpack_from("<H", data, offset)[0]
        if ctrl == 0:
            report["held"] += 1
            continue
        report["changed"].append({"what": what, "path": config, "offset": "0x%03x" % offset,
                                  "from": "0x%04x" % ctrl, "to": "0x0000"})
        if check:
            continue
        try:
            with open(config, "r+b") as handle:
                handle.seek(offset)
                handle.write(b"\0\0")
        except OSError as exc:
            report["changed"].pop()
            report["errors"].append({"what": what, "path": config, "reason": exc.strerror or str(exc)})


def set_value(path, value, what, check, report):
    current = read_text(path)
    if current is None:
        report["skipped"].append({"what": what, "path": path, "reason": "not present"})
        return
    if current == value:
        report["held"] += 1
        return
    report["changed"].append({"what": what, "path": path, "from": current, "to": value})
    if check:
        return
    try:
        with open(path, "w") as handle:
            handle.write(value + "\n")
    except OSError as exc:
        report["changed"].pop()
        report["errors"].append({"what": what, "path": path, "reason": exc.strerror or str(exc)})


def governor(root, wanted, check, report):
    paths = sorted(glob.glob(os.path.join(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")))
    if not paths:
        report["skipped"].append({"what": "cpu governor", "reason": "no CPU frequency scaling exposed (cpufreq absent)"})
        return
    for path in paths:
        offered = read_text(os.path.join(os.path.dirname(path), "scaling_available_governors"))
        cpu = path.split("/")[-3]
        if offered is not None and wanted not in offered.split():
            report["errors"].append({"what": "%s governor" % cpu, "path": path,
                                     "reason": "governor %s not offered (available: %s)" % (wanted, offered)})
            continue
        set_value(path, wanted, "%s governor" % cpu, check, report)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", default="/")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--acs-off", action="store_true")
    parser.add_argument("--governor", default="")
    parser.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    for item in args.sysctl:
        if not re.match(r"^[a-z0-9_.]+=\S+$", item):
            parser.error("--sysctl %r: expected KEY=VALUE, for example kernel.numa_balancing=0" % item)
    return args


def main(argv=None):
    args = parse_args(argv)
    report = {"root": args.root, "check": args.check, "changed": [], "held": 0, "skipped": [], "errors": []}
    if args.acs_off:
        acs_off(args.root, args.check, report)
    if args.governor:
        governor(args.root, args.governor, args.check, report)
    for item in args.sysctl:
        key, value = item.split("=", 1)
        set_value(os.path.join(args.root, "proc/sys", key.replace(".", "/")), value, key, args.check, report)
    print(json.dumps(report, indent=1, sort_keys=True))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
