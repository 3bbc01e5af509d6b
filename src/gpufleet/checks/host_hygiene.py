"""Host hygiene: PCIe ACS, NUMA placement, InfiniBand (ports, their speed alike, the HCA beside each GPU),
PCIe AER, GPUDirect RDMA, IOMMU, kernel and CPU tuning, fabric manager and the NCCL environment.

Pure functions of readings["host"] (collect.host.read) and the profile.
"""

from __future__ import annotations

import re

from gpufleet import profiles
from gpufleet.schema import ERROR, FAIL, PASS, SKIP, WARN, result, worst

BRINGUP = "run bringup.yml (role host_tuning)"


def _host(readings: dict) -> dict:
    return readings.get("host") or {}


def _section(readings: dict, check: str, key: str) -> tuple[dict | list | None, dict | None]:
    """(section, None) or (None, an error result saying it was not recorded)."""
    sec = _host(readings).get(key)
    if sec is None:
        return None, result(
            check, ERROR, f"host readings have no '{key}' section; collect them with `gpufleet collect`"
        )
    return sec, None


def _devices(readings: dict, kind: str) -> list[dict]:
    return [d for d in _host(readings).get("pci") or [] if d.get("kind") == kind]


def _port_name(p: dict) -> str:
    return f"{p['hca']}/{p['port']}"


# --- PCIe ACS --------------------------------------------------------------------------


_ACS_ROW_KEYS = ("bdf", "status", "ctrl_hex", "acs_cap", "cap_offset", "config_path", "config_bytes", "reason", "below")
_NAMED_MAX = 4  # bridges named in a reason; the rest are in detail


def _redirects(bridge: dict) -> list[str]:
    bits = bridge.get("ctrl_bits") or {}
    return [b for b in ("p2p_request_redirect", "p2p_completion_redirect") if bits.get(b)]


def check_pcie_acs(readings: dict, profile: dict) -> dict:
    name = "pcie_acs"
    gpus = _devices(readings, "gpu")
    if not gpus:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus, so no GPU peer-to-peer path to check")
    bridges, err = _section(readings, name, "acs")
    if err:
        return err
    rows = [{k: b.get(k) for k in _ACS_ROW_KEYS} | {"redirect": _redirects(b)} for b in bridges]
    detail = {"bridges": rows, "is_root": _host(readings).get("is_root")}
    if not any(x["kind"] == "gpu" for b in bridges for x in b.get("below", [])):
        return result(
            name,
            SKIP,
            f"no PCIe bridge above any of the {len(gpus)} GPU(s): they sit on the root bus "
            "(a virtual machine's layout), so there is no ACS setting to check",
            detail=detail | {"gpus": [g["bdf"] for g in gpus]},
        )
    redirected = [b for b in bridges if _redirects(b)]
    unreadable = [b for b in bridges if b.get("status") in ("needs_root", "unreadable", "no_ext_config")]
    if redirected:
        said = "; ".join(
            f"{b['bdf']} ({', '.join(_redirects(b))}; ctrl {b['ctrl_hex']}) above "
            + ", ".join(f"{x['kind'].upper()} {x['bdf']}" for x in b["below"])
            for b in redirected[:_NAMED_MAX]
        )
        if len(redirected) > _NAMED_MAX:
            said += f"; and {len(redirected) - _NAMED_MAX} more (detail.bridges)"
        cmds = [f"setpci -s {b['bdf']} ECAP_ACS+6.w=0" for b in redirected]
        detail["remedy_commands"] = cmds
        shown = (
            "; ".join(cmds)
            if len(cmds) <= 3
            else f"{'; '.join(cmds[:2])}; ... (all {len(cmds)} in detail.remedy_commands)"
        )
        extra = f"; {len(unreadable)} more bridge(s) could not be read" if unreadable else ""
        return result(
            name,
            FAIL,
            f"ACS P2P redirect is on at {len(redirected)} bridge(s), so GPU and NIC peer-to-peer traffic is routed "
            f"through the root complex: {said}{extra}",
            value=len(redirected),
            unit="bridges",
            remedy=f"{BRINGUP}, or as root: {shown} (ACS control resets on reboot, so apply it at boot)",
            detail=detail,
        )
    if unreadable:
        needs_root = [b for b in unreadable if b["status"] == "needs_root"]
        first = unreadable[0]
        reason = (
            f"needs root to read PCIe extended config space: ACS of {len(needs_root)} bridge(s) unread "
            f"(e.g. {first['config_path']}, {first['config_bytes']} bytes)"
            if needs_root
            else f"ACS of {len(unreadable)} bridge(s) unread: {first['bdf']}: {first['reason']}"
        )
        return result(name, ERROR, reason, remedy="run the check as root (become: true)", detail=detail)
    no_acs = [b for b in bridges if b.get("status") == "no_acs"]
    return result(
        name,
        PASS,
        f"ACS P2P redirect off on all {len(bridges)} bridge(s) above GPUs and NICs"
        + (f" ({len(no_acs)} without an ACS capability)" if no_acs else ""),
        value=0,
        unit="bridges",
        detail=detail,
    )


