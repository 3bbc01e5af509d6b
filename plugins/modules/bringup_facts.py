#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bringup_facts
short_description: Read what bring-up needs to know about a GPU node from sysfs and procfs
version_added: 0.1.0
description:
  - Reads, under O(root), the NVIDIA devices on the PCI bus (GPUs, NVSwitches by PCI class 0x0680), the loaded NVIDIA
    driver version (C(/sys/module/nvidia/version), else C(/proc/driver/nvidia/version)), InfiniBand HCAs with their
    ports and link layers, network interfaces, loaded kernel modules, CPU frequency governors and the sysctls the
    bring-up roles set.
  - With O(nvml_library), reads every GPU's persistence mode through NVML (C(libnvidia-ml), loaded with C(ctypes)),
    so a role can verify it where the GPUs' settings are not its to change.
  - Says whether the kernel of this node can be changed now. It cannot in a container or a chroot, or where
    C(/proc/sys) is not writable; then the roles lay down their persistent files and skip the runtime writes.
    When O(root) is not C(/) the writes go to the tree under it, which is not a kernel, so they are allowed.
  - Reads only; changes nothing. It runs on the node before the gpufleet engine is installed there, so it needs only
    the Python standard library.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
options:
  root:
    description:
      - Directory under which C(sys/) and C(proc/) are read. C(/) on a real node; tests point it at a fake tree.
    type: path
    default: /
  nvml_library:
    description:
      - The NVML library to read persistence mode through, a file name the dynamic loader finds (C(libnvidia-ml.so.1))
        or a path. Empty (the default) reads no NVML.
    type: str
    default: ""
  not_a_container:
    description:
      - The operator's word that this node runs its own kernel although it looks like a container (a microVM whose
        PID 1 is not an init, whose C(/run/systemd/container) says docker). The container signal is still returned
        in RV(container); RV(kernel) is then judged as on any node (chroot, a writable C(/proc/sys)).
    type: bool
    default: false
seealso:
  - module: gpufleet.cluster.bringup_record
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the node
  gpufleet.cluster.bringup_facts:
  register: node

- name: Say whether the node has NVSwitches
  ansible.builtin.debug:
    msg: "{{ node.pci.nvswitches | length }} NVSwitch(es)"
"""

RETURN = r"""
root:
  description: The root the readings were taken under.
  returned: always
  type: str
  sample: /
container:
  description: Whether this node runs in a container, and what said so.
  returned: always
  type: dict
  sample: {is_container: true, how: /run/systemd/container says docker}
kernel:
  description: Whether runtime kernel settings can be written now (C(touchable)), and why (C(reason)).
  returned: always
  type: dict
  sample: {touchable: false, reason: "this node is a container (/run/systemd/container says docker)"}
driver:
  description: The loaded NVIDIA driver (C(loaded), C(version), C(source) file, C(reason) when not loaded).
  returned: always
  type: dict
  sample: {loaded: true, version: 550.127.05, source: /sys/module/nvidia/version, reason: null}
pci:
  description: PCI addresses of NVIDIA GPUs (class 0x0300/0x0302) and NVSwitches (class 0x0680).
  returned: always
  type: dict
  sample: {gpus: ["0000:13:00.0"], nvswitches: ["0000:06:00.0"]}
infiniband:
  description: RDMA HCAs under C(sys/class/infiniband) with their ports (state and link layer).
  returned: always
  type: dict
  sample:
    present: true
    hcas:
      - {name: mlx5_0, link_layers: [InfiniBand], ports: [{port: 1, state: ACTIVE, link_layer: InfiniBand}]}
net:
  description: Network interfaces under C(sys/class/net) with their operstate.
  returned: always
  type: dict
  sample: {interfaces: {eth0: up, lo: unknown}}
modules:
  description: Kernel modules listed in C(proc/modules).
  returned: always
  type: dict
  sample: {readable: true, loaded: [ib_core, mlx5_core, nvidia]}
cpufreq:
  description: CPUs, whether any has cpufreq, and how many run each governor.
  returned: always
  type: dict
  sample: {present: true, cpus: 8, governors: {powersave: 8}}
