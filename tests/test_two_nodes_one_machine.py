"""Judging a machine with two GPUs run as two nodes of one GPU each (gpufleet_node_env CUDA_VISIBLE_DEVICES),
replayed from the readings of that run on 2 x H200 (docs/results/2026-11-21-h200-x2-two-nodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.base import profiles
from gpufleet.benchmarks.nccl import nccl_judge as collectives
from gpufleet.benchmarks.train_gpt2 import train_gpt2_judge as training_gate

RUN = Path(__file__).resolve().parents[1] / "docs/results/2026-11-21-h200-x2-two-nodes/validate-two-nodes/hosts"


def _results(host: str) -> list[dict]:
    return json.loads((RUN / f"{host}.json").read_text())["results"]


def _nccl_out(results: list[dict], group: str) -> dict:
    """The NCCL benchmark's output as the engine had it, from what its results kept in detail."""
    coll = [
        r
        for r in results
        if r["group"] == group
        and r["check"] in ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all")
    ]
    base = {k: coll[0]["detail"][k] for k in ("method", "world_size", "nnodes", "backend", "rc", "nccl_log", "command")}
    return {**base, "device": "cuda", "collectives": {r["check"][len("nccl_") :]: r["detail"]["rows"] for r in coll}}


@pytest.fixture(scope="module")
def profile():
    return profiles.resolve("NVIDIA H200")


@pytest.mark.parametrize("host", ["node0", "node1"])
def test_one_gpu_node_skips_the_collectives_inside_it(host, profile):
    out = _nccl_out(_results(host), "benchmark")
    assert out["world_size"] == 1  # the recorded run: busbw 0.0 on every collective, which once failed the node
    (res,) = collectives.nccl(out, profile)
    assert res["status"] == "skip" and "one GPU" in res["reason"]


@pytest.mark.parametrize("host", ["node0", "node1"])
def test_nodes_that_share_a_machine_skip_the_transport_check_naming_the_path(host, profile):
    out = _nccl_out(_results(host), "benchmark_multinode")
    assert out["nnodes"] == 2 and out["world_size"] == 2
    res = {r["check"]: r for r in collectives.nccl(out, profile)}
    assert res["nccl_all_reduce"]["status"] == "pass" and res["nccl_all_reduce"]["value"] > 300
    transport = res["nccl_transport"]
    assert transport["status"] == "skip"
    assert "P2P/CUMEM" in transport["reason"] and "share a machine" in transport["reason"]


def test_a_real_network_transport_is_still_judged(profile):
    out = _nccl_out(_results("node0"), "benchmark_multinode")
    out["nccl_log"] = {**out["nccl_log"], "transports": ["NET/Socket/0"], "inter_node": "socket"}
    res = {r["check"]: r for r in collectives.nccl(out, profile, host_has_ib=True)}
    assert res["nccl_transport"]["status"] == "fail"


def test_no_scaling_result_from_a_one_gpu_node(profile):
    full = {
        "device": "cuda",
        "rc": 0,
        "world_size": 1,
        "nnodes": 1,
        "tokens_per_s_per_gpu": 539168.0,
        "tokens_per_s_total": 539168.0,
        "ranks": [
            {
                "flops_per_token": 1.0e9,
                "step_s_median": 0.12,
                "loss_first": 11.0,
                "loss_last": 10.6,
                "peak_memory_gib": 28.5,
                "tokens_per_s_per_gpu": 539168.0,
            }
        ],
    }
    single = {**full, "tokens_per_s_per_gpu": 538600.0}
    checks = [r["check"] for r in training_gate.train_gpt2(full, profile, single=single)]
    assert checks == ["train_gpt2"]
    checks = [r["check"] for r in training_gate.train_gpt2({**full, "world_size": 2}, profile, single=single)]
    assert checks == ["train_gpt2", "train_scaling"]


@pytest.mark.parametrize("listed, count", [(None, 2), ("1", 1), ("0,1", 2), ("", 0), ("0,1,2,3", 2)])
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, listed, count):
    from gpufleet.node import host_documents

    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    assert host_documents.visible_gpus(2) == count
