"""A GPU's NVLinks through NVML: each link's state, peer and error counters, the all-links totals, and the
fabric registration (NVSwitch systems)."""

from __future__ import annotations

import ctypes

from gpufleet.collect.nvml.binding import bus_id, call_first, error_text, field_value, pynvml, read_field

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
NVLINK_COUNTERS = ("crc_flit", "crc_data", "replay", "recovery")


def read_fabric_state(handle) -> dict:
    def versioned():
        info = pynvml.c_nvmlGpuFabricInfo_v2_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        return info

    def legacy():
        info = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        return info

    info = call_first(
        (versioned if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV") else None,),
        (legacy if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfo") else None,),
    )
    status = "Success" if info.status == pynvml.NVML_SUCCESS else error_text(pynvml.NVMLError(info.status))
    return {"state": FABRIC_STATES.get(info.state, f"unknown ({info.state})"), "status": status}


def nvlink_counter_calls(handle, link: int, counter: str) -> list:
    """Ways to read one per-link error counter, best first.

    nvmlDeviceGetNvLinkErrorCounter works up to Hopper for most counters; the
    scoped NVML_FI_DEV_NVLINK_ERROR_DL_* field values and the per-link _Ln
    fields (links 0-11 only) cover what it does not.
    """
    const = {
        "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
        "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
        "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
        "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    }[counter]
    scoped = {"crc_flit": "CRC", "replay": "REPLAY", "recovery": "RECOVERY"}.get(counter)
    per_link = {
        "crc_flit": "CRC_FLIT_ERROR_COUNT",
        "crc_data": "CRC_DATA_ERROR_COUNT",
        "replay": "REPLAY_ERROR_COUNT",
        "recovery": "RECOVERY_ERROR_COUNT",
    }[counter]
    calls = [(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, getattr(pynvml, const))]
    if scoped and hasattr(pynvml, f"NVML_FI_DEV_NVLINK_ERROR_DL_{scoped}"):
        calls.append((field_value, handle, getattr(pynvml, f"NVML_FI_DEV_NVLINK_ERROR_DL_{scoped}"), link))
    if hasattr(pynvml, f"NVML_FI_DEV_NVLINK_{per_link}_L{link}"):
        calls.append((field_value, handle, getattr(pynvml, f"NVML_FI_DEV_NVLINK_{per_link}_L{link}")))
    return calls


def nvlink_links(handle, unreadable: dict) -> list:
    links, first_error = [], None
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state, err = read_field(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if err:  # NOT_SUPPORTED / INVALID_ARGUMENT: this GPU has no such link
            first_error = first_error or err
            continue
        entry = {"link": link, "active": state == pynvml.NVML_FEATURE_ENABLED, "remote_pci_bus_id": None, "errors": {}}
        if entry["active"]:
            pci, err = read_field(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            entry["remote_pci_bus_id"] = bus_id(pci.busId) if pci is not None else None
            if err:
                unreadable.setdefault("nvlink.remote_pci_bus_id", err)
        for counter in NVLINK_COUNTERS:
            value, err = read_field(call_first, *nvlink_counter_calls(handle, link, counter))
            entry["errors"][counter] = value
            if err:
                unreadable.setdefault(f"nvlink.errors.{counter}", err)
        links.append(entry)
    if not links and first_error:
        unreadable["nvlink"] = first_error
    return links


def nvlink_totals(handle, unreadable: dict) -> dict:
    totals = {}
    for counter, name in (
        ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
        ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ):
        totals[counter], err = read_field(field_value, handle, getattr(pynvml, name))
        if err:
            unreadable[f"nvlink_error_totals.{counter}"] = err
    return totals


def nvlink_link_counts(gpu: dict) -> dict | None:
    """{link: {counter: count}} of the links whose counters read one by one (NVLINK_COUNTERS), the link as a string
    (a JSON key); None where none did."""
    out = {}
    for link in gpu.get("nvlink") or []:
        errors = {c: v for c, v in (link.get("errors") or {}).items() if c in NVLINK_COUNTERS and v is not None}
        if errors:
            out[str(link.get("link"))] = errors
    return out or None


def nvlink_error_counts(gpu: dict) -> tuple[dict, str]:
    """A GPU's NVLink error counts (NVLINK_COUNTERS), summed over its links, else the all-links totals.

    Returns (counts, source); a count no counter could give is None, never a made-up zero.
    """
    links = gpu.get("nvlink") or []
    per_link = {c: [(link.get("errors") or {}).get(c) for link in links] for c in NVLINK_COUNTERS}
    if any(v is not None for vals in per_link.values() for v in vals):
        counts = {
            c: sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
            for c, vals in per_link.items()
        }
        return counts, "per-link counters"
    totals = gpu.get("nvlink_error_totals") or {}
    if any(totals.get(c) is not None for c in NVLINK_COUNTERS):
        return {c: totals.get(c) for c in NVLINK_COUNTERS}, "all-links totals"
    return dict.fromkeys(NVLINK_COUNTERS), "no error counter readable"