cmdline:
  description: The kernel command line the node booted with (C(proc/cmdline)), null when unreadable.
  returned: always
  type: str
  sample: BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=UUID=x ro iommu=pt
persistence:
  description:
    - Persistence mode of each GPU as NVML reports it (C(read) false, with the C(reason), when NVML could not be read
      or O(nvml_library) is empty). C(bus_id) as sysfs writes it.
  returned: always
  type: dict
  sample: {read: true, reason: null, gpus: [{index: 0, bus_id: "0000:00:06.0", enabled: true}]}
sysctl:
  description: Current values of the sysctls the bring-up roles set (null where absent).
  returned: always
  type: dict
  sample: {kernel.numa_balancing: "1", vm.nr_hugepages: "0"}
"""

import ctypes
import os
import re
import subprocess

from ansible.module_utils.basic import AnsibleModule

NVIDIA = "0x10de"
SYSCTLS = ("kernel.numa_balancing", "vm.nr_hugepages")
_DRIVER_LINE = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)")


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            nvml_library=dict(type="str", default=""),
            not_a_container=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )


def text(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_pci(root):
    base = os.path.join(root, "sys/bus/pci/devices")
    gpus, switches = [], []
    for bdf in listdir(base):
        vendor = text(os.path.join(base, bdf, "vendor"))
        cls = (text(os.path.join(base, bdf, "class")) or "").lower()[:6]
        if vendor != NVIDIA:
            continue
        if cls in ("0x0300", "0x0302"):
            gpus.append(bdf)
        elif cls == "0x0680":
            switches.append(bdf)
    return {"gpus": gpus, "nvswitches": switches}


def read_driver(root):
    path = os.path.join(root, "sys/module/nvidia/version")
    version = text(path)
    if version:
        return {"loaded": True, "version": version, "source": path, "reason": None}
    proc = os.path.join(root, "proc/driver/nvidia/version")
    match = _DRIVER_LINE.search(text(proc) or "")
    if match:
        return {"loaded": True, "version": match.group(1), "source": proc, "reason": None}
    return {
        "loaded": False,
        "version": None,
        "source": None,
        "reason": "neither %s nor %s names a version" % (path, proc),
    }


def read_infiniband(root):
    base = os.path.join(root, "sys/class/infiniband")
    hcas = []
    for hca in listdir(base):
        ports = []
        for port in listdir(os.path.join(base, hca, "ports")):
            pdir = os.path.join(base, hca, "ports", port)
            state = text(os.path.join(pdir, "state")) or ""
            ports.append(
                {
                    "port": int(port) if port.isdigit() else port,
                    "state": state.split(":", 1)[-1].strip() or None,
                    "link_layer": text(os.path.join(pdir, "link_layer")),
                }
            )
        layers = sorted(set(p["link_layer"] for p in ports if p["link_layer"]))
        hcas.append({"name": hca, "link_layers": layers, "ports": ports})
    return {"present": bool(hcas), "path": base, "hcas": hcas}


def read_cpufreq(root):
    base = os.path.join(root, "sys/devices/system/cpu")
    cpus = [c for c in listdir(base) if re.match(r"^cpu[0-9]+$", c)]
    governors = {}
    for cpu in cpus:
        gov = text(os.path.join(base, cpu, "cpufreq/scaling_governor"))
        if gov:
            governors[gov] = governors.get(gov, 0) + 1
    return {"present": bool(governors), "cpus": len(cpus), "governors": governors}


def read_modules(root):
    listing = text(os.path.join(root, "proc/modules"))
    if listing is None:
        return {"readable": False, "loaded": []}
    return {"readable": True, "loaded": sorted(set(line.split()[0] for line in listing.splitlines() if line.strip()))}


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it (nvml.h)."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class NvmlError(Exception):
    pass


def sysfs_bdf(nvml_bus_id):
    """NVML's "00000000:00:06.0" as sysfs names the device: "0000:00:06.0"."""
    parts = nvml_bus_id.lower().partition(":")
    return "%s:%s" % (parts[0][-4:].rjust(4, "0"), parts[2])