# --- NUMA placement ------------------------------------------------------------------


def _rdma_nics(readings: dict) -> list[dict]:
    """NICs that back an RDMA device when there are any, else every NIC."""
    nics = _devices(readings, "nic")
    ib = _host(readings).get("infiniband") or {}
    hca_bdfs = {p.get("pci_bdf") for p in ib.get("ports") or [] if p.get("pci_bdf")}
    rdma = [n for n in nics if n["bdf"] in hca_bdfs]
    return rdma or nics


def check_numa_affinity(readings: dict, profile: dict) -> dict:
    name = "numa_affinity"
    gpus = _devices(readings, "gpu")
    if not gpus:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus")
    nodes = [n["node"] for n in (_host(readings).get("numa") or {}).get("nodes") or []]
    nics = _rdma_nics(readings)
    table = {
        "numa_nodes": nodes,
        "gpus": {g["bdf"]: g["numa_node"] for g in gpus},
        "nics": {n["bdf"]: n["numa_node"] for n in nics},
    }
    if len(nodes) <= 1:
        return result(name, PASS, f"single NUMA node ({len(nodes)} listed): every GPU and NIC is local", detail=table)
    unknown = [g["bdf"] for g in gpus if g["numa_node"] < 0]
    if unknown:
        return result(
            name,
            WARN,
            f"{len(unknown)} GPU(s) report numa_node -1 on a host with {len(nodes)} NUMA nodes ({', '.join(unknown)}): "
            "the firmware does not say which socket they hang off, so jobs cannot be pinned near them",
            value=len(unknown),
            unit="gpus",
            remedy="check the BIOS NUMA/SRAT settings (one NUMA node per socket, ACPI proximity for PCIe) and update firmware",
            detail=table,
        )
    nic_nodes = sorted({n["numa_node"] for n in nics if n["numa_node"] >= 0})
    lonely = [g for g in gpus if nic_nodes and g["numa_node"] not in nic_nodes]
    if lonely:
        on = sorted({g["numa_node"] for g in lonely})
        return result(
            name,
            WARN,
            f"{len(lonely)} GPU(s) sit on NUMA node(s) {on} with no NIC while NICs sit on node(s) {nic_nodes}: "
            "their GPUDirect RDMA traffic crosses the socket interconnect",
            value=len(lonely),
            unit="gpus",
            remedy="check HCA placement and riser cabling against the platform's reference layout",
            detail=table,
        )
    return result(
        name,
        PASS,
        f"{len(gpus)} GPU(s) on NUMA node(s) {sorted({g['numa_node'] for g in gpus})}, "
        f"{len(nics)} NIC(s) on node(s) {nic_nodes}",
        detail=table,
    )


# --- InfiniBand ------------------------------------------------------------------------


def check_infiniband(readings: dict, profile: dict) -> dict:
    name = "infiniband"
    ib, err = _section(readings, name, "infiniband")
    if err:
        return err
    need = profiles.value(profile, "ib_ports_min") or 0
    rate_min = profiles.value(profile, "ib_rate_min_gbps")
    thr = profiles.threshold(profile, "ib_ports_min", ib_rate_min_gbps=profiles.threshold(profile, "ib_rate_min_gbps"))
    ports = ib.get("ports") or []
    detail = {"path": ib.get("path"), "ports": ports}
    if not ib.get("present") or not ports:
        if need == 0:
            return result(
                name, SKIP, "no InfiniBand HCA found under /sys/class/infiniband", threshold=thr, detail=detail
            )
        return result(
            name,
            FAIL,
            f"expected at least {need} active InfiniBand port(s); no InfiniBand HCA found under /sys/class/infiniband",
            value=0,
            unit="ports",
            threshold=thr,
            remedy="check that the HCAs are seated and seen on the PCI bus, and that mlx5_core/ib_core (rdma-core or DOCA-OFED) are loaded",
            detail=detail,
        )
    ib_ports = [p for p in ports if p.get("link_layer") == "InfiniBand"]
    active = [p for p in ib_ports if p.get("state") == "ACTIVE"]
    down = [p for p in ports if p.get("state") != "ACTIVE"]
    roce = [p for p in ports if p.get("link_layer") != "InfiniBand" and p.get("state") == "ACTIVE"]
    detail |= {"active": [_port_name(p) for p in active], "down": [_port_name(p) for p in down]}
    fails, warns = [], []
    if len(active) < need:
        why = f"{len(active)} of at least {need} InfiniBand port(s) active"
        if down:
            why += "; not active: " + ", ".join(
                f"{_port_name(p)} ({p.get('state')}, {p.get('phys_state')})" for p in down
            )
        if roce:
            why += f"; {len(roce)} active port(s) are {roce[0].get('link_layer')} (RoCE), which ib_ports_min does not count"
        fails.append(why)
    elif down:
        warns.append(
            "port(s) not active: "
            + ", ".join(f"{_port_name(p)} ({p.get('state')}, {p.get('phys_state')})" for p in down)
        )
    if rate_min is None:
        if active:
            warns.append(
                f"ib_rate_min_gbps not set; active ports run at {sorted({p.get('rate_gbps') for p in active}, key=str)} Gb/s"
            )
    else:
        slow = [p for p in active if p.get("rate_gbps") is None or p["rate_gbps"] < rate_min]
        if slow:
            fails.append(
                "below the rate floor of {} Gb/s: ".format(rate_min)
                + ", ".join(f"{_port_name(p)} at {p.get('rate') or 'unknown rate'}" for p in slow)
            )
    status = FAIL if fails else WARN if warns else PASS
    if status == PASS:
        reason = f"{len(active)} InfiniBand port(s) active" + (
            f" at >= {rate_min} Gb/s" if rate_min is not None else ""
        )
    else:
        reason = "; ".join(fails + warns)
    return result(
        name,
        status,
        reason,
        value=len(active),
        unit="ports",
        threshold=thr,
        remedy=(
            None
            if status == PASS
            else "check cables and switch ports of the listed ports (ibstat, mlxlink), and the subnet manager; reseat or replace the transceiver"
        ),
        detail=detail,
    )


