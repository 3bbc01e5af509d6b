"""The GPU's links: PCIe generation and width, NVLinks active alike and the fabric registered."""

from __future__ import annotations

from gpufleet.base import host_platform, profiles
from gpufleet.checks.gpu_health import c2c
from gpufleet.checks.gpu_inventory import UNREADABLE_REMEDY, Findings, gpu_check, unreadable
from gpufleet.collect.nvml.nvlinks import nvlink_error_counts
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, WARN, result


def _idle(g: dict) -> bool:
    """Idle GPUs drop their PCIe link to a lower generation to save power."""
    return (g.get("pstate") is not None and g["pstate"] >= 8) or g.get("utilization_gpu_pct") == 0


@gpu_check("pcie_link")
def pcie_link(readings, gpus, profile):
    """PCIe link width and generation against what the GPU and slot can do; a GPU on NVLink-C2C (a Grace superchip),
    its C2C links' state and speed instead (gpu_health/c2c.py)."""
    gen_min = profiles.value(profile, "pcie_gen_min")
    width_min = profiles.value(profile, "pcie_width_min")
    reseat = (
        "a link trained below its maximum: reseat the GPU or its riser/cable, check the slot and the BIOS PCIe "
        "settings; `lspci -vv` shows LnkCap and LnkSta"
    )
    f = Findings()
    per_gpu = []
    on_c2c = [g for g in gpus if host_platform.gpu_host_link(g) == host_platform.C2C]
    fastest = c2c.fastest_link_gbps(on_c2c)
    for g in gpus:
        if g in on_c2c:
            per_gpu.append(c2c.findings(f, g, fastest))
            continue
        i, p = g["index"], g.get("pcie") or {}
        per_gpu.append(
            {"index": i, **p, "pstate": g.get("pstate"), "utilization_gpu_pct": g.get("utilization_gpu_pct")}
        )
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
    if gen_min is None and len(on_c2c) < len(gpus):
        f.add(
            WARN,
            "no minimum PCIe generation set (pcie_gen_min)",
            remedy="set gpufleet_thresholds.pcie_gen_min or use a GPU profile",
        )
    links = sorted({f"gen {p.get('gen_max')} x{p.get('width_current')}" for p in per_gpu if "c2c" not in p})
    said = ([f"PCIe links at full width ({', '.join(links)})"] if links else []) + (
        [c2c.summary(on_c2c, fastest)] if on_c2c else []
    )
    return f.result(
        "pcie_link",
        "; ".join(said),
        threshold=profiles.threshold(profile, "pcie_gen_min", width_min=width_min),
        detail={"per_gpu": per_gpu},
    )


# Where the cumulative NVLink error counts are judged: as rates during the node stage, since the previous run and
# during a soak (fleet.counters_*, benchmark.soak_errors), by one rule.
COUNTER_RATES = "checks.counter_rates"


@gpu_check("nvlink")
def nvlink(readings, gpus, profile):
    """NVLink: every GPU with the same number of active links and the fabric registered.

    The CRC, replay and recovery counters are cumulative since the driver loaded: a count alone says
    nothing about a link today. They are kept in detail and judged as rates (during the node stage, since the
    node's previous run and during a soak) by checks.counter_rates' rule.
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
                PASS,
                f"{len(gpus)} of {gpus_expected} GPUs present, so links compared between GPUs, not with {per_link_expected}",
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
    f.add(PASS, f"NVLink error counts in detail ({counted}), judged as rates by {COUNTER_RATES}")
    return f.result(
        "nvlink",
        f"{target} active NVLinks on each of {len(gpus)} GPUs",
        value=min(counts),
        unit="links",
        threshold=profiles.threshold(profile, "nvlink_links_per_gpu"),
        detail={"per_gpu": per_gpu, "error_counts_judged_by": COUNTER_RATES},
    )
