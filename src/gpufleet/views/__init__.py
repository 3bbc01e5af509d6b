"""Operator views of one node: `gpufleet status` (every GPU, live) and `gpufleet hw` (the hardware summary).

Each view is built from readings and rendered from the document it builds, so a recording renders the same
way as a live read. Readers: collect/ and, for what it does not read, views.system (procfs, sysfs, torch/NCCL)
and views.gpu (NVML held open for the live view; NVLink remote device types).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.errors import InputError


def load_recording(path: str) -> dict:
    """A `gpufleet collect` recording (its "nvml" part is what the views take)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"readings file {path} cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"readings file {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nvml"), dict):
        raise InputError(f"readings file {path}: expected an object with 'nvml' (from `gpufleet collect`)")
    return doc


def add_parsers(sub) -> None:
    """`gpufleet status` and `gpufleet hw`."""
    from gpufleet.views import hw, status

    status.add_parser(sub)
    hw.add_parser(sub)