def _speed_text(p: dict) -> str:
    return p.get("rate") or f"{p.get('rate_gbps')} Gb/s"


def check_ib_port_speed(readings: dict, profile: dict) -> dict:
    """Every active port at the best rate and lane count of its siblings (same link layer) on this node."""
    name = "ib_port_speed"
    ib, err = _section(readings, name, "infiniband")
    if err:
        return err
    active = [p for p in ib.get("ports") or [] if p.get("state") == "ACTIVE"]
    rows = [{"port": _port_name(p), **{k: p.get(k) for k in ("hca", "pci_bdf", "rate", "rate_gbps", "lanes", "link_layer")}}
            for p in active]
    detail = {"ports": rows}
    if not active:
        return result(name, SKIP, "no active InfiniBand or RoCE port to compare (see host_hygiene.infiniband)", detail=detail)
    slow, best_of = [], {}
    for layer in sorted({str(p.get("link_layer")) for p in active}):
        same = [p for p in active if str(p.get("link_layer")) == layer]
        rate = max((p["rate_gbps"] for p in same if isinstance(p.get("rate_gbps"), (int, float))), default=None)
        lanes = max((p["lanes"] for p in same if isinstance(p.get("lanes"), int)), default=None)
        best_of[layer] = {"rate_gbps": rate, "lanes": lanes, "rate": next((p.get("rate") for p in same if p.get("rate_gbps") == rate), None)}
        for p in same:
            low = [what for what, mine, best in (("rate", p.get("rate_gbps"), rate), ("lanes", p.get("lanes"), lanes))
                   if best is not None and (mine is None or mine < best)]
            if low:
                slow.append((p, layer, low))
    detail["best"] = best_of
    if slow:
        named = [f"{_port_name(p)} at {_speed_text(p)} ({' and '.join('fewer lanes' if w == 'lanes' else 'a lower rate' for w in low)} "
                 f"than its {layer} siblings at {best_of[layer]['rate'] or best_of[layer]['rate_gbps']})" for p, layer, low in slow]
        detail["slower"] = [_port_name(p) for p, _, _ in slow]
        return result(name, FAIL, f"{len(slow)} of {len(active)} active port(s) trained below their siblings: " + "; ".join(named),
                      value=len(slow), unit="ports",
                      remedy="a port trained at fewer lanes or a lower rate has a bad cable, transceiver or switch port: check it "
                             "with `mlxlink -d <hca> -m`, reseat or replace the cable; every rank's traffic on that rail runs at its speed",
                      detail=detail)
    speeds = ", ".join(f"{layer} at {b['rate'] or b['rate_gbps']}" for layer, b in best_of.items())
    return result(name, PASS, f"{len(active)} active port(s) alike: {speeds}", value=0, unit="ports", detail=detail)


def _aer_text(d: dict, severity: str) -> str:
    sev = d.get(severity) or {}
    names = ", ".join(f"{n} {c}" for n, c in (sev.get("names") or {}).items())
    where = f"bridge {d['bdf']} (above {', '.join(d.get('below') or [])})" if d.get("role") == "bridge" else f"{d.get('role', '').upper()} {d['bdf']}"
    return f"{where}: {sev.get('total')}" + (f" ({names})" if names else "")


