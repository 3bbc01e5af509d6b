"""The GPT-2 training gate on the CPU: tiny shape, real torchrun, real DDP over gloo (logic only)."""

import math

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import numbers, profiles  # noqa: E402
from gpufleet.bench.launch import free_port  # noqa: E402
from gpufleet.benchmarks.train_gpt2 import train_gpt2_judge as training_gate  # noqa: E402
from gpufleet.train import gpt2  # noqa: E402

# Slow: GPT-2 built and trained on the CPU, in processes of their own.
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests"), pytest.mark.slow]


def test_flops_per_token_is_the_palm_formula_for_gpt2_small():
    cfg = gpt2.SHAPES["gpt2-small"]
    model = gpt2.build_model(cfg)
    n_all = sum(p.numel() for p in model.parameters())
    # 124M parameters with the padded vocabulary, tied embeddings counted once.
    assert 124_000_000 < n_all < 125_000_000
    n = n_all - cfg.block_size * cfg.n_embd
    assert gpt2.flops_per_token(model, cfg) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert numbers.mfu(400_000, gpt2.flops_per_token(model, cfg), 989) == pytest.approx(
        400_000 * (6 * n + 12 * 12 * 12 * 64 * 1024) / 989e12
    )


def test_ddp_two_ranks_train_and_report_scaling():
    single = gpt2.run(nproc_per_node=1)
    full = gpt2.run(nproc_per_node=2)
    assert single["rc"] == 0 and full["rc"] == 0, full["log_tail"]
    assert full["world_size"] == 2 and len(full["ranks"]) == 2
    for rank in full["ranks"]:
        assert all(math.isfinite(x) for x in rank["losses"])
    # DDP keeps the replicas identical: both ranks start from the same weights and see the same loss scale.
    assert full["ranks"][0]["loss_first"] == pytest.approx(math.log(512), rel=0.1)
    prof = profiles.resolve("NVIDIA H200")
    res = {r["check"]: r for r in training_gate.train_gpt2(full, prof, single=single)}
    assert res["train_gpt2"]["status"] == "skip" and res["train_gpt2"]["value"] > 0
    assert res["train_scaling"]["status"] == "skip"
    assert res["train_scaling"]["value"] == pytest.approx(
        full["tokens_per_s_per_gpu"] / single["tokens_per_s_per_gpu"], rel=1e-2
    )
    assert res["train_gpt2"]["detail"]["mfu"] is not None

    # The same figures as a run across two nodes would report them (the playbook test runs one for real):
    # scaled against this node's own single-node result, or an error that names the missing figure.
    across = dict(full, nnodes=2)
    reference = {
        "check": "train_gpt2",
        "group": "benchmark",
        "status": "skip",
        "value": 1000,
        "reason": "r",
        "world_size": 1,
    }
    train, scaling = training_gate.train_gpt2(across, prof, reference=reference)
    assert (
        train["status"] == "skip" and "on 2 GPU(s) over 2 nodes" in train["reason"] and train["detail"]["nnodes"] == 2
    )
    assert (
        scaling["check"] == "train_scaling"
        and scaling["status"] == "skip"
        and "not a performance figure" in scaling["reason"]
    )
    assert scaling["value"] == pytest.approx(train["value"] / 1000, abs=1e-3)
    assert scaling["detail"]["tokens_per_s_per_gpu_one_node"] == 1000 and scaling["detail"]["world_size_one_node"] == 1
    (_, missing) = training_gate.train_gpt2(across, prof, reference=None)
    assert missing["status"] == "error" and missing["value"] is None and missing["remedy"]
    assert "single-node per-GPU figure of this node is missing" in missing["reason"]
    failed = {"check": "train_gpt2", "status": "error", "value": None, "reason": "benchmark crashed: OOM"}
    (_, missing) = training_gate.train_gpt2(across, prof, reference=failed)
    assert missing["status"] == "error" and "has no figure (status error: benchmark crashed: OOM)" in missing["reason"]


def test_a_failed_run_is_a_failure_with_its_log():
    out = gpt2.run(timeout_s=1)
    (res,) = training_gate.train_gpt2(out, profiles.resolve("NVIDIA H200"))
    assert res["status"] == "fail" and "timed out" in res["reason"] and res["detail"]["log_tail"] is not None


def test_a_node_that_never_comes_fails_the_run_across_nodes_within_the_timeout():
    """Node rank 1 dials a master nobody runs: killed at the timeout, a failure that says so, with the log."""
    out = gpt2.run(nnodes=2, node_rank=1, master_port=free_port(), timeout_s=4)
    (res,) = training_gate.train_gpt2(out, profiles.resolve("NVIDIA H200"), reference={"value": 1000})
    assert res["status"] == "fail" and res["reason"] == "GPT-2 training gate across 2 nodes timed out and was killed"
    assert "dead peer" in res["remedy"] and res["detail"]["log_tail"] is not None and res["detail"]["nnodes"] == 2
