"""The matmul benchmark's declaration: its check, run tiers and metric (base/registry.py's declare())."""

from __future__ import annotations

from gpufleet.base.registry import HARDWARE, SAMPLED, SAMPLED_FIGURE, Benchmark, Check, Metric, Threshold, declare

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "matmul_bf16_tflops_min",
        "number",
        None,
        min=0,
        source="depends on the GPU model",
    ),
    Threshold(
        "matmul_spread_pct_max",
        "number",
        10,
        min=0,
        max=100,
        source="project choice; GPUs of one node should run within 10% of each other",
    ),
)

# fmt: off
declare(
    Benchmark("matmul", run_tiers=("smoke", "acceptance"), default=True, thresholds=THRESHOLDS, checks=(
        Check("matmul_bf16", HARDWARE, ("matmul_bf16_tflops_min", "matmul_spread_pct_max") + SAMPLED, **SAMPLED_FIGURE,
              text="bf16 matmul TFLOPS of the slowest GPU, all at once; a GPU that throttled fails"),
    )),
    metrics=(
        Metric("matmul_{dtype}_tflops", "{dtype} matmul", "TFLOPS", "gpufleet_matmul_flops", 1e12, per_gpu=True,
               words={"dtype": {d: d for d in ("bf16", "fp16", "tf32", "fp8")}}),
    ),
)
# fmt: on

from gpufleet.benchmarks.matmul import matmul_figures  # noqa: E402, F401 (registers how the fleet reads its figures)