def check_pcie_aer(readings: dict, profile: dict) -> dict:
    """The AER counts since boot of every GPU, HCA and bridge between each and its root port: fatal ones fail,
    non-fatal ones warn; correctable ones are named (their rate is judged by the fleet layer, fabric_*)."""
    name = "pcie_aer"
    aer, err = _section(readings, name, "aer")
    if err:
        return err
    fatal_max = profiles.value(profile, "fabric_aer_fatal_max") or 0
    nonfatal_max = profiles.value(profile, "fabric_aer_nonfatal_max") or 0
    thr = profiles.threshold(profile, "fabric_aer_fatal_max", fabric_aer_nonfatal_max=profiles.threshold(profile, "fabric_aer_nonfatal_max"))
    devices = aer.get("devices") or []
    if not aer.get("present"):
        return result(name, SKIP, f"no PCIe AER counts to read: {aer.get('reason')}", threshold=thr,
                      detail={"devices": len(devices), "reason": aer.get("reason")})

    def total(d: dict, sev: str) -> int:
        return (d.get(sev) or {}).get("total") or 0

    counted = {sev: [d for d in devices if total(d, sev)] for sev in ("fatal", "nonfatal", "correctable")}
    sums = {sev: sum(total(d, sev) for d in devices) for sev in counted}
    detail = {"totals": sums, "devices_read": sum(1 for d in devices if d.get("correctable") is not None),
              "unreadable": {d["bdf"]: d["reason"] for d in devices if d.get("reason")},
              "counted": {sev: [{"bdf": d["bdf"], "role": d.get("role"), "below": d.get("below"), **(d.get(sev) or {})}
                                for d in ds] for sev, ds in counted.items() if ds}}
    parts, status = [], PASS
    if sums["fatal"] > fatal_max:
        status = FAIL
        parts.append("fatal: " + "; ".join(_aer_text(d, "fatal") for d in counted["fatal"]))
    if sums["nonfatal"] > nonfatal_max:
        status = worst([status, WARN])
        parts.append("non-fatal uncorrectable: " + "; ".join(_aer_text(d, "nonfatal") for d in counted["nonfatal"]))
    corr = ("; correctable since boot: " + "; ".join(_aer_text(d, "correctable") for d in counted["correctable"][:_NAMED_MAX])
            + (f" and {len(counted['correctable']) - _NAMED_MAX} more" if len(counted["correctable"]) > _NAMED_MAX else "")
            ) if counted["correctable"] else ""
    scope = f"{detail['devices_read']} GPU(s), HCA(s) and bridge(s) above them"
    if status == PASS:
        return result(name, PASS, f"no uncorrectable AER error since boot on {scope}{corr or '; no correctable one either'}",
                      value=0, unit="errors", threshold=thr, detail=detail)
    return result(name, status, f"AER errors since boot on {scope}: " + "; ".join(parts) + corr,
                  value=sums["fatal"] + sums["nonfatal"], unit="errors", threshold=thr, detail=detail,
                  remedy="an uncorrectable PCIe error on that link: reseat the device (and its riser or cable), update the "
                         "device's and the switch's firmware, check the kernel log for the AER lines; a fatal one needs the "
                         "node drained and the link serviced before it is accepted")


def _shared(a: list[str], b: list[str]) -> int:
    """Bridges two devices share from the root port down (their common ancestors in the PCIe tree)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def rails(readings: dict) -> tuple[list[dict], list[dict]]:
    """(GPUs in PCI bus order, each with the HCA nearest it: the most bridges shared, then the same NUMA node, then the
    name; the HCAs). A GPU's position n is its NVML index where NVML orders by PCI bus id, as it does by default."""
    gpus = sorted(_devices(readings, "gpu"), key=lambda d: d["bdf"])
    hca_name: dict[str, str] = {}
    for p in (_host(readings).get("infiniband") or {}).get("ports") or []:
        if p.get("pci_bdf"):
            hca_name.setdefault(p["pci_bdf"], p.get("hca"))
    hcas = [dict(d, hca=hca_name[d["bdf"]]) for d in _host(readings).get("pci") or [] if d.get("bdf") in hca_name]
    out = []
    for n, g in enumerate(gpus):
        ranked = sorted(hcas, key=lambda h: (-_shared(g.get("upstream") or [], h.get("upstream") or []),
                                             h.get("numa_node") != g.get("numa_node"), h["hca"]))
        row = {"gpu": n, "gpu_bdf": g["bdf"], "gpu_numa": g.get("numa_node")}
        if ranked:
            h = ranked[0]
            shared = _shared(g.get("upstream") or [], h.get("upstream") or [])
            row.update(hca=h["hca"], hca_bdf=h["bdf"], hca_numa=h.get("numa_node"), shared_bridges=shared,
                       beside=shared > 0, same_numa=h.get("numa_node") == g.get("numa_node"))
        out.append(row)
    return out, hcas


