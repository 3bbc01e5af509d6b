"""Read the GPUs through NVML (the `pynvml` module of the nvidia-ml-py package).

read() never raises. Every field is read on its own: a field the GPU or driver
does not support (or any other NVML error on it) reads as None, and the GPU's
"unreadable" map says why, so a check can name the reason. The result is
plain JSON, so `gpufleet collect` output can be recorded and replayed.

Without a driver:

    {"available": False, "error": "no NVIDIA driver: libnvidia-ml.so not found", "gpus": []}

With a driver:

    {"available": True, "error": None,
     "driver_version": "535.183.01", "cuda_driver_version": "12.2", "nvml_version": "12.535.183.01",
     "binding_version": "13.615.71",          # nvidia-ml-py that read it
     "cuda_visible_devices": "0,1" | None,    # this process's CUDA_VISIBLE_DEVICES (visible_indices())
     "unreadable": {field: "error text"},     # system-level fields that failed
     "gpus": [GPU, ...]}

GPU (keys in GPU_FIELDS; any value may be None, then "unreadable" says why):

    index                   int, NVML index
    name, uuid, serial      str ("NVIDIA H100 80GB HBM3", "GPU-...", "1654...")
    pci_bus_id              str, "0000:18:00.0" (lower case, 4-digit domain)
    memory_total_mib        int
    vbios_version           str
    inforom_image_version   str, the GPU firmware's InfoROM image (nvmlDeviceGetInforomImageVersion)
    persistence_mode        bool
    mig_mode_current        bool (None with "Not Supported" on GPUs without MIG)
    compute_mode            str: Default, Exclusive_Thread, Prohibited, Exclusive_Process
    ecc_mode_current        bool
    ecc_volatile_uncorrected, ecc_volatile_corrected,
    ecc_aggregate_uncorrected, ecc_aggregate_corrected       int (nvmlDeviceGetTotalEccErrors)
    remapped_rows           {"correctable": int, "uncorrectable": int, "pending": bool, "failure": bool}
    retired_pages           {"sbe": int, "dbe": int, "pending": bool}; None on Ampere and later
                            (they remap rows instead), with "Not Supported" in unreadable
    temperature_c, temperature_slowdown_c, temperature_shutdown_c   int, GPU die
    memory_temperature_c    int, HBM (field value NVML_FI_DEV_MEMORY_TEMP)
    power_draw_w, power_limit_w (enforced), power_default_limit_w   float
    pstate                  int, 0 (max performance) .. 15
    utilization_gpu_pct     int
    clock_event_reasons     {"mask": int, "names": [str]}; names from CLOCK_EVENT_BITS
    pcie                    {"gen_current", "gen_max" (link max: lower of GPU and slot),
                             "gen_gpu_max", "width_current", "width_max"}: int or None each
    nvlink                  [{"link": int, "active": bool, "remote_pci_bus_id": str|None,
                              "errors": {"crc_flit", "crc_data", "replay", "recovery"}: int|None}]
                            one entry per link the GPU has; [] when it has none
    nvlink_error_totals     {"crc_flit", "crc_data", "replay", "recovery"}: int|None, the
                            all-links *_TOTAL field values (kept where per-link counters fail)
    fabric                  {"state": "not_supported"|"not_started"|"in_progress"|"completed",
                             "status": "Success" or the NVML error text}
    pcie_replay             int, PCIe replay counter (nvmlDeviceGetPcieReplayCounter)
    processes               [{"pid": int, "name": str|None, "used_memory_mib": int|None,
                              "kinds": ["compute", "graphics"]}], one entry per pid, sorted by pid:
                            NVML's compute and graphics running processes. name is
                            /proc/<pid>/comm, else the first word of its cmdline; None when
                            /proc has no such pid (a process of another pid namespace).
                            used_memory_mib is None where the driver does not report it.
                            None when the compute list is unreadable; a graphics list
                            that fails is named as "processes.graphics"
    unreadable              {field: "error text"}; nested fields as "pcie.gen_max",
                            "nvlink.errors.crc_data", "nvlink_error_totals.replay"
"""

