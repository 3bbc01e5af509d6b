"""NVML reads the views make that collect.nvml does not: the quick per-refresh read behind `gpufleet status`,
and the kind of device at the far end of each NVLink for `gpufleet hw`.

collect.nvml.read() initialises NVML, reads some 30 values and up to 18 links x 5 values per GPU (each counter
with fallbacks), and shuts NVML down: 338 NVML calls and 0.19 s for the two H200s of the 2 x H200 machine.
LiveReader keeps NVML open and the handles and reads the static values once. Each refresh then costs about 10 ms
a GPU there (memory, utilisation, temperatures, power, clocks, throttle reasons, ECC, PCIe replays, processes,
link states), except the per-link NVLink error counters: about 1 ms per link and counter on H200, 72 calls and
70 ms a GPU, 0.56 s a refresh for eight. So where the driver has no all-links totals (H200 with driver 580 has
none), a refresh after the first reads the per-link counters of one GPU in turn: each GPU's are at most as many
refreshes old as the node has GPUs, and "nvlink_errors_age_s" says how old. The first reading (and so
`status --json`) reads every GPU's.

Like collect.nvml, nothing here raises: a value that cannot be read is None and the GPU's "unreadable" names it.
The GPU entries use collect.nvml's key names where the two read the same thing (STATUS_GPU_FIELDS).
"""

from __future__ import annotations

import time

from gpufleet.collect import nvml
from gpufleet.collect.nvml.binding import (
    BINDING_MISSING,
    MIB,
    as_text,
    bus_id,
    call_first,
    cuda_version,
    error_text,
    field_value,
    init_nvml,
    pynvml,
    read_field,
)
from gpufleet.collect.nvml.clocks import clock_events
from gpufleet.collect.nvml.nvlinks import NVLINK_COUNTERS, nvlink_counter_calls
from gpufleet.collect.nvml.processes import gpu_processes

# fmt: off
STATUS_GPU_FIELDS = (
    "index", "name", "uuid", "pci_bus_id",
    "utilization_gpu_pct", "utilization_memory_pct", "memory_used_mib", "memory_total_mib",
    "temperature_c", "memory_temperature_c", "temperature_slowdown_c",
    "power_draw_w", "power_limit_w",
    "clock_sm_mhz", "clock_memory_mhz", "clock_sm_max_mhz", "clock_memory_max_mhz",
    "clock_event_reasons",
    "ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected", "ecc_aggregate_corrected",
    "nvlink_links_active", "nvlink_errors", "nvlink_errors_age_s", "pcie_replay", "processes", "unreadable",
)
# fmt: on

NVLINK_TOTAL_FIELDS = {
    "crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}

REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}  # NVML_NVLINK_DEVICE_TYPE_*; 0xFF is unknown


class _Gpu:
    """One GPU's handle and what was learnt about it on the first read."""

    def __init__(self, index: int):
        self.index = index
        self.handle = None
        self.static: dict = {}
        self.static_unreadable: dict = {}
        self.links: list[int] = []  # links the GPU has (state readable)
        self.links_error: str | None = None
        self.totals_ok = False  # the driver gives the all-links totals
        self.chain_pick: dict[tuple[int, str], int] = {}  # (link, counter) -> index of the call that worked
        self.nvlink_errors: tuple[dict, dict, float] | None = None  # (counts, errors, monotonic time read)


