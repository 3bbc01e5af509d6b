"""Read the GPUs through NVML (the `pynvml` module of the nvidia-ml-py package): read() here, the readings of
each concern in a file of its own, which bench/ and views/ read with too:

    binding.py         pynvml (imported once, guarded) and the calls through it: read_field, call_first, field_value
    clocks.py          clock event (throttle) reasons
    memory_repairs.py  remapped rows, retired pages
    nvlinks.py         NVLink states and error counters, the fabric registration
    processes.py       each GPU's processes, the GPUs CUDA_VISIBLE_DEVICES leaves
    host_link.py       NVLink-C2C to a Grace CPU, the GPU memory's NUMA node

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
    c2c, memory_numa_node   how the GPU reaches its host (host_link.py): NVLink-C2C's links on a Grace superchip
    unreadable              {field: "error text"}; nested fields as "pcie.gen_max",
                            "nvlink.errors.crc_data", "nvlink_error_totals.replay"
"""

from __future__ import annotations

import os
from importlib import metadata

from gpufleet.collect.nvml.binding import (
    BINDING_MISSING,
    MIB,
    as_text,
    bus_id,
    call_first,
    cuda_version,
    error_text,
    field_value,
    pynvml,
    read_field,
)
from gpufleet.collect.nvml.clocks import clock_events
from gpufleet.collect.nvml.nvlinks import nvlink_links, nvlink_totals, read_fabric_state
from gpufleet.collect.nvml.host_link import read_c2c, read_memory_numa_node
from gpufleet.collect.nvml.memory_repairs import read_remapped_rows, read_retired_pages
from gpufleet.collect.nvml.processes import gpu_processes

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
    "c2c", "memory_numa_node", "unreadable",
)
# fmt: on

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def driver_unusable(reading: dict) -> bool:
    """Whether a reading says the driver itself is missing or will not start (libnvidia-ml.so not found, nvmlInit
    failing: driver not loaded, library and kernel module of different versions), not that the binding is missing."""
    error = str(reading.get("error") or "")
    return not reading.get("available") and (error == NO_DRIVER or error.startswith(INIT_FAILED))


def _compute_mode_name(mode: int) -> str:
    return COMPUTE_MODES.get(mode, f"unknown ({mode})")


def _gpu(index: int) -> dict:
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
    put("retired_pages", read_retired_pages, h)
    put(
        "temperature_c",
        call_first,
        (getattr(pynvml, "nvmlDeviceGetTemperatureV", None), h, pynvml.NVML_TEMPERATURE_GPU),
        (getattr(pynvml, "nvmlDeviceGetTemperature", None), h, pynvml.NVML_TEMPERATURE_GPU),
    )
    put(
        "temperature_slowdown_c",
        pynvml.nvmlDeviceGetTemperatureThreshold,
        h,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    )
    put(
        "temperature_shutdown_c",
        pynvml.nvmlDeviceGetTemperatureThreshold,
        h,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    )
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
    put("fabric", read_fabric_state, h)
    put("pcie_replay", lambda: int(pynvml.nvmlDeviceGetPcieReplayCounter(h)))
    gpu["processes"] = gpu_processes(h, unreadable)
    gpu["c2c"], gpu["memory_numa_node"] = read_c2c(h), read_memory_numa_node(h, unreadable)
    return gpu


def _binding_version() -> str | None:
    try:
        return metadata.version("nvidia-ml-py")
    except Exception:
        return None


def read() -> dict:
    """NVML readings of this host's GPUs (see the module docstring); never raises."""
    if pynvml is None:
        return {"available": False, "error": BINDING_MISSING, "gpus": []}
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
