"""Benchmarks on the CPU: the same code paths as on GPUs, at tiny sizes, with gloo.

These check logic (sizes, factors, correctness checks, result mapping, timeouts),
never performance.
"""

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.nccl import nccl_measure as nccl  # noqa: E402
from gpufleet.benchmarks.matmul import matmul_judge, matmul_measure as matmul  # noqa: E402
from gpufleet.benchmarks.memory import memory_judge, memory_measure as memory  # noqa: E402
from gpufleet.benchmarks.nccl import nccl_judge as collectives  # noqa: E402
from waiting import left_running  # noqa: E402

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


def test_memory_cpu_copies_are_checked(profile):
    out = memory.run()
    hbm = out["per_device"]["hbm"]["cpu"]
    assert hbm["correct"] and hbm["hbm_copy_gbps"] > 0
    assert [r["status"] for r in memory_judge.memory(out, profile)] == ["skip"]


def test_bus_factors_follow_nccl_tests():
    assert nccl.BUS_FACTOR["all_reduce"](8) == pytest.approx(1.75)
    assert nccl.BUS_FACTOR["all_gather"](8) == pytest.approx(0.875)
    assert nccl.BUS_FACTOR["all_reduce"](2) == pytest.approx(1.0)


@pytest.mark.slow
def test_nccl_gloo_two_ranks_correct_results(profile):
    out = nccl.run(timeout_s=180)
    assert out["rc"] == 0, out["log_tail"]
    assert out["world_size"] == 2 and out["backend"] == "gloo"
    for name, rows in out["collectives"].items():
        assert [r["size_bytes"] for r in rows] == nccl.SIZES["cpu"][name]
        for r in rows:
            assert r["correct"], (name, r)
            # busbw = algbw * factor, to rounding
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * nccl.BUS_FACTOR[name](2), rel=1e-3)
    m = out["sendrecv"]["gbps"]
    assert m[0][0] is None and m[0][1]["correct"] and m[1][0]["correct"]
    res = {r["check"]: r for r in collectives.nccl(out, profile)}
    assert set(res) == {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all", "nccl_sendrecv"}
    assert all(r["status"] == "skip" for r in res.values())


@pytest.mark.slow
def test_nccl_timeout_kills_the_whole_group(profile):
    t0 = time.monotonic()
    out = nccl.run(timeout_s=2)
    assert out["timed_out"] and time.monotonic() - t0 < 60
    (res,) = collectives.nccl(out, profile)
    assert res["status"] == "fail" and "timed out" in res["reason"]
    assert not left_running(r"gpufleet\.bench\.nccl --worker")


def test_nccl_wrong_result_fails(profile):
    out = {
        "device": "cuda",
        "rc": 0,
        "world_size": 2,
        "nnodes": 1,
        "nccl_log": {},
        "collectives": {
            "all_reduce": [{"size_bytes": 1 << 20, "busbw_gbps": 300.0, "algbw_gbps": 300.0, "correct": False}]
        },
    }
    (res,) = collectives.nccl(out, profile)
    assert res["status"] == "fail" and "wrong results" in res["reason"]


def test_sendrecv_names_the_slow_pair(profile):
    cell = lambda g: {"gbps": g, "correct": True}  # noqa: E731
    matrix = {
        "size_bytes": 1 << 28,
        "gbps": [[None, cell(300.0), cell(301.0)], [cell(299.0), None, cell(120.0)], [cell(300.5), cell(298.0), None]],
    }
    out = {
        "device": "cuda",
        "rc": 0,
        "world_size": 3,
        "nnodes": 1,
        "nccl_log": {},
        "collectives": {},
        "sendrecv": matrix,
    }
    (res,) = collectives.nccl(out, profile)
    assert res["status"] == "fail" and "1->2 120.0" in res["reason"]


@pytest.mark.parametrize(
    "line, expect",
    [
        ("node0:1:1 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA", "ib_gdr"),
        ("node0:1:1 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0", "ib"),
        ("node0:1:1 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0", "socket"),
        ("node0:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", None),
    ],
)
def test_nccl_log_names_the_inter_node_transport(line, expect):
    assert nccl.parse_nccl_log(line)["inter_node"] == expect


def test_socket_fallback_on_an_infiniband_host_fails(profile):
    base = {
        "device": "cuda",
        "rc": 0,
        "world_size": 16,
        "nnodes": 2,
        "collectives": {},
        "nccl_log": nccl.parse_nccl_log("x NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0"),
    }
    res = {r["check"]: r for r in collectives.nccl(base, profile, host_has_ib=True)}
    assert res["nccl_transport"]["status"] == "fail"
    # Without InfiniBand there is nothing for the operator to change: information, not a warning.
    res = {r["check"]: r for r in collectives.nccl(base, profile, host_has_ib=False)}
    assert res["nccl_transport"]["status"] == "info" and res["nccl_transport"]["class"] is None


@pytest.mark.slow
def test_bench_cli_prints_a_host_document():
    env = dict(os.environ)
    cp = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "matmul", "memory", "--json", "--host", "cpu-box"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["host"] == "cpu-box" and {r["check"] for r in doc["results"]} == {"matmul_bf16", "hbm_bandwidth"}
    assert all(r["group"] == "benchmark" and r["seconds"] >= 0 for r in doc["results"])


# --- per-GPU identity and sample spread, the smoke tier, flagged GPUs ------------------------------------


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


def test_memory_samples_carry_their_spread(profile):
    out = memory.run("smoke")
    assert out["method"]["requested_tier"] == "smoke"
    hbm = out["per_device"]["hbm"]["cpu"]
    s = hbm["samples_gbps"]
    assert s["spread_pct"] == round(100 * (s["max"] - s["min"]) / s["median"], 2)
    assert hbm["uuid"] is None and hbm["pci_bus_id"] is None


def test_smoke_tier_sizes():
    assert list(nccl.SIZES["smoke"]) == ["all_reduce"]  # no send/recv matrix, no other collective
    assert nccl.SIZES["smoke"]["all_reduce"] == [1 << 20, 64 << 20, 1 << 30, 4 << 30]
    assert [nccl.iters_for(s, "smoke") for s in nccl.SIZES["smoke"]["all_reduce"]] == [50, 50, 5, 5]
    assert matmul.SHAPES["smoke"] == [(8192, 8192, 8192)] and matmul.ITERS["smoke"] < matmul.ITERS["quick"]
    assert memory.SIZES_BYTES["smoke"]["hbm"] < memory.SIZES_BYTES["quick"]["hbm"]


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


@pytest.mark.slow
def test_gather_names_a_worker_that_died_and_kills_one_that_hangs():
    import multiprocessing as mp

    from gpufleet.bench import gather

    # Forked, so the answering worker answers at once: a spawned one first imports this module and torch, which
    # can take a busy machine longer than the timeout. gather judges the processes, however they were started.
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_answer, args=(0, queue)),
        ctx.Process(target=os._exit, args=(3,)),
        ctx.Process(target=time.sleep, args=(60,)),
    ]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    got = gather(procs, [0, 1, 2], queue, timeout_s=8, what="worker")
    assert time.monotonic() - t0 < 30
    assert got[0] == {"ok": True}
    assert got[1] == {"error": "worker 1 exited with code 3 without a result"}
    assert got[2] == {"error": "worker 2 gave no result within 8 s and was killed"}
    assert not any(p.is_alive() for p in procs)


def _answer(key, queue):
    queue.put((key, {"ok": True}))


def test_device_uuids_take_nvmls_form():
    import uuid

    from gpufleet.bench import uuid_text

    u = uuid.UUID("df63b106-711b-65ab-d334-1175fcbc7655")
    want = "GPU-df63b106-711b-65ab-d334-1175fcbc7655"
    assert uuid_text(str(u)) == uuid_text(want.upper()) == uuid_text(u.bytes) == uuid_text(list(u.bytes)) == want
    assert uuid_text("not a uuid") is None and uuid_text(None) is None
