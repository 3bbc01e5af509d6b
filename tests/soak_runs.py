"""A soak of GPU-shaped numbers, built through the real code that builds a soak's output: outcome.finish from the
bursts the worker processes send, and SoakSampler.note_* from the readings its thread takes (NVML and the kernel log),
so only the numbers are made up, never the shape. The soak's own tests (src/gpufleet/benchmarks/soak/) and the
tests of what reads a soak (the watch, the counters' rates, the one judge, the report's pictures) build theirs here.
"""

from __future__ import annotations

from gpufleet.bench.monitor import SoakSampler
from gpufleet.benchmarks.soak import soak_judge as soak_check
from gpufleet.benchmarks.soak import soak_measure as soak
from gpufleet.benchmarks.soak import soak_outcome as outcome
from test_fleet_synthetic import COUNTER_NAMES

EPOCH = 1795428000.0  # 2026-11-23T10:00:00Z
UUID = [
    "GPU-df63b106-711b-65ab-d334-1175fcbc7655",
    "GPU-755c8ad9-4858-d710-94b4-5641916ac523",
    "GPU-0c2d9a51-6a8e-4a7e-9d59-2f3c3b1d9e01",
    "GPU-4f1e0d2c-3b4a-5968-7a8b-9c0d1e2f3a4b",
]
PCI = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
SERIAL = ["1653724058331", "1653724049352", "1653724049999", "1653724050123"]
# Every cumulative counter a GPU reports (test_fleet_synthetic.py names them), at zero; the Xid count is kept apart.
ZERO_COUNTERS = {c: 0 for c in COUNTER_NAMES if c != "xid"}


def bursts(values_per_window: list, window_s: float, scale: float, per_window: int = 6) -> list:
    """The (t_end, seconds, work) bursts a worker sends, giving `value` (TFLOPS or GB/s) in each window."""
    out = []
    for w, value in enumerate(values_per_window):
        for k in range(per_window):
            out.append((w * window_s + (k + 0.5) * window_s / per_window, 0.5, value * scale * 0.5))
    return out


def gpu_soak(
    tflops: list[list],
    *,
    gbps: list[list] | None = None,
    busbw: list | None = None,
    window_s: float = 30.0,
    errors: dict | None = None,
    wrong: list | None = None,
    sampler: SoakSampler | None = None,
) -> dict:
    """A soak of len(tflops) GPUs over len(tflops[0]) windows, built as soak.run builds it."""
    n_gpus, n_windows = len(tflops), len(tflops[0])
    gbps = gbps or [[4200.0] * n_windows for _ in range(n_gpus)]
    sampler = sampler or sampled(n_gpus, n_windows * window_s)
    out = {
        "benchmark": "soak",
        "device": "cuda",
        "method": {"window_s": window_s},
        "versions": {"torch": "2.11"},
        "duration_s": n_windows * window_s,
        "window_s": window_s,
        "n_windows": n_windows,
        "world_size": n_gpus,
        "started": "2026-11-23T10:00:00Z",
        "started_epoch": EPOCH,
        "ran_s": n_windows * window_s + 0.6,
        "setup_error": None,
        "stopped_early": bool(errors),
        "stop_reason": None,
        "gpus": {},
        "nccl": None,
        "sampler": sampler.summary(window_s, n_windows),
    }
    ranks = {}
    for r in range(n_gpus):
        nccl = []
        if n_gpus > 1:
            factor = 2 * (n_gpus - 1) / n_gpus
            for w, bw in enumerate(busbw or [360.0] * n_windows):
                secs = soak.SIZES["cuda"]["nccl_bytes"] / (bw / factor * 1e9)
                nccl.append((w * window_s + 10, secs, not (wrong and (r, w) in wrong)))
        ranks[r] = {
            "info": {
                "name": "NVIDIA H200",
                "uuid": UUID[r],
                "pci_bus_id": PCI[r][:-2],
                "matmul_ops_per_burst": 360,
                "copy_ops_per_burst": 60,
            },
            "matmul": bursts(tflops[r], window_s, 1e12),
            "copy": bursts(gbps[r], window_s, 1e9),
            "nccl": nccl,
            "done_s": n_windows * window_s + 0.5,
            "error": (errors or {}).get(r),
            "last_s": n_windows * window_s,
        }
    return outcome.finish(out, ranks, soak.SIZES["cuda"]["nccl_bytes"])


def sampled(n_gpus: int, seconds: float, throttle: dict | None = None) -> SoakSampler:
    """A sampler that saw the GPUs at 1 Hz: 1980 MHz, 62 C, 690 W, a software power cap (normal under load);
    `throttle` {gpu: (from_s, to_s, mask)} adds hardware slowdown reasons."""
    s = SoakSampler()
    for i in range(n_gpus):
        s.gpus[i] = {"uuid": UUID[i], "serial": SERIAL[i], "pci_bus_id": PCI[i], "name": "NVIDIA H200"}
        s.counters_start[i] = s.counters_last[i] = dict(ZERO_COUNTERS)
        for t in range(int(seconds)):
            mask = 0x4
            lo, hi, extra = (throttle or {}).get(i, (None, None, 0))
            if lo is not None and lo <= t < hi:
                mask |= extra
            s.note_sample(i, float(t), 1980 if not mask & ~0x4 else 1410, 3201, 62, 690.0, mask)
    s.kernel_log_source = "/dev/kmsg"
    return s


def verdict(out, profile) -> dict:
    return {r["check"]: r for r in soak_check.soak(out, profile)}
