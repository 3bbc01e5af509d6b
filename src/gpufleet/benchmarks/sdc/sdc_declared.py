"""The SDC benchmark's declaration: its check and run tiers."""

from __future__ import annotations

from gpufleet.base.registry import HARDWARE, Benchmark, Check, declare

# fmt: off
declare(
    Benchmark("sdc", run_tiers=("acceptance", "soak"), default=True, watched=False, checks=(
        Check("sdc", HARDWARE, ("driver_version",),
              text="silent data corruption: the same seeded work hashed on every GPU; one that disagrees fails"),
    )),
)
# fmt: on