class LiveReader:
    """NVML held open across refreshes. open() once, read() each refresh, close() at the end.

    Readings are documents of the shape status.py renders:
        {"available", "error", "driver_version", "cuda_driver_version", "read_seconds", "gpus": [...]}
    """

    def __init__(self):
        self.error: str | None = None
        self.system: dict = {}
        self.gpus: list[_Gpu] = []
        self._open = False
        self._reads = 0

    def open(self) -> bool:
        if pynvml is None:
            self.error = BINDING_MISSING
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self.error = nvml.NO_DRIVER
            return False
        except Exception as exc:
            self.error = f"NVML init failed: {error_text(exc)}"
            return False
        self._open = True
        unreadable: dict = {}
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
        ):
            self.system[key], err = read_field(fn)
            if err:
                unreadable[key] = err
        self.system["unreadable"] = unreadable
        count, err = read_field(pynvml.nvmlDeviceGetCount)
        if err:
            self.error = f"NVML could not count the GPUs: {err}"
        self.gpus = [self._open_gpu(i) for i in range(count or 0)]
        return True

    def _open_gpu(self, index: int) -> _Gpu:
        g = _Gpu(index)
        g.handle, err = read_field(pynvml.nvmlDeviceGetHandleByIndex, index)
        if err:
            g.static_unreadable["handle"] = err
            return g
        h = g.handle
        for key, fn in (
            ("name", lambda: as_text(pynvml.nvmlDeviceGetName(h))),
            ("uuid", lambda: as_text(pynvml.nvmlDeviceGetUUID(h))),
            ("pci_bus_id", lambda: bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)),
            (
                "temperature_slowdown_c",
                lambda: pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            ),
            ("clock_sm_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            ("clock_memory_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
        ):
            g.static[key], err = read_field(fn)
            if err:
                g.static_unreadable[key] = err
        first_error = None
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            _, err = read_field(pynvml.nvmlDeviceGetNvLinkState, h, link)
            if err:  # this GPU has no such link
                first_error = first_error or err
            else:
                g.links.append(link)
        if not g.links:
            g.links_error = first_error or "no NVLink"
        if g.links:
            g.totals_ok = not self._totals(h)[1]
        return g

    @staticmethod
    def _totals(handle) -> tuple[dict, dict]:
        """The all-links error totals (field values): ({counter: value}, {counter: error})."""
        values, errors = {}, {}
        for counter, name in NVLINK_TOTAL_FIELDS.items():
            values[counter], err = read_field(field_value, handle, getattr(pynvml, name))
            if err:
                errors[counter] = err
        return values, errors

    def _link_counter(self, g: _Gpu, link: int, counter: str):
        """One per-link counter through collect.nvml's fallbacks, starting with the one that worked before."""
        calls = nvlink_counter_calls(g.handle, link, counter)
        pick = g.chain_pick.get((link, counter))
        order = ([pick] if pick is not None else []) + [i for i in range(len(calls)) if i != pick]
        first_err = None
        for i in order:
            value, err = read_field(*calls[i])
            if err is None:
                g.chain_pick[(link, counter)] = i
                return value, None
            first_err = first_err or err
        return None, first_err

    def _read_gpu(self, g: _Gpu, refresh_counts: bool) -> dict:
        gpu = dict.fromkeys(STATUS_GPU_FIELDS)
        gpu["index"] = g.index
        unreadable = gpu["unreadable"] = dict(g.static_unreadable)
        gpu.update(g.static)
        if g.handle is None:
            for key in STATUS_GPU_FIELDS:
                if gpu[key] is None and key not in ("index", "unreadable"):
                    unreadable.setdefault(key, unreadable["handle"])
            return gpu
        h = g.handle

        def put(field, fn, *args):
            gpu[field], err = read_field(fn, *args)
            if err:
                unreadable[field] = err

        # v2 counts the driver's reserved memory apart, as nvidia-smi does (v1's "used" includes it: 0.6 GiB
        # of an idle H200); v1 where the driver or binding lacks v2.
        mem, err = read_field(
            call_first,
            (pynvml.nvmlDeviceGetMemoryInfo, h, getattr(pynvml, "nvmlMemory_v2", None)),
            (pynvml.nvmlDeviceGetMemoryInfo, h),
        )
        gpu["memory_used_mib"] = int(mem.used) // MIB if mem is not None else None
        gpu["memory_total_mib"] = int(mem.total) // MIB if mem is not None else None
        if err:
            unreadable["memory_used_mib"] = unreadable["memory_total_mib"] = err
        util, err = read_field(pynvml.nvmlDeviceGetUtilizationRates, h)
        gpu["utilization_gpu_pct"] = int(util.gpu) if util is not None else None
        gpu["utilization_memory_pct"] = int(util.memory) if util is not None else None
        if err:
            unreadable["utilization_gpu_pct"] = unreadable["utilization_memory_pct"] = err
        put(
            "temperature_c",
            call_first,
            (getattr(pynvml, "nvmlDeviceGetTemperatureV", None), h, pynvml.NVML_TEMPERATURE_GPU),
            (getattr(pynvml, "nvmlDeviceGetTemperature", None), h, pynvml.NVML_TEMPERATURE_GPU),
        )
        put("memory_temperature_c", lambda: int(field_value(h, pynvml.NVML_FI_DEV_MEMORY_TEMP)))
        put("power_draw_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000)
        put("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
        put("clock_sm_mhz", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        put("clock_memory_mhz", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        put("clock_event_reasons", clock_events, h)
        for counter_name, counter in (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC)):
            for kind_name, kind in (
                ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ):
                put(f"ecc_{counter_name}_{kind_name}", pynvml.nvmlDeviceGetTotalEccErrors, h, kind, counter)
        put("pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter, h)
        gpu["processes"] = gpu_processes(h, unreadable)  # the same entries as collect.nvml's
        self._read_nvlink(g, gpu, unreadable, refresh_counts)
        return gpu

    def _nvlink_counts(self, g: _Gpu) -> tuple[dict, dict]:
        """The GPU's NVLink error counts now: ({counter: count}, {counter: error})."""
        if g.totals_ok:
            return self._totals(g.handle)
        counts, errors = {}, {}
        for counter in NVLINK_COUNTERS:  # over the links that exist, summed as collect.nvml.nvlink_error_counts() does
            values = [self._link_counter(g, link, counter) for link in g.links]
            readable = [v for v, _ in values if v is not None]
            counts[counter] = sum(readable) if readable else None
            if not readable:
                errors[counter] = next(e for _, e in values if e)
        return counts, errors

    def _read_nvlink(self, g: _Gpu, gpu: dict, unreadable: dict, refresh_counts: bool) -> None:
        if not g.links:
            gpu["nvlink_links_active"] = 0
            unreadable["nvlink_errors"] = g.links_error
            return
        active, state_err = [], None
        for link in g.links:
            state, err = read_field(pynvml.nvmlDeviceGetNvLinkState, g.handle, link)
            if err:
                state_err = state_err or err
            elif state == pynvml.NVML_FEATURE_ENABLED:
                active.append(link)
        gpu["nvlink_links_active"] = None if state_err else len(active)
        if state_err:
            unreadable["nvlink_links_active"] = state_err
        if refresh_counts or g.totals_ok or g.nvlink_errors is None:
            g.nvlink_errors = (*self._nvlink_counts(g), time.monotonic())
        counts, errors, read_at = g.nvlink_errors
        gpu["nvlink_errors"] = dict(counts)
        gpu["nvlink_errors_age_s"] = round(time.monotonic() - read_at, 1)
        for counter, err in errors.items():
            unreadable[f"nvlink_errors.{counter}"] = err

    def read(self) -> dict:
        """One reading of every GPU; never raises."""
        started = time.monotonic()
        doc = {
            "available": self._open,
            "error": self.error,
            "driver_version": self.system.get("driver_version"),
            "cuda_driver_version": self.system.get("cuda_driver_version"),
            "unreadable": dict(self.system.get("unreadable") or {}),
            "gpus": [],
        }
        if self._open:
            # The per-link NVLink counters of one GPU a refresh (every GPU's on the first): see the module doc.
            per_link = [g for g in self.gpus if g.links and not g.totals_ok]
            turn = per_link[self._reads % len(per_link)] if per_link and self._reads else None
            for g in self.gpus:
                try:
                    doc["gpus"].append(self._read_gpu(g, refresh_counts=g is turn))
                except Exception as exc:  # a bug here must still leave the other GPUs' readings
                    gpu = dict.fromkeys(STATUS_GPU_FIELDS)
                    gpu.update(index=g.index, unreadable={"gpu": f"{type(exc).__name__}: {error_text(exc)}"})
                    doc["gpus"].append(gpu)
        self._reads += 1
        doc["read_seconds"] = round(time.monotonic() - started, 4)
        return doc

    def close(self) -> None:
        if self._open:
            read_field(pynvml.nvmlShutdown)
            self._open = False

    def __enter__(self) -> "LiveReader":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def nvlink_remote_types(links_by_gpu: dict[int, list[int]]) -> tuple[dict, str | None]:
    """{gpu index: {link: "gpu"|"switch"|"ibmnpu"|"unknown"|None}} for the given active links, and an error
    when NVML could not be opened. A link whose type cannot be read maps to None."""
    if not links_by_gpu:
        return {}, None
    try:
        init_nvml()
    except Exception as exc:
        return {}, f"NVML init failed: {error_text(exc)}"
    try:
        out: dict[int, dict] = {}
        fn = getattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        for index, links in links_by_gpu.items():
            handle, err = read_field(pynvml.nvmlDeviceGetHandleByIndex, index)
            out[index] = {}
            for link in links:
                kind, err = (None, err) if err or fn is None else read_field(fn, handle, link)
                out[index][link] = None if kind is None else REMOTE_TYPES.get(int(kind), "unknown")
        return out, None
    finally:
        read_field(pynvml.nvmlShutdown)
