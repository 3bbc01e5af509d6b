"""Counter snapshots, read for `gpufleet counters --phase before|after` (host_documents.counters_host).

One host document, group `counters`: first `snapshot_before` or `snapshot_after`, every GPU NVML sees with its
cumulative error counters; then `fabric_before` or `fabric_after` (fabric_snapshot(): every InfiniBand port's
counters and the PCIe AER counts of the GPUs, HCAs and bridges above them, and the host's own: EDAC's memory
errors per DIMM and each NVMe drive's health log, collect.host_counters); after the benchmarks also
`processes_after` (the GPUs' processes listed again, as gpu_health.processes lists them before; any process on a
GPU of this node then fails it). They are read before and after the node's benchmarks so the fleet layer can judge
how much each counter grew during the run and since the node's previous run (fleet.counter_growth,
fleet.fabric_growth). The GPUs' snapshot: status `pass` when read, `error` when NVML could not be read (the reason
says why), `skip` where there is no NVIDIA driver. Detail:

    {"phase": "before", "read_at": "2026-11-23T10:00:00Z", "boot_id": "<proc/sys/kernel/random/boot_id>",
     "gpus": [{"index": 0, "uuid": "GPU-...", "serial": "...", "pci_bus_id": "0000:18:00.0", "visible": true,
               "counters": {"ecc_corrected_volatile": 0, ..., "pcie_replay": 0, "xid": 0},
               "nvlink_links": {"0": {"crc_flit": 0, "crc_data": 12, "replay": 0, "recovery": 0}, ...}}],
     "unreadable": {"<index>.<counter>": "Not Supported", ...},
     "visibility": {...}, "nvlink_source": {"<index>": "per-link counters"}, "xid_source": "/dev/kmsg"}

A counter that cannot be read is null and named in `unreadable`. `nvlink_links` holds each link's own NVLink
counts where they read link by link (null where only the all-links totals did), so a rate can name its link. `xid` counts the Xid events of that GPU in
this boot's kernel log. `visible` says whether this node's CUDA_VISIBLE_DEVICES leaves the GPU to it
(collect.visible_indices); the fleet layer judges the visible ones. Counts are cumulative since the
driver loaded (volatile ECC, PCIe replay, NVLink) or over the GPU's life (aggregate ECC, row remapping):
a `boot_id` that differs between two snapshots means the node rebooted between them.
"""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.collect import host as host_reads, host_counters, nvml
from gpufleet.collect.nvml.binding import read_field
from gpufleet.collect.nvml.nvlinks import nvlink_error_counts, nvlink_link_counts, nvlink_links, nvlink_totals
from gpufleet.collect.nvml.memory_repairs import read_remapped_rows
from gpufleet.collect.nvml.processes import visible_indices

GROUP = "counters"
PHASES = ("before", "after")
# fmt: off
COUNTERS = (
    "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate", "ecc_uncorrected_aggregate",
    "row_remap_correctable", "row_remap_uncorrectable", "row_remap_pending", "row_remap_failure",
    "nvlink_crc_data", "nvlink_crc_flit", "nvlink_replay", "nvlink_recovery",
    "pcie_replay", "xid",
)
# fmt: on
FABRIC_CHECK = "fabric_{phase}"
AER_COUNTERS = {f"aer_{sev}": sev for sev in host_reads.AER_SEVERITIES}
# Snapshot counter <- the NVML reading's field (collect.nvml GPU_FIELDS).
_ECC = {
    "ecc_corrected_volatile": "ecc_volatile_corrected",
    "ecc_uncorrected_volatile": "ecc_volatile_uncorrected",
    "ecc_corrected_aggregate": "ecc_aggregate_corrected",
    "ecc_uncorrected_aggregate": "ecc_aggregate_uncorrected",
}
_REMAP = {
    "row_remap_correctable": "correctable",
    "row_remap_uncorrectable": "uncorrectable",
    "row_remap_pending": "pending",
    "row_remap_failure": "failure",
}