from __future__ import annotations

import os
from pathlib import Path

MIB = 1024 * 1024
NO_DRIVER = "no NVIDIA driver: libnvidia-ml.so not found"
INIT_FAILED = "NVML init failed"

# fmt: off
GPU_FIELDS = (
    "index", "name", "uuid", "serial", "pci_bus_id", "memory_total_mib", "vbios_version", "inforom_image_version",
    "persistence_mode", "mig_mode_current", "compute_mode", "ecc_mode_current",
    "ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected", "ecc_aggregate_corrected",
    "remapped_rows", "retired_pages",
    "temperature_c", "temperature_slowdown_c", "temperature_shutdown_c", "memory_temperature_c",
    "power_draw_w", "power_limit_w", "power_default_limit_w", "pstate", "utilization_gpu_pct",
    "clock_event_reasons", "pcie", "nvlink", "nvlink_error_totals", "fabric", "pcie_replay", "processes",
    "unreadable",
)
# fmt: on

# NVML's clocks event (throttle) reason bits, named as the checks and reports use them.
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Reasons that mean the hardware is protecting itself: clocks cut below what the job asked for.
HW_SLOWDOWN_EVENTS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
    "sw_thermal_slowdown": "SW thermal slowdown",
}

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
NVLINK_COUNTERS = ("crc_flit", "crc_data", "replay", "recovery")


def driver_unusable(reading: dict) -> bool:
    """Whether a reading says the driver itself is missing or will not start (libnvidia-ml.so not found, nvmlInit
    failing: driver not loaded, library and kernel module of different versions), not that the binding is missing."""
    error = str(reading.get("error") or "")
    return not reading.get("available") and (error == NO_DRIVER or error.startswith(INIT_FAILED))


def error_text(exc: Exception) -> str:
    try:
        text = str(exc)
    except Exception:  # str() of an NVMLError can call back into NVML
        text = ""
    return text or type(exc).__name__


def read_field(fn, *args):
    """(value, None) or (None, "error text"): one field never sinks the others."""
    import pynvml

    try:
        return fn(*args), None
    except pynvml.NVMLError as exc:
        return None, error_text(exc)
    except Exception as exc:  # binding/driver mismatch (ctypes, missing symbol): record it too
        return None, f"{type(exc).__name__}: {error_text(exc)}"


def call_first(*calls):
    """Call (fn, *args) in turn, for functions that newer bindings or drivers renamed.

    Returns the first success; raises the first error. A None fn (a name the
    installed binding lacks) is passed over.
    """
    first = None
    for fn, *args in calls:
        if fn is None:
            continue
        try:
            return fn(*args)
        except Exception as exc:
            first = first or exc
    raise first or RuntimeError("the installed nvidia-ml-py has no function for this field")


def bus_id(raw) -> str | None:
    """NVML's "00000000:18:00.0" -> "0000:18:00.0", the form lspci and sysfs use."""
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    raw = (raw or "").strip().lower()
    if not raw:
        return None
    domain, _, rest = raw.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else raw


def cuda_version(value: int) -> str:
    """NVML's 13000 -> "13.0", 12020 -> "12.2"."""
    return f"{value // 1000}.{value % 1000 // 10}"


def as_text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def field_value(handle, field_id: int, scope_id: int = 0):
    """One NVML field value as a Python number; raises NVMLError like the other calls."""
    import pynvml

    (val,) = pynvml.nvmlDeviceGetFieldValues(handle, [(field_id, scope_id)])
    if val.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(val.nvmlReturn)
    member = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(val.valueType, "ullVal")
    return getattr(val.value, member)


def _compute_mode_name(mode: int) -> str:
    return COMPUTE_MODES.get(mode, f"unknown ({mode})")


