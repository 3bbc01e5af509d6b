"""Achieved matmul TFLOPS per GPU, all GPUs of the node at once.

Method, in the spirit of maximum-achievable-matmul measurement:
- one process per GPU, released together by a barrier (shared power and cooling are part of the test);
- per shape: warm-up, then `iters` timed products, each between its own CUDA events;
- inputs rotate among several freshly drawn random sets (never zeros: zeros run faster than real data)
  and L2 is flushed before each timed product, outside the events, so no product reads a warm cache;
- per shape the median over iterations; a GPU's figure is its best shape's median (`tflops`), with the
  best single iteration kept as `tflops_max`, and that shape's timed samples summarized
  (`samples_tflops`: n, min, median, max, spread_pct) so a GPU disturbed while measured shows;
- depths: `smoke` one shape, bf16 only, few iterations (seconds); `quick` a few shapes that Hopper runs
  near its best; `thorough` a 45-shape sweep.
FLOPs of C[M,N] = A[M,K] @ B[K,N]: 2*M*N*K (one multiply and one add per term).
"""

from __future__ import annotations

import itertools
import os
import time

from gpufleet.bench import (
    BENCHMARK_VERSION,
    DeviceTimer,
    Laps,
    cuda_pci_bus_id,
    cuda_uuid,
    gather,
    spread_pct,
    summarize,
    torch_versions,
)
from gpufleet.benchmarks.sdc import sdc_measure
from gpufleet.base.registry import registers
from gpufleet.bench.monitor import GpuMonitor
from gpufleet.base.numbers import significant

DTYPES = ("bf16", "fp16", "tf32", "fp8")

# Shapes (M, N, K). The quick set is a few shapes that Hopper runs near its best (4096x4096x16384
# was the best of the thorough sweep on H200, docs/results/); the thorough sweep looks for the best
# shape of this GPU, so the quick figure can be judged against it.
SHAPES = {
    # One square shape that Hopper runs within a few percent of its best (docs/results/).
    "smoke": [(8192, 8192, 8192)],
    "quick": [(8192, 8192, 8192), (4096, 4096, 16384), (6144, 16384, 8192)],
    "thorough": list(itertools.product((4096, 6144, 8192, 12288, 16384), (4096, 8192, 16384), (4096, 8192, 16384))),
    # Tiny shapes for CPU runs: logic only, never a performance claim.
    "cpu": [(64, 64, 64), (128, 64, 32)],
}
ITERS = {"smoke": 10, "quick": 20, "thorough": 30, "cpu": 3}
# dtypes measured when none are asked for: the smoke depth measures only what training runs in.
DEPTH_DTYPES = {"smoke": ("bf16",)}
WARMUP_ITERS = 5
INPUT_SETS = 3
# How long all GPUs together may take before the ones still running are killed (an error result each);
# inside the benchmark module's own timeout, so what the others measured is kept.
TIMEOUT_S = {"smoke": 300, "quick": 800, "thorough": 3600, "cpu": 300}
BARRIER_TIMEOUT_S = 300


def _make_inputs(torch, dtype_name, m, n, k, device):
    gen = torch.Generator(device=device).manual_seed(m * 31 + n * 7 + k)
    if dtype_name == "fp8":
        a = torch.randn(m, k, device=device, generator=gen).to(torch.float8_e4m3fn)
        # _scaled_mm wants B column-major: store (N, K) row-major and pass its transpose.
        b = torch.randn(n, k, device=device, generator=gen).to(torch.float8_e4m3fn).t()
        return a, b
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[dtype_name]
    return (
        torch.randn(m, k, device=device, dtype=dtype, generator=gen),
        torch.randn(k, n, device=device, dtype=dtype, generator=gen),
    )


def _product(torch, dtype_name, device):
    if dtype_name == "fp8":
        one = torch.ones((), device=device)
        return lambda a, b: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    return torch.matmul


