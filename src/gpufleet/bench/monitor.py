"""Sample every GPU through NVML while a benchmark runs.

Shared power and cooling are part of the test: a GPU that throttles under
load shows it here (clock event reasons, peak temperature, lowest SM clock)
even when its number still clears the threshold.
"""

from __future__ import annotations

import threading

from gpufleet.checks.gpu_health import HW_SLOWDOWN_EVENTS
from gpufleet.collect.nvml import CLOCK_EVENT_BITS, bus_id


def reason_names(mask: int) -> list[str]:
    return [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]


class GpuMonitor:
    """Context manager: `with GpuMonitor() as mon: ...; mon.summary()`.

    Without NVML (no driver, CPU runs) it records why and samples nothing.
    """

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.error = None
        self.samples = 0
        self.per_gpu: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self._handles[i] = h
                self.per_gpu[str(i)] = {"pci_bus_id": bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId), "reasons_mask": 0, "temperature_max_c": None, "sm_clock_min_mhz": None, "power_max_w": None}
        except Exception as exc:  # no driver, no NVML: record, do not fail the benchmark
            self.error = f"NVML unavailable: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        nv = self._nvml
        for i, h in self._handles.items():
            g = self.per_gpu[str(i)]
            try:
                getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
                g["reasons_mask"] |= int(getter(h))
                t = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                g["temperature_max_c"] = t if g["temperature_max_c"] is None else max(g["temperature_max_c"], t)
                clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                g["sm_clock_min_mhz"] = clk if g["sm_clock_min_mhz"] is None else min(g["sm_clock_min_mhz"], clk)
                p = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                g["power_max_w"] = p if g["power_max_w"] is None else max(g["power_max_w"], p)
            except Exception as exc:
                g["error"] = str(exc)
        self.samples += 1

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __exit__(self, *exc):
        if self._thread:
            self._stop.set()
            self._thread.join()
            self._nvml.nvmlShutdown()
        return False

    def summary(self) -> dict:
        per_gpu = {}
        for idx, g in self.per_gpu.items():
            names = reason_names(g["reasons_mask"])
            per_gpu[idx] = {**g, "reasons": names, "throttled": sorted(HW_SLOWDOWN_EVENTS.keys() & set(names))}
        return {"samples": self.samples, "interval_s": self.interval_s, "error": self.error, "per_gpu": per_gpu}
