"""Xid events: the faults the driver logged in this boot's kernel log (collect.kernel_log)."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.checks.gpu_inventory import Findings, gpu_check
from gpufleet.base.schema import ERROR, FAIL, SKIP, WARN, result


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
        text = (
            f"Xid {code}{times} at {pci}"
            if index is not None
            else f"PCI {pci} (not among the GPUs NVML sees): Xid {code}{times}"
        )
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