def supported_dtypes(torch, device) -> list[str]:
    if device.type != "cuda":
        return ["bf16", "tf32"]
    major, minor = torch.cuda.get_device_capability(device)
    # fp8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper).
    return [d for d in DTYPES if d != "fp8" or (major, minor) >= (8, 9)]


def measure_device(device_index: int | None, dtype_names, depth: str) -> dict:
    """Run the shapes of `depth` on one device; returns per-dtype figures."""
    import torch

    device = torch.device("cuda", device_index) if device_index is not None else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True  # "tf32" means fp32 storage on the tensor cores
    flush = None
    if device.type == "cuda":
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=device)
    timer = DeviceTimer(device)
    out = {}
    for dtype_name in dtype_names:
        mm = _product(torch, dtype_name, device)
        per_shape = []
        for m, n, k in SHAPES[depth]:
            sets = [_make_inputs(torch, dtype_name, m, n, k, device) for _ in range(INPUT_SETS)]
            for i in range(WARMUP_ITERS):
                mm(*sets[i % INPUT_SETS])
            tflops, ends = [], []
            for i in range(ITERS[depth]):
                if flush is not None:
                    flush.zero_()
                timer.start()
                mm(*sets[i % INPUT_SETS])
                tflops.append(2 * m * n * k / timer.stop_s() / 1e12)
                ends.append(round(time.monotonic(), 3))  # the sampler's causes are read against it (checks.figures)
            per_shape.append({"shape_mnk": [m, n, k], "tflops": summarize(tflops), "ends_s": ends})
            del sets
        best = max(per_shape, key=lambda s: s["tflops"]["median"])
        out[dtype_name] = {
            "tflops": significant(best["tflops"]["median"]),
            "tflops_max": significant(max(s["tflops"]["max"] for s in per_shape)),
            "best_shape_mnk": best["shape_mnk"],
            # the best shape's timed samples: values, n, min, median, max, spread_pct, and when each ended
            "samples_tflops": {**best["tflops"], "ends_s": best["ends_s"]},
            "per_shape": [{k: v for k, v in s.items() if k != "ends_s"} for s in per_shape],
        }
    if device.type == "cuda":
        out["device"] = {
            "name": torch.cuda.get_device_name(device),
            "pci_bus_id": cuda_pci_bus_id(torch, device),
            "uuid": cuda_uuid(torch, device),
        }
    else:
        out["device"] = {"name": "cpu", "pci_bus_id": None, "uuid": None}
    return out


def _worker(device_index, key, dtype_names, depth, barrier, queue, sdc_kind=None):
    if sdc_kind:
        # Read when cuBLAS starts in this process, so set before any CUDA work. :4096:8 is a 32 MiB workspace,
        # what torch picks by itself on Hopper (CublasHandlePool.cpp, getChosenWorkspaceSize: 4096 * 8 * 1024 on
        # sm90), so the timed products below run as they do without it; on older GPUs it is larger than torch's
        # own default, which cuBLAS may use but never needs.
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = sdc_measure.WORKSPACE_CONFIG
    laps = Laps()
    try:
        barrier.wait(timeout=BARRIER_TIMEOUT_S)  # a GPU that never gets here breaks the barrier for all
        laps.lap("barrier")
        out = measure_device(device_index, dtype_names, depth)
    except Exception as exc:  # reported per GPU; the other GPUs' numbers still count
        out = {"error": f"{type(exc).__name__}: {exc}"}
    laps.lap("measure")  # torch's import, the CUDA context, the timed products
    if sdc_kind:
        # After the timed work: it switches TF32 off and deterministic algorithms on, for the rest of this process.
        out["sdc"] = sdc_measure.measure_or_error(device_index, sdc_kind)
        laps.lap("fixed_computations")
    out["phases_s"] = laps.seconds
    queue.put((key, out))


