"""GPU health: memory errors, Xid events, throttling, temperature, power, PCIe, NVLink and GPU processes.

Pure functions of the NVML readings (collect.nvml), the kernel log readings
(collect.kernel_log) and the profile. Readings are a snapshot: a throttle or
link-speed check sees the GPU as it was at that instant, so idle GPUs are
judged as idle.
"""

from __future__ import annotations

from gpufleet import profiles
from gpufleet.checks.gpu_inventory import UNREADABLE_REMEDY, Findings, gpu_check, gpu_list, not_supported, unreadable
from gpufleet.collect.nvml.clocks import CLOCK_EVENT_BITS, HW_SLOWDOWN_EVENTS
from gpufleet.collect.nvml.links import nvlink_error_counts
from gpufleet.collect.nvml.processes import visible_indices
from gpufleet.schema import ERROR, FAIL, PASS, SKIP, WARN, result

RESET_REMEDY = "drain the node, then reset the GPU with no process on it: `nvidia-smi -r -i {gpus}`"


def _ecc_unreadable(g: dict, fields: tuple) -> str | None:
    missing = [f for f in fields if g.get(f) is None]
    return f"{', '.join(missing)} unreadable ({unreadable(g, missing[0])})" if missing else None


@gpu_check("ecc")
def ecc(readings, gpus, profile):
    """ECC mode on; uncorrectable errors since the driver loaded fail, lifetime ones warn."""
    vol_max = profiles.value(profile, "ecc_volatile_uncorrected_max")
    agg_max = profiles.value(profile, "ecc_aggregate_uncorrected_max")
    counters = ("ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected", "ecc_aggregate_corrected")
    f = Findings()
    per_gpu, facts = [], {}
    for g in gpus:
        i = g["index"]
        per_gpu.append({"index": i, "ecc_mode_current": g.get("ecc_mode_current"), **{c: g.get(c) for c in counters}})
        mode = g.get("ecc_mode_current")
        if mode is None:
            f.add(ERROR, f"ECC mode unreadable ({unreadable(g, 'ecc_mode_current')})", gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        if not mode:
            f.add(FAIL, "ECC off", gpu=i, remedy="enable ECC: `nvidia-smi -i {gpus} -e 1`, then reset the GPU or reboot")
            continue
        missing = _ecc_unreadable(g, ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"))
        if missing:
            f.add(ERROR, missing, gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        vol, agg = g["ecc_volatile_uncorrected"], g["ecc_aggregate_uncorrected"]
        if vol_max is not None and vol > vol_max:
            f.add(
                FAIL,
                f"{vol} volatile uncorrectable ECC errors",
                gpu=i,
                remedy=RESET_REMEDY + "; if uncorrectable errors come back, replace the GPU (RMA)",
            )
        if agg_max is not None and agg > agg_max:
            # A stable fact of this GPU: once a baseline run accepted it, only a change warns (fleet/facts.py).
            facts[f"ecc_aggregate_uncorrected:{g.get('uuid') or i}"] = agg
            f.add(
                WARN,
                f"{agg} uncorrectable ECC errors over its lifetime",
                gpu=i,
                remedy="watch the GPU: check row_remapping for pending or failed remaps and the Xid log for 48/63/64",
            )
    vols = [p["ecc_volatile_uncorrected"] for p in per_gpu if p["ecc_volatile_uncorrected"] is not None]
    corrected = sum(p["ecc_volatile_corrected"] or 0 for p in per_gpu)
    return f.result(
        "ecc",
        f"ECC on, no uncorrectable errors ({corrected} corrected since the driver loaded, all GPUs)",
        value=max(vols) if vols else None,
        unit="errors",
        threshold=profiles.threshold(profile, "ecc_volatile_uncorrected_max", aggregate_max=agg_max),
        detail={"per_gpu": per_gpu, **({"facts": facts} if facts else {})},
    )


@gpu_check("row_remapping")
def row_remapping(readings, gpus, profile):
    """Ampere and later repair HBM rows: a pending remap needs a reset, a failed one a new GPU."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, rows = g["index"], g.get("remapped_rows")
        per_gpu.append({"index": i, "remapped_rows": rows})
        if rows is None and not_supported(g, "remapped_rows"):
            f.add(SKIP, "row remapping not supported (pre-Ampere GPU; see retired_pages)", gpu=i)
        elif rows is None:
            f.add(ERROR, f"remapped rows unreadable ({unreadable(g, 'remapped_rows')})", gpu=i, remedy=UNREADABLE_REMEDY)
        else:
            if rows.get("failure"):
                f.add(FAIL, "row remapping failed", gpu=i, remedy="GPU needs replacement (RMA): it ran out of spare rows")
            if rows.get("pending"):
                f.add(
                    FAIL,
                    "row remap pending",
                    gpu=i,
                    remedy="reset the GPU to apply the remap: `nvidia-smi -r -i {gpus}` with no process on it",
                )
    total = sum((p["remapped_rows"] or {}).get("uncorrectable") or 0 for p in per_gpu)
    return f.result(
        "row_remapping",
        f"no pending or failed row remaps ({total} rows remapped for uncorrectable errors, all GPUs)",
        value=total,
        unit="rows",
        detail={"per_gpu": per_gpu},
    )


@gpu_check("retired_pages")
def retired_pages(readings, gpus, profile):
    """Pre-Ampere GPUs retire memory pages; a pending retirement needs a reset."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, pages = g["index"], g.get("retired_pages")
        per_gpu.append({"index": i, "retired_pages": pages})
        if pages is None and not_supported(g, "retired_pages"):
            f.add(SKIP, "page retirement not used (Ampere and later remap rows instead; see row_remapping)", gpu=i)
        elif pages is None:
            f.add(ERROR, f"retired pages unreadable ({unreadable(g, 'retired_pages')})", gpu=i, remedy=UNREADABLE_REMEDY)
        elif pages.get("pending"):
            f.add(
                FAIL,
                "page retirement pending",
                gpu=i,
                remedy="reset the GPU to retire the pages: `nvidia-smi -r -i {gpus}` with no process on it",
            )
    total = sum(((p["retired_pages"] or {}).get("sbe") or 0) + ((p["retired_pages"] or {}).get("dbe") or 0) for p in per_gpu)
    return f.result(
        "retired_pages",
        f"no retirement pending ({total} pages retired, all GPUs)",
        value=total,
        unit="pages",
        detail={"per_gpu": per_gpu},
    )


@gpu_check("xid", needs_gpus=False)
def xid(readings, gpus, profile):
    """Xid events in this boot's kernel log: hardware codes fail, the rest warn."""
    fail_codes = set(profiles.value(profile, "xid_fail_codes") or [])
    log = readings.get("kernel_log")
    fields = dict(threshold=profiles.threshold(profile, "xid_fail_codes"))
    if not isinstance(log, dict) or not log.get("readable"):
        why = (log or {}).get("error") if isinstance(log, dict) else "the readings hold no 'kernel_log' section"
        if not gpus:
            return result("xid", SKIP, f"no GPU on this node and the kernel log is unreadable ({why})", **fields)
        return result(
            "xid",
            ERROR,
            f"could not verify: {why or 'kernel log unreadable'}",
            remedy="run the check as root so /dev/kmsg can be read, or allow dmesg (sysctl kernel.dmesg_restrict=0)",
            **fields,
        )
    by_pci = {(g.get("pci_bus_id") or "")[:-2]: g["index"] for g in gpus if g.get("pci_bus_id")}  # drop ".0"
    counts: dict[tuple, int] = {}
    for ev in log.get("xid_events") or []:
        counts[(ev.get("pci"), ev.get("xid"))] = counts.get((ev.get("pci"), ev.get("xid")), 0) + 1
    f = Findings()
    for (pci, code), n in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        times = f" x{n}" if n > 1 else ""
        index = by_pci.get(pci)
        text = f"Xid {code}{times} at {pci}" if index is not None else f"PCI {pci} (not among the GPUs NVML sees): Xid {code}{times}"
        if code in fail_codes:
            f.add(
                FAIL,
                text,
                gpu=index,
                remedy="drain the node; look the Xid up in NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors): "
                "most of these need a GPU reset or reboot, and a GPU that keeps raising them needs replacement",
            )
        else:
            f.add(
                WARN,
                text,
                gpu=index,
                remedy="look the Xid up in NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors); most other codes point to the application",
            )
    events = log.get("xid_events") or []
    return f.result(
        "xid",
        f"no Xid events in the kernel log ({log.get('source')}, {log.get('lines')} lines)",
        value=len(events),
        unit="events",
        detail={"source": log.get("source"), "events": events[:50], "events_total": len(events)},
        **fields,
    )


def _busy(g: dict) -> bool:
    names = (g.get("clock_event_reasons") or {}).get("names") or []
    return "gpu_idle" not in names and (g.get("utilization_gpu_pct") or 0) > 0


@gpu_check("clock_events")
def clock_events(readings, gpus, profile):
    """Clock event (throttle) reasons at read time: hardware slowdowns fail, a power cap under load warns."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, ev = g["index"], g.get("clock_event_reasons")
        per_gpu.append({"index": i, "clock_event_reasons": ev, "utilization_gpu_pct": g.get("utilization_gpu_pct")})
        if ev is None:
            f.add(
                ERROR, f"clock event reasons unreadable ({unreadable(g, 'clock_event_reasons')})", gpu=i, remedy=UNREADABLE_REMEDY
            )
            continue
        mask = ev.get("mask") or 0
        for name, label in HW_SLOWDOWN_EVENTS.items():
            if mask & CLOCK_EVENT_BITS[name]:
                f.add(
                    FAIL,
                    f"{label}",
                    gpu=i,
                    remedy="check cooling and power: inlet temperature, fans, PSUs and the BMC sensor log; "
                    "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {gpus}` shows which limit hit",
                )
        if mask & CLOCK_EVENT_BITS["sw_power_cap"]:
            if _busy(g):
                f.add(
                    WARN,
                    f"SW power cap while busy ({g.get('utilization_gpu_pct')}% utilization)",
                    gpu=i,
                    remedy="check the power limit (power_limit check) and the job's power draw",
                )
            else:
                f.add(PASS, "SW power cap while idle", gpu=i)
    return f.result("clock_events", "no hardware or thermal slowdown", detail={"per_gpu": per_gpu})


@gpu_check("temperature")
def temperature(readings, gpus, profile):
    """GPU temperature against the GPU's own slowdown threshold and the profile's margin; HBM against its limit."""
    warn_c = profiles.value(profile, "gpu_temperature_warn_c")
    mem_warn_c = profiles.value(profile, "memory_temperature_warn_c")
    cooling = "check airflow, fans and inlet temperature for this GPU's position in the chassis; check the BMC sensor log"
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, t, slow, mem_t = g["index"], g.get("temperature_c"), g.get("temperature_slowdown_c"), g.get("memory_temperature_c")
        per_gpu.append(
            {
                "index": i,
                "temperature_c": t,
                "temperature_slowdown_c": slow,
                "memory_temperature_c": mem_t,
                "temperature_shutdown_c": g.get("temperature_shutdown_c"),
            }
        )
        if t is None:
            f.add(ERROR, f"temperature unreadable ({unreadable(g, 'temperature_c')})", gpu=i, remedy=UNREADABLE_REMEDY)
        elif slow is not None and t >= slow:
            f.add(FAIL, f"{t} C, at or above its slowdown threshold {slow} C", gpu=i, remedy=cooling)
        elif warn_c is not None and t >= warn_c:
            f.add(WARN, f"{t} C >= {warn_c} C", gpu=i, remedy=cooling)
        if mem_t is not None and mem_warn_c is not None and mem_t >= mem_warn_c:
            f.add(WARN, f"memory {mem_t} C >= {mem_warn_c} C", gpu=i, remedy=cooling)
    temps = [p["temperature_c"] for p in per_gpu if p["temperature_c"] is not None]
    mems = [p["memory_temperature_c"] for p in per_gpu if p["memory_temperature_c"] is not None]
    ok = f"hottest GPU {max(temps) if temps else None} C" + (
        f", hottest memory {max(mems)} C" if mems else ", memory temperature not reported"
    )
    return f.result(
        "temperature",
        ok,
        value=max(temps) if temps else None,
        unit="C",
        threshold=profiles.threshold(
            profile, "gpu_temperature_warn_c", memory_warn_c=mem_warn_c, fail="the GPU's slowdown threshold"
        ),
        detail={"per_gpu": per_gpu},
    )


@gpu_check("power_limit")
def power_limit(readings, gpus, profile):
    """The enforced power limit against the board default: a lowered cap costs throughput."""
    min_ratio = profiles.value(profile, "power_limit_min_ratio")
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, limit, default = g["index"], g.get("power_limit_w"), g.get("power_default_limit_w")
        ratio = round(limit / default, 3) if limit is not None and default else None
        per_gpu.append(
            {
                "index": i,
                "power_limit_w": limit,
                "power_default_limit_w": default,
                "power_draw_w": g.get("power_draw_w"),
                "ratio": ratio,
            }
        )
        if ratio is None:
            field = "power_limit_w" if limit is None else "power_default_limit_w"
            f.add(ERROR, f"power limits unreadable ({unreadable(g, field)})", gpu=i, remedy=UNREADABLE_REMEDY)
        elif min_ratio is not None and ratio < min_ratio:
            f.add(
                FAIL,
                f"enforced power limit {limit:g} W is {ratio:.0%} of the default {default:g} W",
                gpu=i,
                remedy="restore the default limit (`nvidia-smi -i {gpus} -pl <default W>`) and look for a site or BMC power cap",
            )
    if min_ratio is None:
        f.add(WARN, "no minimum ratio set (power_limit_min_ratio)", remedy="set gpufleet_thresholds.power_limit_min_ratio")
    ratios = [p["ratio"] for p in per_gpu if p["ratio"] is not None]
    lowest = min(ratios) if ratios else None
    return f.result(
        "power_limit",
        f"enforced power limits at {lowest:.0%} or more of the default" if ratios else "no power limit read",
        value=lowest,
        unit="ratio",
        threshold=profiles.threshold(profile, "power_limit_min_ratio"),
        detail={"per_gpu": per_gpu},
    )


def _idle(g: dict) -> bool:
    """Idle GPUs drop their PCIe link to a lower generation to save power."""
    return (g.get("pstate") is not None and g["pstate"] >= 8) or g.get("utilization_gpu_pct") == 0


@gpu_check("pcie_link")
def pcie_link(readings, gpus, profile):
    """PCIe link width and generation against what the GPU and slot can do."""
    gen_min = profiles.value(profile, "pcie_gen_min")
    width_min = profiles.value(profile, "pcie_width_min")
    reseat = (
        "a link trained below its maximum: reseat the GPU or its riser/cable, check the slot and the BIOS PCIe "
        "settings; `lspci -vv` shows LnkCap and LnkSta"
    )
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, p = g["index"], g.get("pcie") or {}
        per_gpu.append({"index": i, **p, "pstate": g.get("pstate"), "utilization_gpu_pct": g.get("utilization_gpu_pct")})
        missing = [k for k in ("gen_current", "gen_max", "width_current", "width_max") if p.get(k) is None]
        if missing:
            f.add(
                ERROR,
                f"PCIe {', '.join(missing)} unreadable ({unreadable(g, 'pcie.' + missing[0])})",
                gpu=i,
                remedy=UNREADABLE_REMEDY,
            )
            continue
        if p["width_current"] < p["width_max"]:
            f.add(FAIL, f"PCIe link x{p['width_current']} of x{p['width_max']}", gpu=i, remedy=reseat)
        elif width_min is not None and p["width_current"] < width_min:
            f.add(FAIL, f"PCIe link x{p['width_current']} < x{width_min}", gpu=i, remedy=reseat)
        if gen_min is not None and p["gen_max"] < gen_min:
            gpu_max = f" (GPU can do gen {p['gen_gpu_max']})" if p.get("gen_gpu_max") else ""
            f.add(
                FAIL,
                f"PCIe link can reach only gen {p['gen_max']}{gpu_max}, below gen {gen_min}: slot or link trained down",
                gpu=i,
                remedy=reseat,
            )
        if p["gen_current"] < p["gen_max"]:
            if _idle(g):
                f.add(
                    PASS,
                    f"gen {p['gen_current']} of {p['gen_max']} while idle (idle GPUs lower their link speed to save power)",
                    gpu=i,
                )
            else:
                f.add(
                    WARN,
                    f"PCIe gen {p['gen_current']} of {p['gen_max']} while busy",
                    gpu=i,
                    remedy="re-check under load; a busy GPU should run its link at full speed. " + reseat,
                )
    if gen_min is None:
        f.add(
            WARN,
            "no minimum PCIe generation set (pcie_gen_min)",
            remedy="set gpufleet_thresholds.pcie_gen_min or use a GPU profile",
        )
    links = sorted({f"gen {p.get('gen_max')} x{p.get('width_current')}" for p in per_gpu})
    return f.result(
        "pcie_link",
        f"PCIe links at full width ({', '.join(links)})",
        threshold=profiles.threshold(profile, "pcie_gen_min", width_min=width_min),
        detail={"per_gpu": per_gpu},
    )


# Where the cumulative NVLink error counts are judged: as growth per hour between runs and during a run.
COUNTER_RATES = "fleet.counter_rates"


@gpu_check("nvlink")
def nvlink(readings, gpus, profile):
    """NVLink: every GPU with the same number of active links and the fabric registered.

    The CRC, replay and recovery counters are cumulative since the driver loaded: a count alone says
    nothing about a link today. They are kept in detail and judged as rates (growth per hour since the
    node's previous run and during this run) by the fleet layer, fleet.counter_rates.
    """
    if len(gpus) < 2:
        return result("nvlink", SKIP, "single GPU: NVLink has no peer here")
    per_link_expected = profiles.value(profile, "nvlink_links_per_gpu")
    gpus_expected = profiles.value(profile, "gpus_expected")
    link_remedy = (
        "reset the GPUs or reboot; a link that stays down needs the baseboard or NVSwitch tray serviced; "
        "`nvidia-smi nvlink -s -i {gpus}` shows each link"
    )
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, links = g["index"], g.get("nvlink") or []
        active = sum(1 for link in links if link.get("active"))
        errors, source = nvlink_error_counts(g)
        crc = [errors[c] for c in ("crc_flit", "crc_data") if errors[c] is not None]
        fabric = g.get("fabric")
        per_gpu.append(
            {
                "index": i,
                "links": len(links),
                "active": active,
                "inactive_links": [link["link"] for link in links if not link.get("active")],
                "crc_errors": sum(crc) if crc else None,
                "crc_source": source,
                "fabric": fabric,
                "errors": errors,
            }
        )
        if active == 0:
            why = f" ({unreadable(g, 'nvlink')})" if not links else ""
            f.add(FAIL, f"no active NVLink{why}", gpu=i, remedy=link_remedy)
        if isinstance(fabric, dict) and fabric.get("state") not in (None, "not_supported"):
            if fabric["state"] != "completed":
                f.add(
                    FAIL,
                    f"NVLink fabric {fabric['state'].replace('_', ' ')}",
                    gpu=i,
                    remedy="start nvidia-fabricmanager (bringup.yml) and wait for the GPUs to register; read its log",
                )
            elif fabric.get("status") not in (None, "Success"):
                f.add(
                    FAIL,
                    f"NVLink fabric registration failed: {fabric['status']}",
                    gpu=i,
                    remedy="read the nvidia-fabricmanager log, restart it and reset the GPUs",
                )
    counts = [p["active"] for p in per_gpu]
    if per_link_expected is not None and gpus_expected is not None and len(gpus) == gpus_expected:
        target, against = per_link_expected, f"expected {per_link_expected}"
    else:
        target = max(set(counts), key=counts.count)  # the most common count
        against = f"the other GPUs have {target}"
        if per_link_expected is None:
            f.add(PASS, "links per GPU not set (nvlink_links_per_gpu), so only compared between GPUs")
        else:
            f.add(
                PASS, f"{len(gpus)} of {gpus_expected} GPUs present, so links compared between GPUs, not with {per_link_expected}"
            )
    for p in per_gpu:
        if 0 < p["active"] != target:
            f.add(FAIL, f"{p['active']} active NVLinks, {against}", gpu=p["index"], remedy=link_remedy)
    crcs = [(p["crc_errors"], p["index"]) for p in per_gpu if p["crc_errors"] is not None]
    if crcs:
        most, where = max(crcs)
        counted = f"CRC up to {most}, GPU {where}" if most else "no CRC errors counted"
    else:
        counted = "no CRC counter readable"
    f.add(PASS, f"NVLink error counts in detail ({counted}), judged as rates in {COUNTER_RATES}")
    return f.result(
        "nvlink",
        f"{target} active NVLinks on each of {len(gpus)} GPUs",
        value=min(counts),
        unit="links",
        threshold=profiles.threshold(profile, "nvlink_links_per_gpu"),
        detail={"per_gpu": per_gpu, "error_counts_judged_by": COUNTER_RATES},
    )


PROCESS_REMEDY = (
    "stop the processes named, or drain the node (Slurm: `scontrol update NodeName=<node> State=DRAIN "
    "Reason=validation`) and let its jobs end, then validate again: benchmark figures taken beside another "
    "workload are not the node's; `nvidia-smi -i {gpus}` lists the processes"
)


@gpu_check("processes")
def processes(readings, gpus, profile):
    """No process on any GPU this node's jobs may use (CUDA_VISIBLE_DEVICES), before the benchmarks run."""
    cvd = readings["nvml"].get("cuda_visible_devices")
    vis = visible_indices(gpus, cvd)
    judged = [g for g in gpus if g["index"] in set(vis["indices"])]
    visibility = {k: vis[k] for k in ("cuda_visible_devices", "indices", "all", "resolved", "note")}
    if not judged:
        return result(
            "processes",
            SKIP,
            f"CUDA_VISIBLE_DEVICES={cvd!r} leaves no GPU to this node, so there is none to judge",
            detail={"visibility": visibility},
        )
    f = Findings()
    listing = []
    for g in judged:
        i, procs = g["index"], g.get("processes")
        if procs is None:
            f.add(ERROR, f"GPU processes unreadable ({unreadable(g, 'processes')})", gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        for p in procs:
            listing.append({"index": i, "uuid": g.get("uuid"), **p})
            name = p.get("name") or "name unknown: not in this host's /proc"
            mem = f"{p['used_memory_mib']} MiB" if p.get("used_memory_mib") is not None else "memory not reported"
            f.add(FAIL, f"pid {p['pid']} ({name}, {mem})", gpu=i, remedy=PROCESS_REMEDY)
    if vis["note"]:
        f.add(PASS, vis["note"])
    n = len(judged)
    res = f.result(
        "processes",
        f"no process on the {n} GPU{'s' if n != 1 else ''} of this node" + ("" if vis["all"] else f" ({gpu_list(vis['indices'])})"),
        value=len(listing),
        unit="processes",
        detail={"processes": listing, "visibility": visibility},
    )
    if not vis["resolved"] and res["status"] != PASS:  # a passing reason carries the note already
        return res.replace(reason=f"{res['reason']}; {vis['note']}")
    return res
