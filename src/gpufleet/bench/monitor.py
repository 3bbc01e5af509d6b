"""Sample every GPU through NVML while a benchmark runs.

Shared power and cooling are part of the test: a GPU that throttles under load shows it here (clock event reasons,
peak temperature, lowest SM clock) even when its number still clears the threshold. GpuMonitor keeps the worst of
each for a benchmark of seconds; SoakSampler keeps a time series and the error counters for a soak of minutes to
hours. Both list the processes on every GPU at every sample (bench.watch): a process outside the benchmark's own
process tree is foreign, and the figures measured beside it are not the node's.
Both read the host too (bench.host_watch): where the GPUs are watched, its neighbours over the limits join `foreign`
(index None); a CPU run keeps them under `host` alone, its figures being no node's (`skip`). GpuMonitor also reads
the PCIe links of the NICs, the GPUs and the ports above them while the step loads them (bench.link_watch: `links`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter

from gpufleet.bench.host_watch import HostWatch
from gpufleet.bench.link_watch import LinkWatch
from gpufleet.bench.watch import ProcessWatch, in_window, list_processes
from gpufleet.collect import counters, kernel_log
from gpufleet.collect.nvml.binding import as_text, bus_id, call_first, init_nvml, pynvml, read_field
from gpufleet.collect.nvml.clocks import HW_SLOWDOWN_EVENTS, reason_names
from gpufleet.collect.nvml.processes import visible_indices


class GpuMonitor:
    """Context manager: `with GpuMonitor() as mon: ...; mon.summary()`.

    Without NVML (no driver, CPU runs) it records why and samples nothing.
    """

    MAX_CAUSES = 200

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.error = None
        self.samples = 0
        self.per_gpu: dict[str, dict] = {}
        # What can pull a timed sample down, with when (seconds since the start): a hardware or thermal slowdown
        # reason's spans, PCIe replays between two samples (checks.figures reads them against the samples' times).
        self.causes: dict[str, list] = {}
        self._open: dict[str, dict] = {}
        self._replays: dict[str, tuple] = {}
        self.watch = ProcessWatch()
        self.host = HostWatch()
        self.links: LinkWatch | None = None
        self.started_epoch = time.time()
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        self.started_epoch, self._t0 = time.time(), time.monotonic()
        self.host.start(self._t0)  # with or without NVML: the host is there either way
        self.links = LinkWatch().start(self._t0)
        try:
            init_nvml()
            self._nvml = pynvml
            self._handles = {}
            listed = [
                {"index": i, "uuid": as_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))}
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
            # Processes are watched on the GPUs this node may use: another job's on the others is not ours to judge.
            self._watched = set(visible_indices(listed, os.environ.get("CUDA_VISIBLE_DEVICES"))["indices"])
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self._handles[i] = h
                self.per_gpu[str(i)] = {
                    "pci_bus_id": bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId),
                    "reasons_mask": 0,
                    "temperature_max_c": None,
                    "sm_clock_min_mhz": None,
                    "power_max_w": None,
                }
        except Exception as exc:  # no driver, no NVML: record, do not fail the benchmark
            self.error = f"NVML unavailable: {exc}"
            return self
        self._sample()  # a process already on the GPU when the step starts counts too
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        nv = self._nvml
        for i, h in self._handles.items():
            g = self.per_gpu[str(i)]
            try:
                getter = (
                    getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or nv.nvmlDeviceGetCurrentClocksThrottleReasons
                )
                mask = int(getter(h))
                g["reasons_mask"] |= mask
                t = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                g["temperature_max_c"] = t if g["temperature_max_c"] is None else max(g["temperature_max_c"], t)
                clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                g["sm_clock_min_mhz"] = clk if g["sm_clock_min_mhz"] is None else min(g["sm_clock_min_mhz"], clk)
                p = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                g["power_max_w"] = p if g["power_max_w"] is None else max(g["power_max_w"], p)
            except Exception as exc:
                g["error"] = str(exc)
                mask = None
            replay, _ = read_field(nv.nvmlDeviceGetPcieReplayCounter, h)
            self.note_causes(str(i), time.monotonic() - self._t0, mask, replay)
            if i in self._watched:
                self.watch.note(i, time.monotonic() - self._t0, *list_processes(nv, h))
        self.samples += 1

    def note_causes(self, index: str, t_s: float, mask: int | None, pcie_replay: int | None) -> None:
        """One GPU's clock event reasons and PCIe replay counter read at t_s: the spans of hardware and thermal
        slowdowns, and replays that grew since the last read."""
        spans, open_ = self.causes.setdefault(index, []), self._open.setdefault(index, {})
        names = set(reason_names(mask)) & HW_SLOWDOWN_EVENTS.keys() if mask is not None else set(open_)
        for name in list(open_):
            if name not in names:
                spans.append({"what": HW_SLOWDOWN_EVENTS[name], "t_s": open_.pop(name)})
        for name in names:
            open_.setdefault(name, [round(t_s, 2), round(t_s, 2)])[1] = round(t_s, 2)
        last = self._replays.get(index)
        if pcie_replay is not None:
            if last is not None and pcie_replay > last[1]:
                spans.append({"what": f"PCIe replays {last[1]} -> {pcie_replay}", "t_s": [last[0], round(t_s, 2)]})
            self._replays[index] = (round(t_s, 2), pcie_replay)
        del spans[self.MAX_CAUSES :]

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __exit__(self, *exc):
        if self._thread:
            self._stop.set()
            self._thread.join()
            self._sample()  # the last word: a process that came at the very end counts too
            self._nvml.nvmlShutdown()
        self.host.stop()
        if self.links:
            self.links.stop()
        return False

    def summary(self) -> dict:
        per_gpu = {}
        for idx, g in self.per_gpu.items():
            names = reason_names(g["reasons_mask"])
            still = [{"what": HW_SLOWDOWN_EVENTS[n], "t_s": span} for n, span in (self._open.get(idx) or {}).items()]
            per_gpu[idx] = {
                **g,
                "reasons": names,
                "throttled": sorted(HW_SLOWDOWN_EVENTS.keys() & set(names)),
                "causes": (self.causes.get(idx) or []) + still,
            }
        return {
            "samples": self.samples,
            "interval_s": self.interval_s,
            "error": self.error,
            "per_gpu": per_gpu,
            "started_epoch": self.started_epoch,
            "started_monotonic": self._t0,
            "processes": self.watch.processes(),
            "foreign": self.watch.foreign() + (self.host.foreign() if self.error is None else []),
            "processes_unreadable": {str(i): e for i, e in self.watch.unreadable.items()},
            "host": self.host.summary(),
            "links": self.links.summary() if self.links else None,
        }


def sampled(run) -> dict:
    """run() -> a benchmark's output, measured with a GpuMonitor beside it, whose summary goes under "monitor": the
    steps that launch their own workers (NCCL, the training gate, the fine-tune under torchrun) are watched as
    matmul and memory are (measure reads the processes it saw)."""
    with GpuMonitor() as mon:
        out = run()
    return {**out, "monitor": mon.summary()}


class SoakSampler:
    """Watch the GPUs a soak loads, in a thread, for as long as it runs.

    Every `interval_s` (about 1 Hz): SM and memory clocks, clock event (throttle) reasons, temperature and
    power. Every `counters_every_s`: the error counters of the counter snapshots (ECC, row remapping,
    NVLink CRC/replay/recovery, PCIe replay; collect.counters), and every `kernel_log_every_s` the Xid
    events of the kernel log. A counter that grows, an Xid that appears and a clock event reason seen
    for the first time are events with the time they were seen (seconds since start(t0)).

        sampler = SoakSampler(); sampler.open()      # NVML handles, counters and kernel log at rest
        sampler.start(t0)                            # t0: time.monotonic() the soak counts from
        ...; sampler.stop(); sampler.summary(window_s, n_windows)

    `indices` (NVML indices) limits it to the GPUs this node may use; default: those CUDA_VISIBLE_DEVICES
    leaves (collect.nvml.visible_indices). Without NVML it records why and samples nothing; a field
    that cannot be read is None in its sample, and a GPU whose reads fail keeps the first error.
    """

    MAX_EVENTS = 500

    def __init__(
        self,
        interval_s: float = 1.0,
        counters_every_s: float = 5.0,
        kernel_log_every_s: float = 15.0,
        indices: list[int] | None = None,
    ):
        self.interval_s = interval_s
        self.counters_every_s = counters_every_s
        self.kernel_log_every_s = kernel_log_every_s
        self.indices = indices
        self.error: str | None = None
        self.kernel_log_error: str | None = None
        self.kernel_log_source: str | None = None
        self.gpus: dict[int, dict] = {}
        self.series: dict[int, list] = {}
        self.throttle: dict[int, dict] = {}
        self.counters_start: dict[int, dict] = {}
        self.counters_last: dict[int, dict] = {}
        self.gpu_errors: dict[int, str] = {}
        self.events: list[dict] = []
        self.events_dropped = 0
        self.samples = 0
        self.watch = ProcessWatch()
        self.host = HostWatch()
        self._handles: dict[int, object] = {}
        self._xid_seen = None
        self._t0 = None
        self._stop = threading.Event()
        self._thread = None
        self._nvml = None

    # --- set-up and tear-down

    def open(self) -> "SoakSampler":
        try:
            init_nvml()
            self._nvml = pynvml
            listed = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                listed.append({"index": i, "uuid": as_text(pynvml.nvmlDeviceGetUUID(h)), "handle": h})
            if self.indices is None:
                self.indices = visible_indices(listed, os.environ.get("CUDA_VISIBLE_DEVICES"))["indices"]
            for g in listed:
                if g["index"] not in self.indices:
                    continue
                i, h = g["index"], g["handle"]
                self._handles[i] = h
                info = {"uuid": g["uuid"], "serial": None, "pci_bus_id": None, "name": None}
                for key, fn in (("serial", pynvml.nvmlDeviceGetSerial), ("name", pynvml.nvmlDeviceGetName)):
                    try:
                        info[key] = as_text(fn(h))
                    except Exception:  # not every GPU has a serial; the uuid names it
                        pass
                try:
                    info["pci_bus_id"] = bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
                except Exception:
                    pass
                self.gpus[i] = info
                self.series[i] = []
                self.throttle[i] = {}
        except Exception as exc:  # no driver, no NVML: record, do not fail the soak
            self.error = f"NVML unavailable: {exc}"
            return self
        for i, h in self._handles.items():
            try:
                self.counters_start[i] = self.counters_last[i] = self._read_counters(i, h)
            except Exception as exc:  # this GPU's counters are not watched; the others are
                self.gpu_errors.setdefault(i, f"counters: {type(exc).__name__}: {exc}")
        self._read_kernel_log(None)
        return self

    def start(self, t0: float) -> None:
        self._t0 = t0
        self.host.start(t0)
        if self._handles:
            self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.host.stop()
        if self._thread:
            self._stop.set()
            self._thread.join(timeout=30)
        if self._handles:  # the last word: counters that moved at the very end count too
            t = time.monotonic() - (self._t0 or time.monotonic())
            for i, h in self._handles.items():
                self._counters_event(i, h, t)
            self._read_kernel_log(t)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    # --- reading

    def _event(self, event: dict) -> None:
        if len(self.events) < self.MAX_EVENTS:
            self.events.append(event)
        else:
            self.events_dropped += 1

    def _read_counters(self, index: int, handle) -> dict:
        return counters.read_live(self._nvml, handle)

    def _counters_event(self, index: int, handle, t: float) -> None:
        try:
            now = self._read_counters(index, handle)
        except Exception as exc:
            self.gpu_errors.setdefault(index, f"counters: {type(exc).__name__}: {exc}")
            return
        self.note_counters(index, now, t)

    def note_counters(self, index: int, now: dict, t: float) -> None:
        """Counters read at t: each count that grew since the last read is an event (the links' counts are kept)."""
        before = self.counters_last.get(index) or {}
        for counter, value in now.items():
            old = before.get(counter)
            if isinstance(value, int) and isinstance(old, int) and value > old:
                self._event(
                    {
                        "kind": "counter",
                        "index": index,
                        "t_s": round(t, 1),
                        "counter": counter,
                        "from": old,
                        "to": value,
                    }
                )
        self.counters_last[index] = {k: (v if v is not None else before.get(k)) for k, v in now.items()}

    def _read_kernel_log(self, t: float | None) -> None:
        self.note_kernel_log(kernel_log.read(), t)

    def note_kernel_log(self, log: dict, t: float | None) -> None:
        """A kernel log read (collect.kernel_log) at t: Xid events not in the read before are events; t None: the start."""
        self.kernel_log_source = log.get("source")
        if not log.get("readable"):
            self.kernel_log_error = log.get("error") or "kernel log unreadable"
            return
        seen = Counter(e.get("message") for e in log.get("xid_events") or [])
        if self._xid_seen is not None and t is not None:
            new = seen - self._xid_seen
            by_pci = {(g["pci_bus_id"] or "")[:-2]: i for i, g in self.gpus.items() if g.get("pci_bus_id")}
            for ev in log.get("xid_events") or []:
                if new.get(ev.get("message"), 0) > 0:
                    new[ev.get("message")] -= 1
                    self._event(
                        {
                            "kind": "xid",
                            "index": by_pci.get(ev.get("pci")),
                            "t_s": round(t, 1),
                            "pci": ev.get("pci"),
                            "xid": ev.get("xid"),
                            "message": ev.get("message"),
                        }
                    )
        self._xid_seen = seen

    def _sample(self, t: float) -> None:
        nv = self._nvml
        getter = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        for i, h in self._handles.items():
            sm, err = read_field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            mem, _ = read_field(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            temp, _ = read_field(
                call_first,
                (getattr(nv, "nvmlDeviceGetTemperatureV", None), h, nv.NVML_TEMPERATURE_GPU),
                (getattr(nv, "nvmlDeviceGetTemperature", None), h, nv.NVML_TEMPERATURE_GPU),
            )
            power, _ = read_field(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            mask, err2 = read_field(lambda: int(getter(h)))
            if err or err2:
                self.gpu_errors.setdefault(i, err or err2)
            self.note_sample(i, t, sm, mem, temp, power, mask)
            self.note_processes(i, t, *list_processes(nv, h))
        self.samples += 1

    def note_processes(self, index: int, t: float, procs: list | None, error: str | None = None) -> None:
        """The processes NVML listed on one GPU at t; a foreign one seen for the first time is an event."""
        before = {p["pid"] for p in self.watch.foreign()}
        self.watch.note(index, t, procs, error)
        for p in self.watch.foreign():
            if p["pid"] not in before and p["index"] == index:
                self._event(
                    {
                        "kind": "process",
                        "index": index,
                        "t_s": round(t, 1),
                        "pid": p["pid"],
                        "name": p["name"],
                        "used_memory_mib": p["used_memory_mib"],
                    }
                )

    def note_sample(self, index: int, t: float, sm_mhz, mem_mhz, temperature_c, power_w, reasons_mask) -> None:
        """One GPU's reading at t (None where unreadable): into the series; each clock event reason counted."""
        self.series.setdefault(index, []).append(
            (
                round(t, 2),
                sm_mhz,
                mem_mhz,
                temperature_c,
                round(power_w, 1) if power_w is not None else None,
                reasons_mask,
            )
        )
        for name in reason_names(reasons_mask or 0):
            seen = self.throttle.setdefault(index, {}).setdefault(
                name, {"first_s": round(t, 1), "last_s": None, "samples": 0}
            )
            if seen["samples"] == 0 and name in HW_SLOWDOWN_EVENTS:
                self._event({"kind": "clock_event", "index": index, "t_s": round(t, 1), "reason": name})
            # Seconds: samples x interval; a reason seen in one sample counts one interval.
            seen.update(
                last_s=round(t, 1),
                samples=seen["samples"] + 1,
                seconds=round((seen["samples"] + 1) * self.interval_s, 1),
            )

    def _run(self) -> None:
        next_counters = self.counters_every_s
        next_log = self.kernel_log_every_s
        while not self._stop.is_set():
            t = time.monotonic() - self._t0
            try:
                self._sample(t)
                if t >= next_counters:
                    next_counters = t + self.counters_every_s
                    for i, h in self._handles.items():
                        self._counters_event(i, h, t)
                if t >= next_log:
                    next_log = t + self.kernel_log_every_s
                    self._read_kernel_log(t)
            except Exception as exc:  # the sampler must never take the soak down
                self.error = self.error or f"sampler: {type(exc).__name__}: {exc}"
            spent = time.monotonic() - self._t0 - t
            self._stop.wait(max(0.05, self.interval_s - spent))

    # --- what it saw

    def summary(self, window_s: float, n_windows: int) -> dict:
        """Per GPU: clock, temperature and power per window, clock event reasons with their first time and
        seconds in all, counters at the start and the end; the events in time order."""
        per_gpu = {}
        foreign = self.watch.foreign() + (self.host.foreign() if self.error is None else [])  # GpuMonitor's rule
        for i, info in self.gpus.items():
            windows = []
            for w in range(n_windows):
                lo, hi = w * window_s, (w + 1) * window_s
                rows = [r for r in self.series[i] if lo <= r[0] < hi or (w == n_windows - 1 and r[0] >= hi)]
                col = lambda k: [r[k] for r in rows if r[k] is not None]  # noqa: E731
                sm, mem, temp, power = col(1), col(2), col(3), col(4)
                mask = 0
                for r in rows:
                    mask |= r[5] or 0
                windows.append(
                    {
                        "index": w,
                        "start_s": round(lo, 1),
                        "samples": len(rows),
                        "sm_clock_min_mhz": min(sm) if sm else None,
                        "sm_clock_median_mhz": statistics.median(sm) if sm else None,
                        "mem_clock_min_mhz": min(mem) if mem else None,
                        "temperature_max_c": max(temp) if temp else None,
                        "power_median_w": round(statistics.median(power), 1) if power else None,
                        "power_max_w": max(power) if power else None,
                        "reasons": reason_names(mask),
                        "foreign_processes": in_window(foreign, i, lo, hi),
                    }
                )
            per_gpu[str(i)] = {
                **info,
                "windows": windows,
                "throttle": self.throttle.get(i, {}),
                "counters_start": self.counters_start.get(i),
                "counters_end": self.counters_last.get(i),
                "error": self.gpu_errors.get(i),
            }
        return {
            "interval_s": self.interval_s,
            "counters_every_s": self.counters_every_s,
            "kernel_log_every_s": self.kernel_log_every_s,
            "samples": self.samples,
            "error": self.error,
            "kernel_log": {"source": self.kernel_log_source, "error": self.kernel_log_error},
            "per_gpu": per_gpu,
            "events": sorted(self.events, key=lambda e: e["t_s"]),
            "events_dropped": self.events_dropped,
            "processes": self.watch.processes(),
            "foreign": foreign,
            "processes_unreadable": {str(i): e for i, e in self.watch.unreadable.items()},
            "host": self.host.summary(),
        }