def clock_events(handle) -> dict:
    import pynvml

    mask = call_first(
        (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None), handle),
        (getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None), handle),
    )
    return {"mask": int(mask), "names": [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]}


def read_remapped_rows(handle) -> dict:
    import pynvml

    corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    return {"correctable": corr, "uncorrectable": unc, "pending": bool(pending), "failure": bool(failure)}


def _retired_pages(handle) -> dict:
    import pynvml

    sbe = pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    return {"sbe": len(sbe), "dbe": len(dbe), "pending": pending == pynvml.NVML_FEATURE_ENABLED}


def _fabric(handle) -> dict:
    import ctypes

    import pynvml

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


def nvlink_counter_calls(pynvml, handle, link: int, counter: str) -> list:
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
    import pynvml

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
            value, err = read_field(call_first, *nvlink_counter_calls(pynvml, handle, link, counter))
            entry["errors"][counter] = value
            if err:
                unreadable.setdefault(f"nvlink.errors.{counter}", err)
        links.append(entry)
    if not links and first_error:
        unreadable["nvlink"] = first_error
    return links


def nvlink_totals(handle, unreadable: dict) -> dict:
    import pynvml

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


def nvlink_error_counts(gpu: dict) -> tuple[dict, str]:
    """A GPU's NVLink error counts (NVLINK_COUNTERS), summed over its links, else the all-links totals.

    Returns (counts, source); a count no counter could give is None, never a made-up zero.
    """
    links = gpu.get("nvlink") or []
    per_link = {c: [(link.get("errors") or {}).get(c) for link in links] for c in NVLINK_COUNTERS}
    if any(v is not None for vals in per_link.values() for v in vals):
        counts = {c: sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
                  for c, vals in per_link.items()}
        return counts, "per-link counters"
    totals = gpu.get("nvlink_error_totals") or {}
    if any(totals.get(c) is not None for c in NVLINK_COUNTERS):
        return {c: totals.get(c) for c in NVLINK_COUNTERS}, "all-links totals"
    return dict.fromkeys(NVLINK_COUNTERS), "no error counter readable"


