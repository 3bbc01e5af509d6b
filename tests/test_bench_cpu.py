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

from gpufleet import profiles  # noqa: E402
from gpufleet.bench import matmul, memory, nccl  # noqa: E402
from gpufleet.checks import benchmarks  # noqa: E402

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
    (res,) = benchmarks.matmul(out, profile)
    # A CPU figure is never judged against a GPU threshold.
    assert res["status"] == "skip" and "not a performance figure" in res["reason"]
    assert res["value"] == out["summary"]["bf16"]["tflops_min"]


def test_matmul_result_fails_under_threshold_and_on_throttle(profile):
    out = matmul.run()
    out["device"] = "cuda"  # judge the same numbers as if from a GPU
    low = profiles.resolve("NVIDIA H100 80GB HBM3", overrides={"matmul_bf16_tflops_min": 1e9})
    assert benchmarks.matmul(out, low)[0]["status"] == "fail"
    ok = profiles.resolve("NVIDIA H100 80GB HBM3", overrides={"matmul_bf16_tflops_min": 0.0})
    assert benchmarks.matmul(out, ok)[0]["status"] == "pass"
    out["monitor"] = {"per_gpu": {"0": {"throttled": ["hw_thermal_slowdown"]}}}
    res = benchmarks.matmul(out, ok)[0]
    assert res["status"] == "fail" and "throttled" in res["reason"]


def test_memory_cpu_copies_are_checked(profile):
    out = memory.run()
    hbm = out["per_device"]["hbm"]["cpu"]
    assert hbm["correct"] and hbm["hbm_copy_gbps"] > 0
    assert [r["status"] for r in benchmarks.memory(out, profile)] == ["skip"]


def test_bus_factors_follow_nccl_tests():
    assert nccl.BUS_FACTOR["all_reduce"](8) == pytest.approx(1.75)
    assert nccl.BUS_FACTOR["all_gather"](8) == pytest.approx(0.875)
    assert nccl.BUS_FACTOR["all_reduce"](2) == pytest.approx(1.0)


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
    res = {r["check"]: r for r in benchmarks.nccl(out, profile)}
    assert set(res) == {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all", "nccl_sendrecv"}
    assert all(r["status"] == "skip" for r in res.values())


def test_nccl_timeout_kills_the_whole_group(profile):
    t0 = time.monotonic()
    out = nccl.run(timeout_s=2)
    assert out["timed_out"] and time.monotonic() - t0 < 60
    (res,) = benchmarks.nccl(out, profile)
    assert res["status"] == "fail" and "timed out" in res["reason"]
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", "gpufleet.bench.nccl --worker"], capture_output=True, text=True).stdout
    assert left.strip() == ""


def test_nccl_wrong_result_fails(profile):
    out = {"device": "cuda", "rc": 0, "world_size": 2, "nnodes": 1, "nccl_log": {},
           "collectives": {"all_reduce": [{"size_bytes": 1 << 20, "busbw_gbps": 300.0, "algbw_gbps": 300.0, "correct": False}]}}
    (res,) = benchmarks.nccl(out, profile)
    assert res["status"] == "fail" and "wrong results" in res["reason"]


def test_sendrecv_names_the_slow_pair(profile):
    cell = lambda g: {"gbps": g, "correct": True}  # noqa: E731
    matrix = {"size_bytes": 1 << 28, "gbps": [[None, cell(300.0), cell(301.0)], [cell(299.0), None, cell(120.0)], [cell(300.5), cell(298.0), None]]}
    out = {"device": "cuda", "rc": 0, "world_size": 3, "nnodes": 1, "nccl_log": {}, "collectives": {}, "sendrecv": matrix}
    (res,) = benchmarks.nccl(out, profile)
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
    base = {"device": "cuda", "rc": 0, "world_size": 16, "nnodes": 2, "collectives": {},
            "nccl_log": nccl.parse_nccl_log("x NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0")}
    res = {r["check"]: r for r in benchmarks.nccl(base, profile, host_has_ib=True)}
    assert res["nccl_transport"]["status"] == "fail"
    res = {r["check"]: r for r in benchmarks.nccl(base, profile, host_has_ib=False)}
    assert res["nccl_transport"]["status"] == "warn"


def test_bench_cli_prints_a_host_document():
    env = dict(os.environ)
    cp = subprocess.run([sys.executable, "-m", "gpufleet", "bench", "matmul", "memory", "--json", "--host", "cpu-box"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["host"] == "cpu-box" and {r["check"] for r in doc["results"]} == {"matmul_bf16", "hbm_bandwidth"}
    assert all(r["group"] == "benchmark" and r["seconds"] >= 0 for r in doc["results"])
