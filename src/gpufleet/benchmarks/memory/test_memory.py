"""The memory benchmark on the CPU (the code path a GPU runs, at tiny sizes: logic, never performance) and its
judgement of GPU-shaped figures: the copies checked, their spread, the GPUs a result is about."""

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.memory import memory_judge, memory_measure as memory  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.fixture(scope="module")
def profile():
    return profiles.resolve("NVIDIA H100 80GB HBM3")


def test_memory_cpu_copies_are_checked(profile):
    out = memory.run()
    hbm = out["per_device"]["hbm"]["cpu"]
    assert hbm["correct"] and hbm["hbm_copy_gbps"] > 0
    assert [r["status"] for r in memory_judge.memory(out, profile)] == ["skip"]


def test_memory_samples_carry_their_spread(profile):
    out = memory.run("smoke")
    assert out["method"]["requested_tier"] == "smoke"
    hbm = out["per_device"]["hbm"]["cpu"]
    s = hbm["samples_gbps"]
    assert s["spread_pct"] == round(100 * (s["max"] - s["min"]) / s["median"], 2)
    assert hbm["uuid"] is None and hbm["pci_bus_id"] is None


def test_memory_results_flag_only_their_own_gpus(profile):
    h200 = profiles.resolve("NVIDIA H200")  # hbm 4000, pcie 45
    hbm = {
        str(d): {
            "hbm_copy_gbps": v,
            "correct": True,
            "uuid": f"GPU-{d}",
            "pci_bus_id": pci,
            "samples_gbps": {"n": 20, "min": v, "median": v, "max": v, "spread_pct": 0.0},
        }
        for d, (v, pci) in enumerate(((4200.0, "0000:18:00"), (3100.0, "0000:2a:00")))
    }
    pcie = {
        str(d): {"h2d_gbps": v, "d2h_gbps": 55.0, "correct": True, "uuid": f"GPU-{d}", "pci_bus_id": pci}
        for d, (v, pci) in enumerate(((55.0, "0000:18:00"), (27.0, "0000:2a:00")))
    }
    out = {
        "device": "cuda",
        "method": {},
        "monitor": {"per_gpu": {"0": {"pci_bus_id": "0000:18:00.0"}, "1": {"pci_bus_id": "0000:2a:00.0"}}},
        "per_device": {"hbm": hbm, "pcie": pcie},
        "summary": {"hbm_copy_gbps_min": 3100.0, "h2d_gbps_min": 27.0, "d2h_gbps_min": 55.0, "hbm_spread_pct": 26.2},
    }
    res = {r["check"]: r for r in memory_judge.memory(out, h200)}
    assert res["hbm_bandwidth"]["detail"]["flagged_gpus"] == [{"index": 1, "uuid": "GPU-1", "serial": None}]
    assert res["pcie_h2d_bandwidth"]["detail"]["flagged_gpus"] == [{"index": 1, "uuid": "GPU-1", "serial": None}]
    assert res["pcie_d2h_bandwidth"]["status"] == "pass" and "flagged_gpus" not in res["pcie_d2h_bandwidth"]["detail"]
