"""Benchmarks: matmul, memory bandwidth and NCCL collectives.

Every benchmark records how it measured (warm-up, iterations, sizes, timer),
the versions it ran under and BENCHMARK_VERSION, so that numbers from
different runs can be compared honestly. On a machine without CUDA the same
code runs on the CPU at tiny sizes so that tests exercise its logic; such
numbers carry "device": "cpu" and are never a performance claim.
"""

from __future__ import annotations

import queue
import re
import statistics
import time

from gpufleet.collect.nvml.binding import init_nvml, pynvml
from gpufleet.base.numbers import significant

# Bump when a change to method (shapes, sizes, timer, statistic) would move the numbers.
BENCHMARK_VERSION = 1


def torch_versions() -> dict:
    import torch

    out = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except (RuntimeError, AttributeError):
        out["nccl"] = None
    return out


class DeviceTimer:
    """Times a region with CUDA events on a GPU, with perf_counter on the CPU.

    Device work is asynchronous: events are recorded on the stream, and the
    elapsed time is read only after the end event has completed.
    """

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.end_event = torch.cuda.Event(enable_timing=True)

    def start(self):
        if self.cuda:
            self.start_event.record()
        else:
            self.t0 = time.perf_counter()

    def stop_s(self) -> float:
        if self.cuda:
            self.end_event.record()
            self.end_event.synchronize()
            return self.start_event.elapsed_time(self.end_event) / 1e3
        return time.perf_counter() - self.t0


class Laps:
    """Seconds of a worker's phases, in order, kept in its result: lap(name) closes the phase since the last lap
    (a name met again adds up), so a step that grows shows where."""

    def __init__(self):
        self.t = time.monotonic()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self.t, 3)
        self.t = now


def summarize(samples: list[float]) -> dict:
    """n, min, median, max of timed samples, and spread_pct = (max - min) / median in percent: a GPU
    disturbed by another workload while it was measured shows a spread far above its siblings'. `values` keeps
    every sample in the order it was timed (4 significant digits), so a judge can count how many fell and
    the calibration can measure the healthy spread from them."""
    median = statistics.median(samples)
    return {
        "values": [significant(x) for x in samples],
        "median": median,
        "max": max(samples),
        "min": min(samples),
        "n": len(samples),
        "spread_pct": round(100 * (max(samples) - min(samples)) / median, 2) if median else None,
    }


_UUID = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def uuid_text(raw) -> str | None:
    """torch's device uuid (an object whose str() is the hex form, or its 16 bytes) -> "GPU-xxxxxxxx-..."."""
    if raw is None:
        return None
    data = raw if isinstance(raw, (bytes, bytearray, list, tuple)) else getattr(raw, "bytes", None)
    text = re.sub(r"^GPU-", "", str(raw).strip(), flags=re.IGNORECASE).lower()
    if not _UUID.fullmatch(text) and data is not None and len(data) == 16:
        h = bytes(data).hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return f"GPU-{text}" if _UUID.fullmatch(text) else None


def cuda_uuid(torch, device) -> str | None:
    """A CUDA device's UUID in NVML's form "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": torch's, else NVML's for
    the device's PCI bus id; None when neither gives one."""
    torch_uuid = uuid_text(getattr(torch.cuda.get_device_properties(device), "uuid", None))
    if torch_uuid:
        return torch_uuid
    try:
        init_nvml()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(cuda_pci_bus_id(torch, device) + ".0")
            raw = pynvml.nvmlDeviceGetUUID(handle)
            return uuid_text(raw.decode() if isinstance(raw, bytes) else raw)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here: the figure stays, without its GPU's identity
        return None


def cuda_pci_bus_id(torch, device) -> str:
    """ "0000:18:00", the kernel log's form; NVML adds the function (".0")."""
    p = torch.cuda.get_device_properties(device)
    return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}"


def gather(procs: list, keys: list, result_queue, timeout_s: float, what: str = "worker") -> dict:
    """The results (key, value) that worker processes put on `result_queue`, one per key, waiting at most timeout_s.

    A worker that exits without a result (killed, a crash in the driver) or is still running at the
    timeout gets {"error": ...} instead; the latter is killed, so no process outlives the benchmark.
    """
    results: dict = {}
    pending = dict(zip(keys, procs))
    gone_since: dict = {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        try:
            key, value = result_queue.get(timeout=1.0)
        except queue.Empty:
            now = time.monotonic()
            for key, proc in list(pending.items()):
                if proc.exitcode is None:
                    continue
                # Give what it put just before it exited a moment to arrive.
                if now - gone_since.setdefault(key, now) > 3:
                    results[key] = {"error": f"{what} {key} exited with code {proc.exitcode} without a result"}
                    del pending[key]
            continue
        results[key] = value
        pending.pop(key, None)
    for key, proc in pending.items():
        results[key] = {"error": f"{what} {key} gave no result within {timeout_s:g} s and was killed"}
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
    return results


def spread_pct(values: list[float]) -> float:
    """(max - min) / max across GPUs, in percent: how unlike the GPUs of one node are."""
    return 0.0 if not values or max(values) == 0 else round(100 * (max(values) - min(values)) / max(values), 2)
