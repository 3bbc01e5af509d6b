"""Silent data corruption: fixed, seeded computations on every GPU, their outputs hashed and compared.

A GPU that computes wrong bits without an error (a marginal SM, a weak memory cell, a bad tensor core) passes
every counter and every speed test. The same product of the same inputs, though, is bit-identical on GPUs of
the same model, SM count, driver, CUDA, torch and cuBLAS versions, with TF32 off and on one stream (cuBLAS
promises bit-wise identical results for a toolkit version on GPUs of the same architecture and SM count).
So each GPU runs:

- `matmul_bf16`, `matmul_fp32`: C = A @ B of seeded inputs (fp32 products with TF32 off);
- `train_mlp`: a few SGD steps of a small MLP in fp32 (forward, backward, update), the weights hashed after;

each `repeats` times in its own process (or, when matmul runs too, in the matmul worker after its timed
products), the outputs compared with the first repeat on the device (a GPU that disagrees with itself is named
too), and the first repeat's bytes hashed (sha256). benchmarks/sdc/sdc_judge.py compares the
hashes across the node's GPUs (majority), fleet/sdc_voters.py across the fleet through the store.

Inputs are drawn on the CPU from a seeded generator and copied over, so they do not depend on how a GPU's
generator splits its work; the bf16 product takes the fp32 product's inputs rounded to bf16. What breaks the comparison, and is therefore in `comparable` (never compared across):
another GPU model or SM count, driver, CUDA runtime, torch or cuBLAS version, TF32 on, another
CUBLAS_WORKSPACE_CONFIG, another method (SDC_VERSION, sizes, seeds). On the CPU the same code runs at tiny sizes
in two processes: fp32 products are deterministic there, the hashes compare for real, the figure is no claim on a
GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing as mp
import os
import time

from gpufleet.bench import BENCHMARK_VERSION, Laps, cuda_pci_bus_id, cuda_uuid, gather, torch_versions
from gpufleet.base.registry import registers

# Bump when a computation, a size or a seed changes: hashes of another version are never compared.
SDC_VERSION = 2
SEED = 20261124
# (M = N = K) of the products and (width, depth, batch, steps) of the MLP; cpu: tiny, logic only.
SIZES = {
    "gpu": {"matmul_bf16": 8192, "matmul_fp32": 8192, "train_mlp": (1024, 4, 512, 5)},
    "cpu": {"matmul_bf16": 64, "matmul_fp32": 64, "train_mlp": (32, 2, 16, 3)},
}
# Repeats on one GPU: a GPU that disagrees with itself shows within a few (the products take ~20 ms each at 8192).
REPEATS = {"gpu": 10, "cpu": 3}
CPU_PROCESSES = 2  # CPU "devices": separate processes, so the comparison across processes is exercised
TIMEOUT_S = 600
# One stream and a fixed workspace: cuBLAS picks the same kernels every time (its reproducibility notes).
WORKSPACE_CONFIG = ":4096:8"


def cublas_version() -> str | None:
    """The cuBLAS(Lt) library this process loaded, from cublasLtGetVersion (e.g. 120805 -> "12.8.5"); None before
    any CUDA product ran or without CUDA."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            path = next((line.split()[-1] for line in maps if "libcublasLt" in line), None)
        if not path:
            return None
        lib = ctypes.CDLL(path)
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        v = int(lib.cublasLtGetVersion())
    except (OSError, AttributeError):
        return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def tensor_sha256(t) -> str:
    """sha256 of a tensor's bytes in memory order (any dtype: bf16 has no numpy type, so as bytes)."""
    import torch

    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def _inputs(torch, size: int, device) -> tuple:
    """A and B of one size, drawn once on the CPU and copied to the device (drawing is most of a product's cost
    at 8192: the bf16 product of that size takes the same inputs rounded to bf16)."""
    gen = torch.Generator().manual_seed(SEED + size)
    return torch.randn(size, size, generator=gen).to(device), torch.randn(size, size, generator=gen).to(device)


def _computations(torch, device, sizes: dict) -> dict:
    """name -> a function giving the output tensor; inputs made once, on the device."""
    out, drawn = {}, {}
    for name, dtype in (("matmul_bf16", torch.bfloat16), ("matmul_fp32", torch.float32)):
        size = sizes[name]
        if size not in drawn:
            drawn[size] = _inputs(torch, size, device)
        a, b = (x.to(dtype) for x in drawn[size])
        out[name] = lambda a=a, b=b: torch.matmul(a, b)
    width, depth, batch, steps = sizes["train_mlp"]
    gen = torch.Generator().manual_seed(SEED)
    weights0 = [torch.randn(width, width, generator=gen) / width**0.5 for _ in range(depth)]
    x = torch.randn(batch, width, generator=gen).to(device)
    target = torch.randn(batch, width, generator=gen).to(device)

    def train():
        weights = [w.to(device).requires_grad_() for w in weights0]
        for _ in range(steps):
            h = x
            for w in weights:
                h = torch.tanh(h @ w)
            loss = ((h - target) ** 2).mean()
            grads = torch.autograd.grad(loss, weights)
            with torch.no_grad():
                weights = [(w - 0.1 * g).requires_grad_() for w, g in zip(weights, grads)]
        return torch.cat([w.detach().flatten() for w in weights])

    out["train_mlp"] = train
    return out


