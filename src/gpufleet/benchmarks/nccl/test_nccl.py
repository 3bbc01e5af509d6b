"""The NCCL benchmark on the CPU (gloo, two ranks: logic, never performance) and its judgement: the bus factors of
nccl-tests, wrong results, a timeout, the slow pair of send/recv, the transport between nodes."""

import time

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.nccl import nccl_measure as nccl  # noqa: E402
from gpufleet.benchmarks.nccl import nccl_judge as collectives  # noqa: E402
from waiting import left_running  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.fixture(scope="module")
def profile():
    return profiles.resolve("NVIDIA H100 80GB HBM3")


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
