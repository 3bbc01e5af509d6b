"""report.json: the report itself, every result of every host as it came."""

from __future__ import annotations

import json

from gpufleet.base.registry import registers


@registers("output.json", "render")
def render(report: dict) -> str:
    # Results are written as they came; NaN/inf from a benchmark stay as Python writes them. No indent: that would
    # take json's pure-Python encoder, several times slower on a fleet's tens of megabytes.
    return json.dumps(report, default=str) + "\n"
