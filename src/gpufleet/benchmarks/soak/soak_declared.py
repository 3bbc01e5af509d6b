"""The soak's declaration: its checks and run tier (it runs in its own tier, never chosen)."""

from __future__ import annotations

from gpufleet.base.registry import (
    AGAIN,
    HARDWARE,
    SAMPLES,
    SIBLINGS,
    SOAK_COUNTERS,
    SOFTWARE,
    Benchmark,
    Check,
    Threshold,
    declare,
)

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "soak_slowdown_pct_max",
        "number",
        10,
        min=0,
        max=100,
        source=(
            "gpufleet default: in a soak (benchmark.soak_slowdown) a GPU whose matmul or HBM throughput in any window"
            " falls more than 10% below the median of its own three best windows, or whose soak median is more than "
            "10% below the node's median GPU, did not hold its load; clocks of a healthy GPU settle a few percent as "
            "it warms, and the node's quick-tier figures differ by about that (matmul_spread_pct_max)"
        ),
    ),
    Threshold(
        "soak_remeasure_max_s",
        "number",
        120,
        min=0,
        source=(
            "gpufleet default: a soak that met a foreign process is not run again in full; its disturbed windows are "
            "left out of the slowdown judgement and measured again once the GPUs are quiet, as one short soak as long"
            " as those windows and at most this long (at least two windows, to compare), so a disturbance costs the "
            "same at any soak length"
        ),
    ),
    Threshold(
        "soak_throttle_s_max",
        "number",
        0,
        min=0,
        source=(
            "gpufleet default: any second of hardware, thermal or power-brake slowdown under a sustained load "
            "(benchmark.soak_throttle) means cooling or power cannot sustain the GPU, as benchmark.matmul_bf16 fails "
            "a GPU that throttled; a software power cap under load is normal and only recorded"
        ),
    ),
)

# fmt: off
declare(
    # A soak disturbed or slowed past a limit is not run again in full: those windows are, bounded (soak_remeasure.py).
    Benchmark("soak", run_tiers=("soak",), selectable=False, thresholds=THRESHOLDS, checks=(
        Check("soak", SOFTWARE, ("soak_remeasure_max_s",), text="the soak's load started and ran its time"),
        Check("soak_throttle", HARDWARE, ("soak_throttle_s_max", "xid_fail_codes"),
              text="hardware and thermal slowdowns of each GPU during the soak"),
        Check("soak_errors", HARDWARE, ("xid_fail_codes",) + SOAK_COUNTERS,
              text="during the soak: a load that stopped, wrong all_reduce results, Xids, counters that moved"),
        Check("soak_slowdown", HARDWARE, ("soak_slowdown_pct_max",), against=(SAMPLES, SIBLINGS), **AGAIN,
              text="the soak's windows below the GPU's own best and below its siblings'"),
    )),
)
# fmt: on