def check_gpu_nic_rails(readings: dict, profile: dict) -> dict:
    """Each GPU's nearest HCA in the PCIe tree: one that shares a bridge with it (a PCIe switch under one root
    port) is beside it; a GPU with none sends its RDMA traffic through the CPU."""
    name = "gpu_nic_rails"
    rows, hcas = rails(readings)
    detail = {"rails": rows}
    if not rows:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus", detail=detail)
    if not hcas:
        return result(name, SKIP, "no InfiniBand or RoCE HCA (nothing under /sys/class/infiniband with a PCI device): "
                      "no rails to read", detail=detail)
    lonely = [r for r in rows if not r.get("beside")]
    pairs = ", ".join(f"GPU {r['gpu']}-{r['hca']}" for r in rows)
    if lonely:
        named = "; ".join(f"GPU {r['gpu']} ({r['gpu_bdf']}, NUMA node {r['gpu_numa']}): nearest HCA {r['hca']} ({r['hca_bdf']}) "
                          f"only through the CPU{'' if r['same_numa'] else ', on another NUMA node'}" for r in lonely)
        return result(name, FAIL, f"{len(lonely)} of {len(rows)} GPU(s) have no HCA beside them in the PCIe tree: {named}",
                      value=len(lonely), unit="gpus", detail=detail,
                      remedy="an HCA missing from the PCIe switch of these GPUs (not seated, not enumerated, or cabled to another "
                             "slot): compare with the platform's reference layout and `nvidia-smi topo -m`; GPUDirect RDMA "
                             "performs only with the HCA and GPU under one PCIe switch (NVIDIA GPUDirect RDMA user manual, "
                             "system requirements)")
    far = [r for r in rows if not r["same_numa"]]
    note = f"; {len(far)} pair(s) across NUMA nodes" if far else ""
    return result(name, PASS, f"every GPU has an HCA beside it under one PCIe switch: {pairs}{note}", value=0, unit="gpus",
                  detail=detail)


def _active_ib_ports(readings: dict) -> list[dict]:
    ib = _host(readings).get("infiniband") or {}
    return [p for p in ib.get("ports") or [] if p.get("state") == "ACTIVE"]


def check_peermem(readings: dict, profile: dict) -> dict:
    name = "peermem"
    ib = _host(readings).get("infiniband") or {}
    if not ib.get("present") or not ib.get("ports"):
        return result(name, SKIP, "no InfiniBand HCA, so GPUDirect RDMA (nvidia_peermem) is not needed")
    mods, err = _section(readings, name, "modules")
    if err:
        return err
    detail = {"path": mods.get("path"), "loaded": mods.get("loaded")}
    if not mods.get("readable"):
        return result(name, ERROR, f"cannot tell whether nvidia_peermem is loaded: {mods.get('reason')}", detail=detail)
    loaded = mods.get("loaded") or {}
    found = [m for m in ("nvidia_peermem", "nv_peer_mem") if loaded.get(m)]
    if found:
        return result(name, PASS, f"{found[0]} loaded: GPUDirect RDMA available to NCCL", detail=detail)
    return result(
        name,
        FAIL,
        f"InfiniBand is present ({len(ib['ports'])} port(s)) but nvidia_peermem is not loaded "
        f"(per {mods.get('path')}), so NCCL cannot use GPUDirect RDMA through it",
        remedy="modprobe nvidia_peermem and list it in /etc/modules-load.d (bringup.yml does both); "
        "it needs ib_core loaded before it",
        detail=detail,
    )


# --- IOMMU --------------------------------------------------------------------------------


def _cmdline_passthrough(flags: dict) -> bool:
    return flags.get("iommu") == "pt" or flags.get("iommu.passthrough") in ("1", "y", "on")


def check_iommu(readings: dict, profile: dict) -> dict:
    name = "iommu"
    if not _devices(readings, "gpu"):
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus")
    io, err = _section(readings, name, "iommu")
    if err:
        return err
    required = profiles.value(profile, "iommu_passthrough_required")
    thr = profiles.threshold(profile, "iommu_passthrough_required")
    detail = {k: io.get(k) for k in ("groups_path", "group_count", "gpu_groups", "cmdline_flags", "cmdline_path")}
    if not io.get("groups_present"):
        return result(
            name, PASS, f"no IOMMU active (no groups under {io.get('groups_path')})", threshold=thr, detail=detail
        )
    groups = io.get("gpu_groups") or []
    translated = [g for g in groups if g.get("mode") == "translated"]
    other = [g for g in groups if g.get("mode") is None]
    if translated:
        return result(
            name,
            FAIL if required else WARN,
            f"IOMMU translates DMA for {len(translated)} GPU(s) (group type {translated[0]['type']}, "
            f"e.g. {translated[0]['bdf']}): GPUDirect RDMA and P2P pay for every translation",
            value=len(translated),
            unit="gpus",
            threshold=thr,
            remedy="boot with iommu=pt (with intel_iommu=on or amd_iommu=on) so host devices use identity mapping",
            detail=detail,
        )
    if other:
        if _cmdline_passthrough(io.get("cmdline_flags") or {}):
            return result(
                name,
                PASS,
                "GPU IOMMU group type not exposed; the kernel command line sets passthrough",
                threshold=thr,
                detail=detail,
            )
        g = other[0]
        return result(
            name,
            WARN,
            f"IOMMU mode of {len(other)} GPU(s) unknown (e.g. {g['bdf']}: type {g.get('type')!r}, {g.get('reason') or 'not identity or DMA'}) "
            "and the kernel command line has no iommu=pt",
            threshold=thr,
            remedy="boot with iommu=pt, or confirm the GPUs are not assigned to vfio",
            detail=detail,
        )
    return result(
        name, PASS, f"IOMMU in passthrough (identity) for all {len(groups)} GPU group(s)", threshold=thr, detail=detail
    )