def _why(gpu: dict, *fields: str) -> str:
    why = gpu.get("unreadable") or {}
    for field in fields:
        if why.get(field):
            return why[field]
    return why.get("handle") or "not in the readings"


def gpu_counters(gpu: dict, log: dict | None) -> tuple[dict, dict, str]:
    """One GPU's counters from its NVML reading and the kernel log: (counters, {counter: why unreadable}, nvlink source)."""
    counters: dict = {}
    missing: dict = {}
    for name, field in _ECC.items():
        counters[name] = gpu.get(field)
        if counters[name] is None:
            missing[name] = _why(gpu, field)
    rows = gpu.get("remapped_rows")
    for name, key in _REMAP.items():
        value = rows.get(key) if isinstance(rows, dict) else None
        counters[name] = int(value) if value is not None else None  # pending/failure: 0 or 1
        if value is None:
            missing[name] = _why(gpu, "remapped_rows")
    links, source = nvlink_error_counts(gpu)
    for counter in ("crc_data", "crc_flit", "replay", "recovery"):
        counters[f"nvlink_{counter}"] = links[counter]
        if links[counter] is None:
            missing[f"nvlink_{counter}"] = _why(
                gpu, f"nvlink.errors.{counter}", f"nvlink_error_totals.{counter}", "nvlink"
            )
    counters["pcie_replay"] = gpu.get("pcie_replay")
    if counters["pcie_replay"] is None:
        missing["pcie_replay"] = _why(gpu, "pcie_replay")
    pci = (gpu.get("pci_bus_id") or "")[:-2]  # the kernel log names "0000:18:00", NVML "0000:18:00.0"
    counters["xid"] = None
    if not isinstance(log, dict):
        missing["xid"] = "the readings hold no kernel log"
    elif not log.get("readable"):
        missing["xid"] = log.get("error") or "kernel log unreadable"
    elif not pci:
        missing["xid"] = f"PCI bus id unreadable ({_why(gpu, 'pci_bus_id')})"
    else:
        counters["xid"] = sum(1 for ev in log.get("xid_events") or [] if ev.get("pci") == pci)
    return {c: counters[c] for c in COUNTERS}, missing, source


def snapshot(phase: str, readings: dict, *, boot_id: str | None = None, boot_id_error: str | None = None) -> dict:
    """The snapshot result of one phase from readings {"nvml", "kernel_log"} (live or recorded)."""
    check = f"snapshot_{phase}"
    nv = readings.get("nvml")
    detail = {"phase": phase, "read_at": schema.utc_now(), "boot_id": boot_id, "gpus": [], "unreadable": {}}
    if boot_id_error:
        detail["boot_id_error"] = boot_id_error
    if not isinstance(nv, dict):
        return schema.result(
            check,
            schema.ERROR,
            "the readings hold no 'nvml' section (expected `gpufleet collect` output)",
            remedy="record the readings again with `gpufleet collect`",
            detail=detail,
        )
    if not nv.get("available"):
        why = nv.get("error") or "NVML is not available"
        if why == nvml.NO_DRIVER:
            return schema.result(check, schema.SKIP, f"{why}, so there are no GPU counters to read", detail=detail)
        return schema.result(
            check,
            schema.ERROR,
            f"GPU counters not read: {why}",
            detail=detail,
            remedy="check the driver with `nvidia-smi`; a driver that does not load needs bringup.yml or a reboot",
        )
    gpus = nv.get("gpus") or []
    if nv.get("error") or not gpus:
        why = nv.get("error") or "NVML reports no GPU"
        return schema.result(
            check,
            schema.ERROR,
            f"GPU counters not read: {why}",
            detail=detail,
            remedy="see gpu_inventory.gpu_count: check `nvidia-smi -L` and `lspci -d 10de:`",
        )
    vis = visible_indices(gpus, nv.get("cuda_visible_devices"))
    visible = set(vis["indices"])
    log = readings.get("kernel_log")
    sources = {}
    for g in gpus:
        counters, missing, sources[str(g.get("index"))] = gpu_counters(g, log)
        detail["gpus"].append(
            {
                "index": g.get("index"),
                "uuid": g.get("uuid"),
                "serial": g.get("serial"),
                "pci_bus_id": g.get("pci_bus_id"),
                "visible": g.get("index") in visible,
                "counters": counters,
                "nvlink_links": nvlink_link_counts(g),
            }
        )
        for counter, why in missing.items():
            detail["unreadable"][f"{g.get('index')}.{counter}"] = why
    detail["visibility"] = {k: vis[k] for k in ("cuda_visible_devices", "indices", "all", "resolved", "note")}
    detail["nvlink_source"] = sources
    detail["xid_source"] = log.get("source") if isinstance(log, dict) else None
    n, unread = len(gpus), len(detail["unreadable"])
    reason = f"counters of {n} GPU{'s' if n != 1 else ''} read {phase} the benchmarks"
    if not vis["all"] or not vis["resolved"]:
        reason += f" ({len(visible)} visible to this node)" if vis["resolved"] else f"; {vis['note']}"
    if unread:
        reason += f"; {unread} unreadable, named in detail.unreadable"
    return schema.result(check, schema.PASS, reason, value=n, unit="GPUs", detail=detail)


