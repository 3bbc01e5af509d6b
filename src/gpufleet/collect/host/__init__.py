"""Host readings from sysfs and procfs (never from lspci text), one file per concern: files.py (the small
readers), pci.py (devices, ACS), fabric.py (InfiniBand, AER), kernel_state.py (modules, IOMMU, NUMA, cpufreq),
services.py (fabric manager), nccl_settings.py (the NCCL environment), bringup.py (bring-up's record), edac.py (memory
errors per controller and DIMM), nvme.py (each NVMe drive's health log), dmi.py (the machine's system, board and
chassis identity), pcie_link_states.py (the links of the NICs, GPUs and the ports above them: planned here, read under
load by bench.link_watch), platform.py (the CPU architecture, the CPUs this process may use and what gave it them).

`read(root, environ)` returns a JSON-able dict and never raises. Every path is
read under `root`, so tests point it at a fake tree. What could not be read is
recorded next to where the value would be, with the reason; a section that
crashed outright, or a top-level value that could not be read, is listed under
"errors".

Keys:
  root, kernel, os, is_root, boot_id (this boot's id, proc/sys/kernel/random/boot_id)
  architecture   "x86_64" | "aarch64" | ... (base.platform: the node's facts from it)
  cpu_allocation {online, allowed, allowed_list, share_pct, cgroup: {cpus, path, reason}, slurm: {...}, reason}
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
  numa           {nodes: [{node, cpulist, cpus, distance}], numa_balancing, paths, reason}  cpus 0: a node of
                 memory alone (a Grace Hopper node's GPU memory); distance: the node's row of the SLIT
  cpu_governors  {present, counts: {governor: n}, cpus, cpus_without_cpufreq, path, reason}
  fabricmanager  {asked, state, rc, command, reason}  (asked only with an NVSwitch)
  nccl           {env, conf: {path, present, values, ignored_lines},
                  effective: {name: {value, source}}, interfaces: {name: operstate}}
  edac           {present, path, reason, controllers: [{mc, name, ce, ue, ce_noinfo, ue_noinfo,
                   dimms: [{dimm, label, location, ce, ue}], unreadable}]}  (collect.host.edac)
  nvme           {present, path, reason, drives: [{controller, device, model, serial, firmware, pci_bdf,
                   source, reason, log: {critical_warning, temperature_c, ...}}]}  (collect.host.nvme)
  meminfo        {total_kib, available_kib, hugepages_free_kib, reason}  (/proc/meminfo)
  dmi            {path, present, source, fields: {sys_vendor, product_name, product_serial, board_name,
                  board_serial, chassis_serial, bios_version, ...}, not_read: {field: reason}, reason}
                 (collect.host.dmi: sysfs, else dmidecode)
  bringup        {path, present, readable, reason, schema_version, roles:
                  {role: {applied_at, settings, expect: [{what, path|glob,
                   sha256|value|exists, found, found_reason}]}}}
  errors         [{section, reason}]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from gpufleet.collect.host.bringup import read_bringup
from gpufleet.collect.host.dmi import read_dmi
from gpufleet.collect.host.edac import read_edac
from gpufleet.collect.host.fabric import (
    AER_SEVERITIES,
    hca_bdfs,
    parse_rate_gbps,
    read_aer,
    read_fabric,
    read_ib_port,
    read_infiniband,
)
from gpufleet.collect.host.files import parse_int, read_text
from gpufleet.collect.host.kernel_state import (
    read_cpu_governors,
    read_iommu,
    read_modules,
    read_numa,
)
from gpufleet.collect.host.meminfo import read_meminfo
from gpufleet.collect.host.nccl_settings import parse_nccl_conf, read_nccl
from gpufleet.collect.host.nvme import read_nvme
from gpufleet.collect.host.platform import read_architecture, read_cpu_allocation
from gpufleet.collect.host.pci import (
    decode_acs,
    parse_link_speed,
    pci_kind,
    read_acs,
    read_pci,
    upstream_chain,
)
from gpufleet.collect.host.services import read_fabricmanager

# What the other readers, views and checks read with (one package, whatever file holds it).
__all__ = [
    "AER_SEVERITIES",
    "decode_acs",
    "os_pretty_name",
    "parse_int",
    "parse_link_speed",
    "parse_nccl_conf",
    "parse_rate_gbps",
    "pci_kind",
    "read",
    "read_boot_id",
    "read_dmi",
    "read_fabric",
    "read_ib_port",
    "read_text",
    "upstream_chain",
]


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
    out["architecture"], reason = read_architecture(rootp)
    if reason:
        out["errors"].append({"section": "architecture", "reason": reason})
    out["boot_id"], _ = read_boot_id(root)  # None where absent (a test tree); the counter snapshots say why
    section("pci", lambda: read_pci(rootp), [])
    pci = out["pci"]
    section("acs", lambda: read_acs(rootp, pci), [])
    section("infiniband", lambda: read_infiniband(rootp), {"present": False, "ports": [], "reason": "crashed"})
    section(
        "aer",
        lambda: read_aer(rootp, pci, hca_bdfs(out["infiniband"])),
        {"present": False, "devices": [], "reason": "crashed"},
    )
    section("modules", lambda: read_modules(rootp), {"readable": False, "loaded": {}, "reason": "crashed"})
    section("iommu", lambda: read_iommu(rootp, pci), {})
    section("numa", lambda: read_numa(rootp), {})
    section("cpu_allocation", lambda: read_cpu_allocation(rootp, environ), {"reason": "crashed"})
    section("cpu_governors", lambda: read_cpu_governors(rootp), {})
    section("fabricmanager", lambda: read_fabricmanager(pci, environ), {})
    section("nccl", lambda: read_nccl(rootp, environ), {})
    section("edac", lambda: read_edac(rootp), {"present": False, "controllers": [], "reason": "crashed"})
    section(
        "nvme", lambda: read_nvme(rootp, environ.get("PATH")), {"present": False, "drives": [], "reason": "crashed"}
    )
    section("meminfo", lambda: read_meminfo(rootp), {"reason": "crashed"})
    section(
        "dmi",
        lambda: read_dmi(rootp, environ.get("PATH")),
        {"present": False, "source": None, "fields": {}, "not_read": {}, "reason": "reading it crashed (see errors)"},
    )
    section(
        "bringup",
        lambda: read_bringup(rootp),
        {"present": True, "readable": False, "roles": {}, "reason": "reading the record crashed (see errors)"},
    )
    if not pci:
        out["errors"].append({"section": "pci", "reason": f"{rootp / 'sys/bus/pci/devices'}: no PCI devices listed"})
    return out
