"""Benchmarks: matmul, memory bandwidth and NCCL collectives.

Every benchmark records how it measured (warm-up, iterations, sizes, timer),
the versions it ran under and BENCHMARK_VERSION, so that numbers from
different runs can be compared honestly. On a machine without CUDA the same
code runs on the CPU at tiny sizes so that tests exercise its logic; such
numbers carry "device": "cpu" and are never a performance claim.
"""

from __future__ import annotations

import statistics
import time

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


def summarize(samples: list[float]) -> dict:
    return {
        "median": statistics.median(samples),
        "max": max(samples),
        "min": min(samples),
        "n": len(samples),
    }


def sig(x: float, digits: int = 4) -> float:
    """Round to significant digits: 791.2 TFLOPS on a GPU, 0.01234 on a CPU run."""
    return float(f"{x:.{digits}g}")


def spread_pct(values: list[float]) -> float:
    """(max - min) / max across GPUs, in percent: how unlike the GPUs of one node are."""
    return 0.0 if not values or max(values) == 0 else round(100 * (max(values) - min(values)) / max(values), 2)