def process_name(pid: int, proc_root: str = "/proc") -> str | None:
    """/proc/<pid>/comm, else the first word of its cmdline (basename); None when neither is there."""
    base = Path(proc_root) / str(pid)
    try:
        name = (base / "comm").read_text(errors="replace").strip()
        if name:
            return name
    except OSError:
        pass
    try:
        first = (base / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        return None
    return os.path.basename(first.split()[0]) if first.split() else None


def _process_list(kind: str, handle) -> list:
    import pynvml

    fn = {"compute": "nvmlDeviceGetComputeRunningProcesses", "graphics": "nvmlDeviceGetGraphicsRunningProcesses"}[kind]
    # Newer bindings call the _v3 entry point, which older drivers lack: fall back to _v2.
    return call_first(
        (getattr(pynvml, fn, None), handle),
        (getattr(pynvml, f"{fn}_v3", None), handle),
        (getattr(pynvml, f"{fn}_v2", None), handle),
    )


def gpu_processes(handle, unreadable: dict) -> list | None:
    """Processes on one GPU (compute and graphics), one entry per pid."""
    found: dict[int, dict] = {}
    for kind in ("compute", "graphics"):
        procs, err = read_field(_process_list, kind, handle)
        if err:
            if kind == "compute":  # without the compute list the GPU cannot be called idle
                unreadable["processes"] = err
                return None
            unreadable["processes.graphics"] = err
            continue
        for proc in procs or []:
            pid = int(proc.pid)
            entry = found.setdefault(pid, {"pid": pid, "name": process_name(pid), "used_memory_mib": None, "kinds": []})
            if kind not in entry["kinds"]:
                entry["kinds"].append(kind)
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None:
                entry["used_memory_mib"] = max(entry["used_memory_mib"] or 0, int(used) // MIB)
    return [found[pid] for pid in sorted(found)]


def visible_indices(gpus: list[dict], cuda_visible_devices: str | None) -> dict:
    """The NVML GPUs that CUDA_VISIBLE_DEVICES leaves to this node's processes.

    Entries are NVML indices (CUDA orders GPUs of one model by PCI bus id, as NVML does) or GPU UUIDs
    ("GPU-..." or a unique prefix of one), read the way CUDA reads them: a negative or out-of-range index
    ends the list, and a repeated entry leaves no GPU visible. An entry that names no GPU NVML sees (a UUID
    matching none or several, a MIG instance, text) cannot be resolved here: then every GPU counts as
    visible, so that a typo never hides a GPU from a check, and `note` says so.

    Returns {"indices": [NVML index, ...], "all": bool (no restriction), "resolved": bool,
    "cuda_visible_devices": the value, "note": str | None}.
    """
    every = [g.get("index") for g in gpus]
    out = {"indices": every, "all": True, "resolved": True, "cuda_visible_devices": cuda_visible_devices, "note": None}
    if cuda_visible_devices is None:
        return out
    text = cuda_visible_devices.strip()
    uuids = {g.get("index"): (g.get("uuid") or "").lower() for g in gpus}
    chosen: list[int] = []
    for raw in text.split(",") if text else []:
        entry = raw.strip()
        if not entry:
            break  # as CUDA: an empty entry ends the list
        if entry.lstrip("+-").isdigit():
            index = int(entry)
            if index < 0 or index not in uuids:
                break  # CUDA ignores this entry and every one after it
        elif entry.upper().startswith("GPU-"):
            hits = [i for i, u in uuids.items() if u and u.startswith(entry.lower())]
            if len(hits) != 1:
                why = "matches no GPU UUID NVML sees" if not hits else f"matches {len(hits)} GPU UUIDs"
                return out | {"resolved": False,
                              "note": f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: entry {entry!r} {why}, so every GPU is judged"}
            index = hits[0]
        else:
            what = "a MIG instance" if entry.upper().startswith("MIG-") else "neither an index nor a GPU UUID"
            return out | {"resolved": False,
                          "note": f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: entry {entry!r} is {what}, so every GPU is judged"}
        if index in chosen:  # CUDA: a repeated device leaves none visible
            chosen = []
            break
        chosen.append(index)
    hidden = [i for i in every if i not in chosen]
    note = None
    if hidden:
        note = f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} leaves {len(chosen)} of {len(every)} GPUs to this node"
    return out | {"indices": chosen, "all": not hidden, "note": note}


def _gpu(index: int) -> dict:
    import pynvml

    gpu = dict.fromkeys(GPU_FIELDS)
    gpu["index"] = index
    unreadable = gpu["unreadable"] = {}
    handle, err = read_field(pynvml.nvmlDeviceGetHandleByIndex, index)
    if err:  # a lost GPU: nothing else can be read from it
        unreadable["handle"] = err
        return gpu

    def put(field, fn, *args):
        gpu[field], err = read_field(fn, *args)
        if err:
            unreadable[field] = err

    h = handle
    put("name", lambda: as_text(pynvml.nvmlDeviceGetName(h)))
    put("uuid", lambda: as_text(pynvml.nvmlDeviceGetUUID(h)))
    put("serial", lambda: as_text(pynvml.nvmlDeviceGetSerial(h)))
    put("pci_bus_id", lambda: bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId))
    put("memory_total_mib", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // MIB)
    put("vbios_version", lambda: as_text(pynvml.nvmlDeviceGetVbiosVersion(h)))
    put("inforom_image_version", lambda: as_text(pynvml.nvmlDeviceGetInforomImageVersion(h)))
    put("persistence_mode", lambda: pynvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED)
    put("mig_mode_current", lambda: pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
    put("compute_mode", lambda: _compute_mode_name(pynvml.nvmlDeviceGetComputeMode(h)))
    put("ecc_mode_current", lambda: pynvml.nvmlDeviceGetEccMode(h)[0] == pynvml.NVML_FEATURE_ENABLED)
    for counter_name, counter in (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC)):
        for kind_name, kind in (
            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ):
            put(f"ecc_{counter_name}_{kind_name}", pynvml.nvmlDeviceGetTotalEccErrors, h, kind, counter)
    put("remapped_rows", read_remapped_rows, h)
    put("retired_pages", _retired_pages, h)
    put(
        "temperature_c",
        call_first,
        (getattr(pynvml, "nvmlDeviceGetTemperatureV", None), h, pynvml.NVML_TEMPERATURE_GPU),
        (getattr(pynvml, "nvmlDeviceGetTemperature", None), h, pynvml.NVML_TEMPERATURE_GPU),
    )
    put("temperature_slowdown_c", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    put("temperature_shutdown_c", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    put("memory_temperature_c", lambda: int(field_value(h, pynvml.NVML_FI_DEV_MEMORY_TEMP)))
    put("power_draw_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000)
    put("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
    put("power_default_limit_w", lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000)
    put("pstate", lambda: int(pynvml.nvmlDeviceGetPerformanceState(h)))
    put("utilization_gpu_pct", lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
    put("clock_event_reasons", clock_events, h)

    pcie = gpu["pcie"] = {}
    for key, fn in (
        ("gen_current", pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
        ("gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
        ("gen_gpu_max", pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration),
        ("width_current", pynvml.nvmlDeviceGetCurrPcieLinkWidth),
        ("width_max", pynvml.nvmlDeviceGetMaxPcieLinkWidth),
    ):
        pcie[key], err = read_field(fn, h)
        if err:
            unreadable[f"pcie.{key}"] = err

    gpu["nvlink"] = nvlink_links(h, unreadable)
    gpu["nvlink_error_totals"] = nvlink_totals(h, unreadable)
    put("fabric", _fabric, h)
    put("pcie_replay", lambda: int(pynvml.nvmlDeviceGetPcieReplayCounter(h)))
    gpu["processes"] = gpu_processes(h, unreadable)
    return gpu


def _binding_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nvidia-ml-py")
    except Exception:
        return None


def read() -> dict:
    """NVML readings of this host's GPUs (see the module docstring); never raises."""
    try:
        import pynvml
    except ImportError as exc:
        return {"available": False, "error": f"nvidia-ml-py is not installed: {exc}", "gpus": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return {"available": False, "error": NO_DRIVER, "gpus": []}
    except Exception as exc:
        return {"available": False, "error": f"{INIT_FAILED}: {error_text(exc)}", "gpus": []}
    try:
        out = {
            "available": True,
            "error": None,
            "binding_version": _binding_version(),
            # Which GPUs this node's processes may use: the checks judge those (visible_indices()).
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "unreadable": {},
        }
        for key, fn in (
            ("driver_version", lambda: as_text(pynvml.nvmlSystemGetDriverVersion())),
            (
                "cuda_driver_version",
                lambda: cuda_version(
                    call_first(
                        (getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None),),
                        (getattr(pynvml, "nvmlSystemGetCudaDriverVersion", None),),
                    )
                ),
            ),
            ("nvml_version", lambda: as_text(pynvml.nvmlSystemGetNVMLVersion())),
        ):
            out[key], err = read_field(fn)
            if err:
                out["unreadable"][key] = err
        count, err = read_field(pynvml.nvmlDeviceGetCount)
        if err:
            out["unreadable"]["gpu_count"] = err
            out["error"] = f"NVML could not count the GPUs: {err}"
        out["gpus"] = [_gpu(i) for i in range(count or 0)]
        return out
    except Exception as exc:  # a bug here must still leave a reading behind
        return {"available": False, "error": f"NVML read failed: {type(exc).__name__}: {error_text(exc)}", "gpus": []}
    finally:
        read_field(pynvml.nvmlShutdown)