def read_live(nv, handle) -> dict:
    """One GPU's counters read now through NVML (nv: pynvml, initialised), without the kernel log's xid: what the
    soak's sampler reads between its windows. {counter: value, None where unreadable; "nvlink_links": per link}."""
    g: dict = {"unreadable": {}}
    for name, counter in (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC)):
        for kind_name, kind in (
            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ):
            g[f"ecc_{name}_{kind_name}"], _ = read_field(nv.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
    g["remapped_rows"], _ = read_field(read_remapped_rows, handle)
    g["nvlink"] = nvlink_links(handle, g["unreadable"])
    g["nvlink_error_totals"] = nvlink_totals(handle, g["unreadable"])
    g["pcie_replay"], _ = read_field(lambda: int(nv.nvmlDeviceGetPcieReplayCounter(handle)))
    values, _, _ = gpu_counters(g, None)
    values.pop("xid")
    return {**values, "nvlink_links": nvlink_link_counts(g)}


def fabric_snapshot(
    phase: str, readings: dict, *, boot_id: str | None = None, boot_id_error: str | None = None
) -> dict:
    """The fabric's snapshot of one phase (check fabric_before|fabric_after) from the host readings' `infiniband`
    and `aer` sections: every InfiniBand port with all its counters (counters/ and hw_counters/), and every GPU,
    HCA and bridge between each and its root port with its AER totals. Detail:

        {"phase", "read_at", "boot_id", "devices": [{"id": "ib:mlx5_0/1", "kind": "ib_port", "name", "hca", "port",
          "pci_bdf", "state", "rate_gbps", "lanes", "counters": {name: n}} | {"id": "pcie:0000:33:00.0", "kind":
          "pcie", "name", "bdf", "role", "below", "counters": {"aer_correctable", "aer_nonfatal", "aer_fatal"},
          "aer_names": {severity: {name: n}}} | the host's own (collect.host_counters): {"id": "edac:mc0/dimm3",
          "kind": "edac", ...} | {"id": "nvme:<serial>", "kind": "nvme", ...}], "unreadable": {"<id>.<counter>": why},
          "infiniband": why none, "aer": why none, "edac": why none, "nvme": why none}

    `pass` when anything was read, `skip` when the node has none of them (the reason says why), `error` when the
    readings hold neither the InfiniBand nor the AER section."""
    check = FABRIC_CHECK.format(phase=phase)
    h = readings.get("host") or {}
    ib, aer = h.get("infiniband"), h.get("aer")
    detail: dict = {"phase": phase, "read_at": schema.utc_now(), "boot_id": boot_id, "devices": [], "unreadable": {}}
    if boot_id_error:
        detail["boot_id_error"] = boot_id_error
    if not isinstance(ib, dict) and not isinstance(aer, dict):
        return schema.result(
            check,
            schema.ERROR,
            "the readings hold no host 'infiniband' or 'aer' section (expected `gpufleet collect` output)",
            remedy="record the readings again with `gpufleet collect`",
            detail=detail,
        )
    ports = (ib or {}).get("ports") or []
    for p in ports:
        ident = f"ib:{p.get('hca')}/{p.get('port')}"
        detail["devices"].append(
            {
                "id": ident,
                "kind": "ib_port",
                "name": f"{p.get('hca')} port {p.get('port')}",
                **{k: p.get(k) for k in ("hca", "port", "pci_bdf", "state", "rate_gbps", "lanes", "link_layer")},
                "counters": dict(p.get("counters") or {}),
            }
        )
        for name, why in (p.get("counters_unreadable") or {}).items():
            detail["unreadable"][f"{ident}.{name}"] = why
    n_aer = 0
    for d in (aer or {}).get("devices") or []:
        ident = f"pcie:{d.get('bdf')}"
        role = d.get("role")
        name = f"{'GPU' if role == 'gpu' else 'HCA' if role == 'hca' else 'bridge'} {d.get('bdf')}"
        if role == "bridge" and d.get("below"):
            name += f" (above {', '.join(d['below'])})"
        counters, names = {}, {}
        for counter, sev in AER_COUNTERS.items():
            sev_read = d.get(sev)
            counters[counter] = sev_read.get("total") if isinstance(sev_read, dict) else None
            if counters[counter] is None:
                detail["unreadable"][f"{ident}.{counter}"] = d.get("reason") or f"aer_dev_{sev} has no TOTAL_ line"
            elif sev_read.get("names"):
                names[sev] = sev_read["names"]
        if any(v is not None for v in counters.values()):
            n_aer += 1
            detail["devices"].append(
                {
                    "id": ident,
                    "kind": "pcie",
                    "name": name,
                    "bdf": d.get("bdf"),
                    "role": role,
                    "below": d.get("below") or [],
                    "counters": counters,
                    "aer_names": names,
                }
            )
    own, own_unreadable, own_none = host_counters.devices(h)  # the host's: EDAC's memory errors, the NVMe drives
    detail["devices"] += own
    detail["unreadable"].update(own_unreadable)
    detail["edac"], detail["nvme"] = own_none.get("edac"), own_none.get("nvme")
    no_ib = None if ports else ((ib or {}).get("reason") or "no InfiniBand port listed")
    if n_aer:
        no_aer = None
    elif isinstance(aer, dict):
        no_aer = aer.get("reason") or "no AER counts read"
    else:
        no_aer = "the readings hold no 'aer' section (recorded before AER was read)"
    detail["infiniband"], detail["aer"] = no_ib, no_aer
    mine = [f"no EDAC ({own_none['edac']})"] if own_none.get("edac") else []
    mine += [f"no NVMe health log ({own_none['nvme']})"] if own_none.get("nvme") else []
    if no_ib and no_aer and not own:
        return schema.result(
            check,
            schema.SKIP,
            "; ".join([f"no fabric counters to read: no InfiniBand ({no_ib})", f"no AER counts ({no_aer})", *mine]),
            detail=detail,
        )
    parts = [
        f"{len(ports)} InfiniBand port(s)" if ports else f"no InfiniBand ({no_ib})",
        f"AER counts of {n_aer} PCIe device(s) (GPUs, HCAs and the bridges above them)"
        if n_aer
        else f"no AER counts ({no_aer})",
    ]
    kinds = [d["kind"] for d in own]
    parts += [f"EDAC memory errors of {kinds.count('edac')} DIMM(s) or controller(s)"] if "edac" in kinds else []
    parts += [f"the health log of {kinds.count('nvme')} NVMe drive(s)"] if "nvme" in kinds else []
    parts += mine
    reason = f"fabric counters read {phase} the benchmarks: " + "; ".join(parts)
    if detail["unreadable"]:
        reason += f"; {len(detail['unreadable'])} unreadable, named in detail.unreadable"
    return schema.result(check, schema.PASS, reason, value=len(detail["devices"]), unit="devices", detail=detail)