def run(depth: str = "quick", dtypes=None, sdc_depth: str | None = None) -> dict:
    """All GPUs at once, one process each. On a machine without CUDA: the CPU, tiny shapes.

    sdc_depth: also compute benchmarks/sdc/sdc_measure.py's computations in each worker, right after its timed products (torch and
    CUDA are up there already); the output's "sdc" is then what sdc_measure.run(sdc_depth) returns. On the CPU the matmul
    then runs in sdc's CPU_PROCESSES worker processes too, not in this one.
    """
    import torch
    import torch.multiprocessing as mp

    n_gpus = torch.cuda.device_count()
    requested = depth
    dtypes = dtypes or DEPTH_DTYPES.get(depth, DTYPES)
    if n_gpus == 0:
        depth = "cpu"
    probe = torch.device("cuda", 0) if n_gpus else torch.device("cpu")
    dtype_names = [d for d in dtypes if d in supported_dtypes(torch, probe)]
    method = {
        "benchmark_version": BENCHMARK_VERSION,
        "tier": depth,  # the depth, under the name the comparisons' contexts and earlier documents know
        "requested_tier": requested,
        "shapes_mnk": SHAPES[depth],
        "iters_per_shape": ITERS[depth],
        "warmup_iters": WARMUP_ITERS,
        "input_sets": INPUT_SETS,
        "timer": "cuda events per product" if n_gpus else "perf_counter",
        "l2_flush": bool(n_gpus),
        "statistic": "best shape's median",
        "concurrent_gpus": n_gpus,
        "dtypes": dtype_names,
        "samples": "per GPU, the best bf16 shape's timed products: n, min, median, max, spread_pct = (max - min) / median",
    }
    sdc_kind = ("gpu" if n_gpus else "cpu") if sdc_depth else None
    sdc_out = None
    with GpuMonitor() as mon:
        if n_gpus == 0 and not sdc_kind:
            per_device = {"cpu": measure_device(None, dtype_names, depth)}
        else:
            keys = sdc_measure.worker_keys(n_gpus)
            ctx = mp.get_context("spawn")
            barrier, queue = ctx.Barrier(len(keys)), ctx.Queue()
            procs = [
                ctx.Process(
                    target=_worker, args=(k if n_gpus else None, k, dtype_names, depth, barrier, queue, sdc_kind)
                )
                for k in keys
            ]
            for p in procs:
                p.start()
            timeout_s = TIMEOUT_S[depth] + (sdc_measure.TIMEOUT_S if sdc_kind else 0)
            per_device = gather(
                procs, keys, queue, timeout_s, what="matmul on GPU" if n_gpus else "matmul in CPU process"
            )
            if sdc_kind:
                # A worker lost before it put anything: its error stands for the SDC computations too.
                sdc_per_device = {k: per_device[k].pop("sdc", None) or per_device[k] for k in keys}
                sdc_out = sdc_measure.report(sdc_per_device, keys, sdc_depth, sdc_kind, "the matmul workers")
            per_device = {str(k): v for k, v in sorted(per_device.items())}
    summary = {}
    for d in dtype_names:
        vals = [v[d]["tflops"] for v in per_device.values() if d in v]
        summary[d] = {
            "tflops_min": min(vals) if vals else None,
            "tflops_median": sorted(vals)[len(vals) // 2] if vals else None,
            "tflops_max": max(vals) if vals else None,
            "spread_pct": spread_pct(vals),
        }
    return {
        "benchmark": "matmul",
        "device": "cuda" if n_gpus else "cpu",
        "method": method,
        "versions": torch_versions(),
        "summary": summary,
        "per_device": per_device,
        "monitor": mon.summary(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_"))},
        **({"sdc": sdc_out} if sdc_out else {}),
    }


@registers("matmul", "run")
def run_matmul(steps) -> dict:
    """run() in the node stage (steps: measure.NodeSteps): with the sdc step in the same stage, its computations run
    in the matmul workers, after their timed products (no second start of torch and CUDA per GPU), in the first
    attempt only (a matmul measured again is about speed; the hashes do not depend on it), left for it in
    steps.shared."""
    out = run(steps.depth, sdc_depth=steps.depth if "sdc" in steps.names and "sdc" not in steps.shared else None)
    if "sdc" in out:
        steps.shared["sdc"] = out.pop("sdc")
    return out
