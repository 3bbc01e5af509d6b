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
    declare,
)

# fmt: off
declare(
    # A soak disturbed or slowed past a limit is not run again in full: those windows are, bounded (soak_remeasure.py).
    Benchmark("soak", run_tiers=("soak",), selectable=False, checks=(
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
