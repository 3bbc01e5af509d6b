"""The site workloads' declaration (each declared in a site profile: base/workload_specs.py): its
checks and run tier."""

from __future__ import annotations

from gpufleet.base.registry import AGAIN, HARDWARE, LIMIT, Benchmark, Check, declare

# fmt: off
declare(
    # The runs past a limit measured again.
    Benchmark("workloads", run_tiers=("acceptance",), checks=(
        Check("workload", HARDWARE, ("workload_below_expected_pct_max",), against=(LIMIT,), **AGAIN,
              text="each site workload's figure at each GPU count against the figure its guide promises"),
        Check("workload_scaling", HARDWARE, ("workload_scaling_efficiency_min",), against=(LIMIT,), **AGAIN,
              text="a site workload's figure a GPU on more GPUs against its own one-GPU figure"),
    )),
)
# fmt: on