# --- kernel and CPU tuning -----------------------------------------------------------------


def check_numa_balancing(readings: dict, profile: dict) -> dict:
    name = "numa_balancing"
    numa, err = _section(readings, name, "numa")
    if err:
        return err
    found = numa.get("numa_balancing")
    thr = profiles.threshold(profile, "numa_balancing_expected")
    expected = thr["value"]
    detail = {"path": numa.get("numa_balancing_path"), "value": found, "reason": numa.get("reason")}
    if found is None:
        return result(
            name, SKIP, f"automatic NUMA balancing not exposed ({numa.get('reason')})", threshold=thr, detail=detail
        )
    if expected is None:
        return result(
            name,
            WARN,
            f"kernel.numa_balancing is {found}; numa_balancing_expected is not set",
            value=found,
            threshold=thr,
            remedy="set gpufleet_thresholds.numa_balancing_expected",
            detail=detail,
        )
    if found != expected:
        return result(
            name,
            FAIL,
            f"kernel.numa_balancing is {found}, expected {expected}",
            value=found,
            threshold=thr,
            remedy=f"{BRINGUP}, or sysctl -w kernel.numa_balancing={expected} and persist it in /etc/sysctl.d",
            detail=detail,
        )
    return result(name, PASS, f"kernel.numa_balancing is {found}", value=found, threshold=thr, detail=detail)


def check_cpu_governor(readings: dict, profile: dict) -> dict:
    name = "cpu_governor"
    gov, err = _section(readings, name, "cpu_governors")
    if err:
        return err
    thr = profiles.threshold(profile, "cpu_governor_expected")
    expected = thr["value"]
    counts = gov.get("counts") or {}
    detail = {k: gov.get(k) for k in ("path", "counts", "cpus", "cpus_without_cpufreq")}
    if not gov.get("present"):
        return result(name, SKIP, "no CPU frequency scaling exposed (cpufreq absent)", threshold=thr, detail=detail)
    if expected is None:
        return result(
            name,
            WARN,
            f"governors {counts}; cpu_governor_expected is not set",
            threshold=thr,
            remedy="set gpufleet_thresholds.cpu_governor_expected",
            detail=detail,
        )
    off = {g: n for g, n in counts.items() if g != expected}
    if off:
        n_off = sum(off.values())
        return result(
            name,
            FAIL,
            f"{n_off} of {sum(counts.values())} CPUs not on the {expected} governor: {off}",
            value=n_off,
            unit="cpus",
            threshold=thr,
            remedy=f"{BRINGUP}, or cpupower frequency-set -g {expected}",
            detail=detail,
        )
    return result(
        name,
        PASS,
        f"all {counts[expected]} CPUs with cpufreq use the {expected} governor",
        value=0,
        unit="cpus",
        threshold=thr,
        detail=detail,
    )


# --- fabric manager --------------------------------------------------------------------------


def check_fabric_manager(readings: dict, profile: dict) -> dict:
    name = "fabric_manager"
    switches = _devices(readings, "nvswitch")
    if not switches:
        return result(name, SKIP, "no NVSwitch on the PCI bus, so no fabric manager is needed")
    fm, err = _section(readings, name, "fabricmanager")
    if err:
        return err
    detail = {"nvswitches": [s["bdf"] for s in switches], **fm}
    if not fm.get("asked") or not fm.get("state"):
        return result(
            name, ERROR, f"could not ask systemd about nvidia-fabricmanager: {fm.get('reason')}", detail=detail
        )
    if fm["state"] == "active":
        return result(name, PASS, f"nvidia-fabricmanager active for {len(switches)} NVSwitch(es)", detail=detail)
    return result(
        name,
        FAIL,
        f"nvidia-fabricmanager is {fm['state']} with {len(switches)} NVSwitch(es) present: "
        "CUDA cannot start on these GPUs until it runs",
        remedy="systemctl enable --now nvidia-fabricmanager; its version must match the driver exactly "
        "(journalctl -u nvidia-fabricmanager says why it stopped)",
        detail=detail,
    )


