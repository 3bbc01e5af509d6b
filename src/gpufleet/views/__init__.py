"""Operator views of one node: `gpufleet status` (every GPU, live) and `gpufleet hw` (the hardware summary).

Each view is built from readings and rendered from the document it builds, so a recording renders the same
way as a live read. Readers: collect/ and, for what it does not read, views.system (procfs, sysfs, torch/NCCL)
and views.gpu (NVML held open for the live view; NVLink remote device types).
"""

from __future__ import annotations

from gpufleet.views import hw, status


def add_parsers(sub) -> None:
    """`gpufleet status` and `gpufleet hw`."""
    status.add_parser(sub)
    hw.add_parser(sub)
