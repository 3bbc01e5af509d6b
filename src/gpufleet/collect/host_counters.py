"""The host's own error counters in the counter snapshots, beside the fabric's (collect.counters.fabric_snapshot):
each place EDAC counts memory errors (a DIMM, or a memory controller's errors on no DIMM) and each local NVMe drive,
as devices of the snapshot:

    {"id": "edac:mc0/dimm3", "kind": "edac", "name", "counters": {"edac_ce", "edac_ue"}}
    {"id": "nvme:<serial>", "kind": "nvme", "name", "controller", "model", "serial", "pci_bdf",
     "counters": {"nvme_media_errors", "nvme_error_log_entries", "nvme_unsafe_shutdowns", "nvme_percentage_used",
                  "nvme_available_spare_pct", "nvme_critical_warning", "nvme_temperature_c"}}

EDAC's counts start again at each boot; a drive's are its life's (fleet.counter_table.FABRIC_PERSISTENT).
"""

from __future__ import annotations

from gpufleet.collect.host.edac import error_places
from gpufleet.collect.host.nvme import drive_name

# snapshot counter <- the drive's health log field
NVME_COUNTERS = {
    "nvme_media_errors": "media_errors",
    "nvme_error_log_entries": "error_log_entries",
    "nvme_unsafe_shutdowns": "unsafe_shutdowns",
    "nvme_percentage_used": "percentage_used",
    "nvme_available_spare_pct": "available_spare_pct",
    "nvme_critical_warning": "critical_warning",
    "nvme_temperature_c": "temperature_c",
}


def devices(host: dict) -> tuple[list[dict], dict, dict]:
    """(devices, {"<id>.<counter>": why unreadable}, {"edac": why none, "nvme": why none}) of the host readings'
    `edac` and `nvme` sections."""
    out, unreadable, none = [], {}, {}
    edac = host.get("edac")
    if not isinstance(edac, dict):
        none["edac"] = "the readings hold no 'edac' section (recorded before EDAC was read)"
    elif not edac.get("present"):
        none["edac"] = edac.get("reason") or "no EDAC memory controller"
    else:
        for place in error_places(edac):
            counters = {"edac_ce": place["ce"], "edac_ue": place["ue"]}
            unreadable.update({f"{place['id']}.{c}": "EDAC count unreadable" for c, v in counters.items() if v is None})
            out.append({"id": place["id"], "kind": "edac", "name": place["name"], "counters": counters})
    nvme = host.get("nvme")
    if not isinstance(nvme, dict):
        none["nvme"] = "the readings hold no 'nvme' section (recorded before NVMe health was read)"
    elif not nvme.get("present"):
        none["nvme"] = nvme.get("reason") or "no NVMe drive"
    for d in (nvme or {}).get("drives") or []:
        ident = f"nvme:{d.get('serial') or d['controller']}"
        if d.get("log") is None:
            unreadable[f"{ident}.health_log"] = d.get("reason") or "health log not read"
            continue
        out.append(
            {
                "id": ident,
                "kind": "nvme",
                "name": f"NVMe {drive_name(d)}",
                **{k: d.get(k) for k in ("controller", "model", "serial", "pci_bdf")},
                "counters": {name: d["log"].get(field) for name, field in NVME_COUNTERS.items()},
            }
        )
    return out, unreadable, none
