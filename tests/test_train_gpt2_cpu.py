"""The GPT-2 training gate on the CPU: tiny shape, real torchrun, real DDP over gloo (logic only)."""

import math

import pytest

torch = pytest.importorskip("torch")

from gpufleet import profiles  # noqa: E402
from gpufleet.checks import benchmarks  # noqa: E402
from gpufleet.train import gpt2  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


def test_flops_per_token_is_the_palm_formula_for_gpt2_small():
    cfg = gpt2.SHAPES["gpt2-small"]
    model = gpt2.build_model(cfg)
    n_all = sum(p.numel() for p in model.parameters())
    # 124M parameters with the padded vocabulary, tied embeddings counted once.
    assert 124_000_000 < n_all < 125_000_000
    n = n_all - cfg.block_size * cfg.n_embd
    assert gpt2.flops_per_token(model, cfg) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert gpt2.mfu(400_000, gpt2.flops_per_token(model, cfg), 989) == pytest.approx(400_000 * (6 * n + 12 * 12 * 12 * 64 * 1024) / 989e12)


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
    res = {r["check"]: r for r in benchmarks.train_gpt2(full, prof, single=single)}
    assert res["train_gpt2"]["status"] == "skip" and res["train_gpt2"]["value"] > 0
    assert res["train_scaling"]["status"] == "skip"
    assert res["train_scaling"]["value"] == pytest.approx(full["tokens_per_s_per_gpu"] / single["tokens_per_s_per_gpu"], rel=1e-2)
    assert res["train_gpt2"]["detail"]["mfu"] is not None


def test_a_failed_run_is_a_failure_with_its_log():
    out = gpt2.run(timeout_s=1)
    (res,) = benchmarks.train_gpt2(out, profiles.resolve("NVIDIA H200"))
    assert res["status"] == "fail" and "timed out" in res["reason"] and res["detail"]["log_tail"] is not None
