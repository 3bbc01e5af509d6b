"""An SDC benchmark's output as a node of H200s gives it (every hash right but the ones planted wrong), and its
result as the node judges it: for the SDC's own tests (src/gpufleet/benchmarks/sdc/test_sdc.py) and the runs of
many nodes built elsewhere (tests/test_controller_scale.py, tools/controller_cost.py)."""

from __future__ import annotations

import hashlib

from gpufleet.benchmarks.sdc import sdc_judge as sdc_check
from gpufleet.benchmarks.sdc import sdc_measure as bench_sdc

from test_fleet_synthetic import _stamp

COMPUTATIONS = tuple(bench_sdc.SIZES["gpu"])
VERSIONS = {"torch": "2.11.0+cu130", "cuda_runtime": "13.0", "nccl": "2.27.7"}


def good(name: str) -> str:
    return hashlib.sha256(f"right bits of {name}".encode()).hexdigest()


BAD = hashlib.sha256(b"one flipped bit").hexdigest()


def gpu_out(
    gpus: list[dict],
    *,
    corrupt: dict | None = None,
    differing: dict | None = None,
    cublas: dict | None = None,
    versions: dict | None = None,
) -> dict:
    """What bench/sdc.run() returns on a node of these GPUs (H200s): every hash right except `corrupt`
    {gpu index: computation}; `differing` {gpu index: repeats unlike the first}; `cublas` {gpu index: version}."""
    per = {}
    for g in gpus:
        i = g["index"]
        per[str(i)] = {
            "hashes": {n: BAD if (corrupt or {}).get(i) == n else good(n) for n in COMPUTATIONS},
            "repeats_differing": {n: (differing or {}).get(i, 0) if n == "matmul_fp32" else 0 for n in COMPUTATIONS},
            "seconds": 9.5,
            "cublas": (cublas or {}).get(i, "13.1.0"),
            "device": {
                "name": "NVIDIA H200",
                "pci_bus_id": g["pci_bus_id"][:12],
                "uuid": g["uuid"],
                "sm_count": 132,
                "capability": "9.0",
            },
        }
    return {
        "benchmark": "sdc",
        "device": "cuda",
        "versions": versions or VERSIONS,
        "per_device": per,
        "method": {
            "sdc_version": bench_sdc.SDC_VERSION,
            "seed": bench_sdc.SEED,
            "sizes": bench_sdc.SIZES["gpu"],
            "repeats": bench_sdc.REPEATS["gpu"],
            "tf32": False,
            "cublas_workspace_config": bench_sdc.WORKSPACE_CONFIG,
        },
    }


def node_result(gpus: list[dict], **kw) -> dict:
    (res,) = sdc_check.results(gpu_out(gpus, **kw), {}, {"gpus": gpus, "driver_version": "580.95.05"})
    return _stamp(res, "benchmark")
