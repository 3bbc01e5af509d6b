"""The site workloads' declaration (each declared in a site profile: base/workload_specs.py): its
checks and run tier."""

from __future__ import annotations

from gpufleet.base.registry import AGAIN, HARDWARE, LIMIT, Benchmark, Check, Threshold, declare

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "workload_below_expected_pct_max",
        "number",
        10,
        min=0,
        max=100,
        source=(
            "gpufleet default: a site's workload whose figure is more than 10% under the figure its own guide "
            "promises (the workload's `expected`) fails, once measured again; the seed's site measured 2,640, 37,510 "
            "and 64,596 images/s against its guides' 2,598, 36,926 and 62,450 (shared seeds, gh200-ddp-study.md), "
            "within 3.5% of each, while its slower configurations ran 9-27% under; a workload may set its own "
            "below_expected_pct_max"
        ),
    ),
    Threshold(
        "workload_scaling_efficiency_min",
        "number",
        0.9,
        min=0,
        source=(
            "gpufleet default, as train_scaling_efficiency_min: a site's workload's figure a GPU on more GPUs at "
            "least 90% of its own one-GPU figure (judged where it runs at 1 GPU and more); a workload may set its own"
            " scaling_efficiency_min, null to leave it unjudged (a guide whose runs at each count differ in batch or "
            "precision)"
        ),
    ),
)

# fmt: off
declare(
    # The runs past a limit measured again.
    Benchmark("workloads", run_tiers=("acceptance",), thresholds=THRESHOLDS, checks=(
        Check("workload", HARDWARE, ("workload_below_expected_pct_max",), against=(LIMIT,), **AGAIN,
              text="each site workload's figure at each GPU count against the figure its guide promises"),
        Check("workload_scaling", HARDWARE, ("workload_scaling_efficiency_min",), against=(LIMIT,), **AGAIN,
              text="a site workload's figure a GPU on more GPUs against its own one-GPU figure"),
    )),
)
# fmt: on
