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
    declare,
)

# fmt: off
declare(
    Benchmark("train_gpt2", run_tiers=("acceptance",), multinode=True, checks=(
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
