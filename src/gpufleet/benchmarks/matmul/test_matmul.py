"""The matmul benchmark on the CPU (the code path a GPU runs, at tiny sizes: logic, never performance) and its
judgement of GPU-shaped figures: the threshold, throttling, the GPU a result is about."""

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.matmul import matmul_judge, matmul_measure as matmul  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.fixture(scope="module")
def profile():
    return profiles.resolve("NVIDIA H100 80GB HBM3")


def test_matmul_cpu_measures_every_shape_and_maps_to_skip(profile):
    out = matmul.run()
    assert out["device"] == "cpu" and out["method"]["tier"] == "cpu"
    cpu = out["per_device"]["cpu"]
    for dtype in out["method"]["dtypes"]:
        assert len(cpu[dtype]["per_shape"]) == len(matmul.SHAPES["cpu"])
        assert cpu[dtype]["tflops"] > 0
        assert cpu[dtype]["tflops_max"] >= cpu[dtype]["tflops"]
    (res,) = matmul_judge.matmul(out, profile)
    # A CPU figure is never judged against a GPU threshold.
    assert res["status"] == "skip" and "not a performance figure" in res["reason"]
    assert res["value"] == out["summary"]["bf16"]["tflops_min"]


def test_matmul_result_fails_under_threshold_and_on_throttle(profile):
    out = matmul.run()
    out["device"] = "cuda"  # judge the same numbers as if from a GPU
    low = profiles.resolve("NVIDIA H100 80GB HBM3", overrides={"matmul_bf16_tflops_min": 1e9})
    assert matmul_judge.matmul(out, low)[0]["status"] == "fail"
    # The CPU's samples spread with the machine's load: no drop limit here (the per-sample judgement has tests of
    # its own over recorded samples).
    ok = profiles.resolve(
        "NVIDIA H100 80GB HBM3", overrides={"matmul_bf16_tflops_min": 0.0, "sample_drop_pct_max": 100}
    )
    assert matmul_judge.matmul(out, ok)[0]["status"] == "pass"
    out["monitor"] = {"per_gpu": {"0": {"throttled": ["hw_thermal_slowdown"]}}}
    res = matmul_judge.matmul(out, ok)[0]
    assert res["status"] == "fail" and "throttled" in res["reason"]


def test_matmul_keeps_the_best_shapes_samples_and_the_device_uuid(profile):
    out = matmul.run("smoke")
    assert out["method"]["requested_tier"] == "smoke" and out["method"]["tier"] == "cpu"
    assert out["method"]["dtypes"] == ["bf16"]  # the smoke tier measures what training runs in
    cpu = out["per_device"]["cpu"]
    best = next(s for s in cpu["bf16"]["per_shape"] if s["shape_mnk"] == cpu["bf16"]["best_shape_mnk"])
    samples = cpu["bf16"]["samples_tflops"]
    assert {k: v for k, v in samples.items() if k != "ends_s"} == best["tflops"] and samples["n"] == matmul.ITERS["cpu"]
    # When each sample ended, on the clock the sampler's causes are read against: in order, one a sample.
    assert len(samples["ends_s"]) == samples["n"] and samples["ends_s"] == sorted(samples["ends_s"])
    assert samples["spread_pct"] == round(100 * (samples["max"] - samples["min"]) / samples["median"], 2)
    (res,) = matmul_judge.matmul(out, profile)
    row = res["detail"]["per_gpu"]["cpu"]
    assert (
        row["uuid"] is None
        and row["samples_tflops"] == samples
        and set(row) == {"bf16", "error", "uuid", "pci_bus_id", "samples_tflops"}
    )


def _gpu_matmul(tflops: dict, monitor_pci=("0000:18:00.0", "0000:2a:00.0")) -> dict:
    """A matmul output shaped as two GPUs give it (the fields the result mapping reads)."""
    per_device = {}
    for d, (value, pci) in enumerate(zip(tflops, ("0000:18:00", "0000:2a:00"))):
        samples = {"n": 20, "min": value * 0.95, "median": value, "max": value * 1.01, "spread_pct": 6.0}
        per_device[str(d)] = {
            "bf16": {
                "tflops": value,
                "tflops_max": value * 1.01,
                "best_shape_mnk": [8192] * 3,
                "samples_tflops": samples,
                "per_shape": [],
            },
            "device": {"name": "NVIDIA H200", "pci_bus_id": pci, "uuid": f"GPU-{d:08d}-aaaa-bbbb-cccc-dddddddddddd"},
        }
    monitor = {"per_gpu": {str(i): {"pci_bus_id": pci, "throttled": []} for i, pci in enumerate(monitor_pci)}}
    vals = list(tflops)
    return {
        "device": "cuda",
        "method": {"dtypes": ["bf16"]},
        "versions": {},
        "monitor": monitor,
        "per_device": per_device,
        "summary": {
            "bf16": {"tflops_min": min(vals), "spread_pct": round(100 * (max(vals) - min(vals)) / max(vals), 2)}
        },
    }


def test_matmul_results_flag_the_gpus_they_are_about():
    h200 = profiles.resolve("NVIDIA H200")  # matmul_bf16_tflops_min 700
    out = _gpu_matmul([790.0, 650.0])
    (res,) = matmul_judge.matmul(out, h200)
    assert res["status"] == "fail"
    assert res["detail"]["flagged_gpus"] == [
        {"index": 1, "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "serial": None}
    ]
    assert res["detail"]["per_gpu"]["1"]["uuid"] == "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"
    # The CUDA order need not be NVML's: the NVML index comes from the PCI bus id.
    out = _gpu_matmul([790.0, 650.0], monitor_pci=("0000:2a:00.0", "0000:18:00.0"))
    assert matmul_judge.matmul(out, h200)[0]["detail"]["flagged_gpus"][0]["index"] == 0
    out = _gpu_matmul([790.0, 705.0])  # both over the minimum, 10.8% apart: the slowest is named
    (res,) = matmul_judge.matmul(out, h200)
    assert res["status"] == "warn" and [g["index"] for g in res["detail"]["flagged_gpus"]] == [1]
    out = _gpu_matmul([790.0, 780.0])
    out["monitor"]["per_gpu"]["0"]["throttled"] = ["hw_thermal_slowdown"]
    (res,) = matmul_judge.matmul(out, h200)
    assert res["status"] == "fail" and res["detail"]["flagged_gpus"][0]["uuid"].startswith("GPU-00000000")
    (res,) = matmul_judge.matmul(_gpu_matmul([790.0, 780.0]), h200)
    assert res["status"] == "pass" and "flagged_gpus" not in res["detail"]
