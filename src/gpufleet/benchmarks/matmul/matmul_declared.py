"""The matmul benchmark's declaration: its check, run tiers and metric (base/registry.py's declare())."""

from __future__ import annotations

from gpufleet.base.registry import HARDWARE, SAMPLED, SAMPLED_FIGURE, Benchmark, Check, Metric, declare

# fmt: off
declare(
    Benchmark("matmul", run_tiers=("smoke", "acceptance"), default=True, checks=(
        Check("matmul_bf16", HARDWARE, ("matmul_bf16_tflops_min", "matmul_spread_pct_max") + SAMPLED, **SAMPLED_FIGURE,
              text="bf16 matmul TFLOPS of the slowest GPU, all at once; a GPU that throttled fails"),
    )),
    metrics=(
        Metric("matmul_{dtype}_tflops", "{dtype} matmul", "TFLOPS", "gpufleet_matmul_flops", 1e12, per_gpu=True,
               words={"dtype": {d: d for d in ("bf16", "fp16", "tf32", "fp8")}}),
    ),
)
# fmt: on
