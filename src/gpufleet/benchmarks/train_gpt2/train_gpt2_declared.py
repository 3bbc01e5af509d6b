"""The training gate's declaration (GPT-2 small under torchrun): its checks, run tier and metric."""

from __future__ import annotations

from gpufleet.base.registry import (
    AGAIN,
    HARDWARE,
    LIMIT,
    SCOPES,
    SOFTWARE,
    WHOLE_RUN,
    Benchmark,
    Check,
    Metric,
    Threshold,
    declare,
)

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "train_gpt2_tokens_per_s_per_gpu_min",
        "number",
        None,
        min=0,
        source="depends on the GPU model",
    ),
    Threshold(
        "train_scaling_efficiency_min",
        "number",
        0.9,
        min=0,
        max=1,
        source=(
            "project choice; per-GPU throughput on all of a node's GPUs at least 90% of one GPU's, and across nodes "
            "at least 90% of the node's own"
        ),
    ),
)

# fmt: off
declare(
    Benchmark("train_gpt2", run_tiers=("acceptance",), multinode=True, thresholds=THRESHOLDS, checks=(
        Check("train_gpt2", SOFTWARE, ("train_gpt2_tokens_per_s_per_gpu_min", "bf16_dense_peak_tflops"),
              against=(LIMIT,), **AGAIN,
              text="GPT-2-small training on all the GPUs: tokens/s per GPU, MFU in detail"),
        Check("train_scaling", HARDWARE, ("train_scaling_efficiency_min",), against=(LIMIT,), **AGAIN,
              text="per-GPU tokens/s on all the GPUs over one GPU's (across nodes: over the node's own)"),
    )),
    metrics=(
        Metric("train_gpt2_{scope}_tokens_per_s_per_gpu", "GPT-2 training {scope}", "tokens/s/GPU",
               "gpufleet_train_tokens_per_second_per_gpu", words={"scope": SCOPES}, shared_when=WHOLE_RUN),
    ),
)
# fmt: on

from gpufleet.benchmarks.train_gpt2 import train_gpt2_figures  # noqa: E402, F401 (registers how the fleet reads its figures)