# --- NCCL environment --------------------------------------------------------------------------


def nccl_int(text: str | None) -> int:
    """An integer variable the way NCCL reads it (strtoll base 0: leading number, else 0)."""
    m = re.match(r"\s*([+-]?)(0x[0-9a-f]+|0[0-7]*|[1-9]\d*)", text or "", re.I)
    if not m:
        return 0
    sign = -1 if m.group(1) == "-" else 1
    digits = m.group(2)
    base = 16 if digits.lower().startswith("0x") else 8 if digits.startswith("0") and len(digits) > 1 else 10
    return sign * int(digits, base)


def socket_ifname_matches(spec: str, interfaces: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects.

    Syntax (NCCL docs): a comma list of name prefixes; a leading '^' excludes the
    listed ones instead; '=' (after any '^') makes the names exact. Each entry
    may carry ':port', which does not change the interface.
    """
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = [e.split(":", 1)[0] for e in spec.split(",") if e]

    def listed(ifname: str) -> bool:
        return any(ifname == e if exact else ifname.startswith(e) for e in entries)

    return [i for i in interfaces if listed(i) != exclude]


def check_nccl_env(readings: dict, profile: dict) -> dict:
    name = "nccl_env"
    nccl, err = _section(readings, name, "nccl")
    if err:
        return err
    eff = {k: v["value"] for k, v in (nccl.get("effective") or {}).items()}
    sources = {k: v["source"] for k, v in (nccl.get("effective") or {}).items()}
    interfaces = nccl.get("interfaces") or {}
    conf = nccl.get("conf") or {}
    fails, warns, remedies = [], [], []

    def where(var: str) -> str:
        return f"{var}={eff[var]} (from {sources[var]})"

    active_ib = _active_ib_ports(readings)
    if nccl_int(eff.get("NCCL_IB_DISABLE")) and active_ib:
        fails.append(
            f"{where('NCCL_IB_DISABLE')} on a host with {len(active_ib)} active InfiniBand port(s): inter-node traffic falls back to TCP sockets"
        )
        remedies.append("unset NCCL_IB_DISABLE")
    if nccl_int(eff.get("NCCL_P2P_DISABLE")):
        fails.append(f"{where('NCCL_P2P_DISABLE')}: GPUs inside the node stop using NVLink/PCIe peer-to-peer")
        remedies.append("unset NCCL_P2P_DISABLE")
    ifname = eff.get("NCCL_SOCKET_IFNAME")
    if ifname is not None:
        chosen = socket_ifname_matches(ifname, sorted(interfaces))
        if len(ifname) <= 1:
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} is ignored by NCCL (values under 2 characters count as unset)")
        elif not chosen:
            fails.append(f"{where('NCCL_SOCKET_IFNAME')} selects none of this host's interfaces {sorted(interfaces)}")
            remedies.append("set NCCL_SOCKET_IFNAME to an existing interface (prefix, '=' for exact, '^' to exclude)")
        elif all(i == "lo" for i in chosen):
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} selects only the loopback interface")
            remedies.append("point NCCL_SOCKET_IFNAME at the interface other nodes can reach")
        elif all(interfaces.get(i) == "down" for i in chosen):
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} selects only interfaces that are down: {chosen}")
            remedies.append("bring the interface up or point NCCL_SOCKET_IFNAME elsewhere")
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if eff.get(var):
            warns.append(f"{where(var)} overrides NCCL's tuner for every message size and topology")
            remedies.append(f"unset {var} unless a measurement backs it")
    if nccl_int(eff.get("NCCL_SHM_DISABLE")):
        warns.append(f"{where('NCCL_SHM_DISABLE')}: intra-node fallback traffic goes through the network")
        remedies.append("unset NCCL_SHM_DISABLE")
    if (eff.get("NCCL_DEBUG") or "").strip().upper() in ("INFO", "TRACE"):
        warns.append(f"{where('NCCL_DEBUG')} floods job logs and slows start-up")
        remedies.append("use NCCL_DEBUG=WARN for production jobs")
    for line in conf.get("ignored_lines") or []:
        warns.append(f"{conf.get('path')} line {line['line']} {line['text']!r} has no effect: {line['reason']}")
        remedies.append(f"fix {conf.get('path')} to plain NAME=VALUE lines")
    detail = {
        "effective": nccl.get("effective"),
        "conf_path": conf.get("path"),
        "conf_present": conf.get("present"),
        "interfaces": interfaces,
        "not_read": nccl.get("not_read"),
    }
    status = FAIL if fails else WARN if warns else PASS
    if status == PASS:
        reason = (
            f"NCCL environment sane: {', '.join(sorted(eff))} set"
            if eff
            else "no NCCL variables set; NCCL picks its own defaults"
        )
        return result(name, PASS, reason, detail=detail)
    return result(
        name,
        status,
        "; ".join(fails + warns),
        value=len(fails) + len(warns),
        unit="problems",
        remedy="; ".join(dict.fromkeys(remedies)) or "review the NCCL variables listed",
        detail=detail,
    )


# --- drift since bringup.yml ------------------------------------------------------------------

RUN_BRINGUP = "run bringup.yml on this node (ansible-playbook bringup.yml -i inventory/<site> --limit <node>)"
_DRIFT_NAMED_MAX = 6  # drifted settings named in a reason; all are in detail


def _drift(item: dict) -> tuple[str, str | None]:
    """('held' | 'drifted' | 'unreadable', what to say) for one expectation the collector read."""
    what, found, why = item.get("what"), item.get("found"), item.get("found_reason")
    where = item.get("glob") or item.get("path")
    if why and ("not present" in why or "no file matches" in why):
        return "drifted", f"{what} ({where}) is gone"
    if why:
        return "unreadable", f"{what}: {why}"
    if "sha256" in item:
        if found == item["sha256"]:
            return "held", None
        return "drifted", f"{what} ({where}) changed since bringup"
    if "exists" in item:
        if bool(found) == bool(item["exists"]):
            return "held", None
        return "drifted", f"{what} ({where}) is {'missing' if item['exists'] else 'present again'}"
    expected = str(item.get("value"))
    if "glob" in item:
        off = {v: n for v, n in (found or {}).items() if v != expected}
        if not off:
            return "held", None
        return "drifted", f"{what} is {off} on {sum(off.values())} of {sum(found.values())} ({where}), bringup set {expected}"
    if found == expected:
        return "held", None
    return "drifted", f"{what} is {found} ({where}), bringup set {expected}"


def check_bringup_drift(readings: dict, profile: dict) -> dict:
    name = "bringup_drift"
    rec, err = _section(readings, name, "bringup")
    if err:
        return err
    thr = profiles.threshold(profile, "bringup_required")
    required = thr["value"]
    roles = rec.get("roles") or {}
    detail = {"path": rec.get("path"), "roles": roles}
    if not rec.get("present") or (rec.get("readable") and not roles):
        said = f"no bringup record at {rec.get('path')}" if not rec.get("present") else f"{rec.get('path')} names no role"
        if not required:
            return result(
                name, SKIP, f"bringup.yml has not run on this node ({said}); bringup_required is false", threshold=thr,
                detail=detail,
            )
        return result(
            name,
            FAIL,
            f"bringup.yml has not run on this node since it was imaged ({said})",
            threshold=thr,
            remedy=RUN_BRINGUP,
            detail=detail,
        )
    if not rec.get("readable"):
        return result(
            name,
            ERROR,
            f"cannot read the bringup record: {rec.get('reason')}",
            threshold=thr,
            remedy=f"run the check as root, or {RUN_BRINGUP} to write the record again",
            detail=detail,
        )
    drifted, unreadable, held, checked = [], [], 0, {}
    for role, entry in roles.items():
        items = []
        for item in entry.get("expect") or []:
            state, said = _drift(item)
            items.append(item | {"state": state})
            if state == "drifted":
                drifted.append(f"{role}: {said}")
            elif state == "unreadable":
                unreadable.append(f"{role}: {said}")
            else:
                held += 1
        checked[role] = entry | {"expect": items}
    detail |= {"roles": checked, "drifted": drifted, "unreadable": unreadable}
    if drifted:
        said = "; ".join(drifted[:_DRIFT_NAMED_MAX])
        if len(drifted) > _DRIFT_NAMED_MAX:
            said += f"; and {len(drifted) - _DRIFT_NAMED_MAX} more (detail.drifted)"
        return result(
            name,
            FAIL,
            f"{len(drifted)} setting(s) applied by bringup.yml no longer hold: {said}; run bringup.yml",
            value=len(drifted),
            unit="settings",
            threshold=thr,
            remedy=f"{RUN_BRINGUP}; it applies the settings again and records them (reboot when it says one is pending)",
            detail=detail,
        )
    if unreadable:
        return result(
            name,
            ERROR,
            f"{len(unreadable)} recorded setting(s) could not be read: {'; '.join(unreadable[:_DRIFT_NAMED_MAX])}",
            threshold=thr,
            remedy="run the check as root (become: true)",
            detail=detail,
        )
    applied = sorted(e.get("applied_at") or "?" for e in roles.values())
    return result(
        name,
        PASS,
        f"all {held} setting(s) bringup.yml recorded for {', '.join(roles)} still hold (last applied {applied[-1]})",
        value=0,
        unit="settings",
        threshold=thr,
        detail=detail,
    )