def deterministic_algorithms(torch) -> None:
    """torch.use_deterministic_algorithms(True), less its import of torch._inductor's configuration (sympy, and
    triton where installed: about 5 s of the matmul step on an H200 machine), which only compiled code reads;
    these computations run eagerly. The same switch of torch's core either way."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without it: the public call
        torch.use_deterministic_algorithms(True)
    else:
        setter(True, warn_only=False)


def measure_device(device_index: int | None, kind: str) -> dict:
    """Every computation `REPEATS[kind]` times on one device: the first output's hash, how many repeats differ."""
    import torch

    laps = Laps()
    device = torch.device("cuda", device_index) if device_index is not None else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    deterministic_algorithms(torch)
    laps.lap("settings")
    t0 = time.monotonic()
    hashes, differing = {}, {}
    computations = _computations(torch, device, SIZES[kind])
    laps.lap("inputs")
    for name, compute in computations.items():
        first = compute()
        differing[name] = sum(not torch.equal(compute(), first) for _ in range(REPEATS[kind] - 1))
        laps.lap(name)
        hashes[name] = tensor_sha256(first)
        laps.lap("hashes")
    info = {
        "hashes": hashes,
        "repeats_differing": differing,
        "seconds": round(time.monotonic() - t0, 2),
        "phases_s": laps.seconds,
        "versions": torch_versions(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["device"] = {
            "name": torch.cuda.get_device_name(device),
            "pci_bus_id": cuda_pci_bus_id(torch, device),
            "uuid": cuda_uuid(torch, device),
            "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
        }
        info["cublas"] = cublas_version()
    else:
        # The vector unit picks the CPU kernels: only processes of the same one are compared.
        info["device"] = {
            "name": "cpu",
            "pci_bus_id": None,
            "uuid": None,
            "sm_count": os.cpu_count(),
            "capability": torch.backends.cpu.get_cpu_capability(),
        }
        info["cublas"] = None
    return info


def measure_or_error(device_index: int | None, kind: str) -> dict:
    """measure_device, or {"error": ...}: reported per GPU, the other GPUs' hashes still count."""
    try:
        return measure_device(device_index, kind)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _worker(device_index, kind, key, queue):
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = WORKSPACE_CONFIG  # before CUDA starts in this process
    queue.put((key, measure_or_error(device_index, kind)))


def worker_keys(n_gpus: int) -> list:
    """The devices' keys: the GPUs' CUDA indexes, or CPU_PROCESSES CPU processes."""
    return list(range(n_gpus)) if n_gpus else [f"cpu{i}" for i in range(CPU_PROCESSES)]


def run(depth: str = "quick", n_gpus: int | None = None) -> dict:
    """Every GPU at once, one process each; on a machine without CUDA, CPU_PROCESSES processes at tiny sizes.
    The depth does not change the computations: hashes of every depth compare. n_gpus: the GPUs this node's
    processes may use (the engine counts them with NVML), so that this process need not load torch and CUDA
    only to count them (seconds, on top of every worker's own start); None: torch counts them.
    A run that also has matmul computes these in the matmul workers instead (benchmarks/matmul/matmul_measure.py, report())."""
    if n_gpus is None:
        import torch

        n_gpus = torch.cuda.device_count()
    kind = "gpu" if n_gpus else "cpu"
    keys = worker_keys(n_gpus)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(k if n_gpus else None, kind, k, queue)) for k in keys]
    for p in procs:
        p.start()
    per_device = gather(procs, keys, queue, TIMEOUT_S, what="sdc on GPU" if n_gpus else "sdc in CPU process")
    return report(per_device, keys, depth, kind, "its own processes")


def report(per_device: dict, keys: list, depth: str, kind: str, computed_in: str) -> dict:
    """The benchmark's output from every device's measure_device (or error) under `keys` (worker_keys)."""
    return {
        "benchmark": "sdc",
        "device": "cuda" if kind == "gpu" else "cpu",
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "sdc_version": SDC_VERSION,
            "tier": depth,  # the depth, under the name the comparisons' contexts and earlier documents know
            "seed": SEED,
            "sizes": SIZES[kind],
            "repeats": REPEATS[kind],
            "tf32": False,
            "deterministic_algorithms": True,
            "cublas_workspace_config": WORKSPACE_CONFIG,
            "inputs": "drawn on the CPU from the seed, copied to the device",
            "hash": "sha256 of the first repeat's output bytes (train_mlp: the weights after the last step)",
            "processes": len(keys),
            "computed_in": computed_in,
        },
        # The workers' torch: the versions of what computed the hashes.
        "versions": next((v["versions"] for v in per_device.values() if v.get("versions")), {}),
        "per_device": {str(k): {n: x for n, x in per_device[k].items() if n != "versions"} for k in keys},
    }


@registers("sdc", "run")
def run_sdc(steps) -> dict:
    """In the node stage (steps: measure.NodeSteps): what the matmul workers computed (steps.shared), else its own
    processes (matmul not in the run, or crashed); the node's NVML reading goes with it, which names each GPU's
    hashes."""
    if "sdc" not in steps.shared:
        steps.shared["sdc"] = run(steps.depth, n_gpus=steps.gpus)
    return {**steps.shared["sdc"], "nvml": steps.readings.get("nvml") or {}}