def read_persistence(library):
    """Each GPU's persistence mode through NVML, by ctypes: this module runs before any NVML binding is installed."""
    if not library:
        return {"read": False, "reason": "not asked (no nvml_library)", "gpus": []}
    try:
        nvml = ctypes.CDLL(library)
    except OSError as exc:
        return {"read": False, "reason": "cannot load %s: %s" % (library, exc), "gpus": []}

    def call(name, *args):
        rc = getattr(nvml, name)(*args)
        if rc != 0:
            raise NvmlError("%s: %s (NVML error %d)" % (name, (nvml.nvmlErrorString(rc) or b"?").decode(), rc))

    gpus = []
    try:  # AttributeError: a library without NVML's symbols
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        call("nvmlInit_v2")
    except (NvmlError, AttributeError) as exc:
        return {"read": False, "reason": "%s: %s" % (library, exc), "gpus": []}
    try:
        count = ctypes.c_uint(0)
        call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        for index in range(count.value):
            handle, mode, pci = ctypes.c_void_p(), ctypes.c_int(-1), PciInfo()
            call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
            call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci))
            call("nvmlDeviceGetPersistenceMode", handle, ctypes.byref(mode))
            gpus.append({"index": index, "bus_id": sysfs_bdf(pci.busId.decode()), "enabled": mode.value == 1})
    except (NvmlError, AttributeError) as exc:
        return {"read": False, "reason": str(exc), "gpus": gpus}
    finally:
        nvml.nvmlShutdown()
    return {"read": True, "reason": None, "gpus": gpus}


def detect_container(module):
    """(is_container, how): the signals systemd uses, then systemd-detect-virt itself."""
    marker = text("/run/systemd/container")
    if marker:
        return True, "/run/systemd/container says %s" % marker
    for path in ("/.dockerenv", "/run/.containerenv"):
        if os.path.exists(path):
            return True, "%s exists" % path
    exe = module.get_bin_path("systemd-detect-virt")
    if exe:
        try:
            proc = subprocess.run([exe, "--container"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False, None
        if proc.returncode == 0 and proc.stdout.strip() not in ("", "none"):
            return True, "systemd-detect-virt --container says %s" % proc.stdout.strip()
    return False, None


def in_chroot():
    """True when / is not the root of PID 1 (what systemd calls running in a chroot); None when unknown."""
    try:
        mine, init = os.stat("/"), os.stat("/proc/1/root/")
    except OSError:
        return None
    return (mine.st_dev, mine.st_ino) != (init.st_dev, init.st_ino)


def kernel_state(module, root, container):
    if os.path.realpath(root) != "/":
        return {"touchable": True, "reason": "writes go to the tree under %s, not to a kernel" % root}
    is_container, how = container
    if is_container and not module.params["not_a_container"]:
        return {"touchable": False, "reason": "this node is a container (%s): its kernel belongs to the host" % how}
    if in_chroot():
        return {"touchable": False, "reason": "running in a chroot: the kernel belongs to the system outside it"}
    probe = "/proc/sys/kernel/numa_balancing"
    if not os.access(probe if os.path.exists(probe) else "/proc/sys/kernel", os.W_OK):
        return {"touchable": False, "reason": "/proc/sys is not writable here"}
    return {"touchable": True, "reason": "the kernel of this node takes runtime settings"}


def main():
    module = build_module()
    root = module.params["root"]
    if not os.path.isdir(root):
        module.fail_json(msg="root %s is not a directory; expected / or a tree holding sys/ and proc/" % root)
    is_container, how = detect_container(module)
    net = os.path.join(root, "sys/class/net")
    module.exit_json(
        changed=False,
        root=root,
        container={"is_container": is_container, "how": how},
        kernel=kernel_state(module, root, (is_container, how)),
        driver=read_driver(root),
        pci=read_pci(root),
        infiniband=read_infiniband(root),
        net={"path": net, "interfaces": dict((n, text(os.path.join(net, n, "operstate"))) for n in listdir(net))},
        modules=read_modules(root),
        cpufreq=read_cpufreq(root),
        cmdline=text(os.path.join(root, "proc/cmdline")),
        persistence=read_persistence(module.params["nvml_library"]),
        sysctl=dict((k, text(os.path.join(root, "proc/sys", k.replace(".", "/")))) for k in SYSCTLS),
    )


if __name__ == "__main__":
    main()
