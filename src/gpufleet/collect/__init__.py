"""Readers: NVML (collect.nvml), sysfs/procfs (collect.host), the kernel
log (collect.kernel_log) and the software and firmware versions beside NVML's
(collect.software).

They return plain JSON-able dicts and never raise for a missing driver or
file: what could not be read is recorded with the reason, so a check can say
`error` or `skip` with that reason.
"""

from __future__ import annotations

from gpufleet.collect import host, kernel_log, nvml, software
from gpufleet.base import paths
from gpufleet.base.errors import InputError


def read_all(root: str = "/") -> dict:
    return {
        "nvml": nvml.read(),
        "host": host.read(root),
        "kernel_log": kernel_log.read(root),
        "software": software.read(root),
    }


def load_recording(path: str, parts: tuple[str, ...] = ("nvml", "host")) -> dict:
    """A `gpufleet collect` recording with the parts the caller reads; InputError naming the file otherwise."""
    doc, why = paths.read_json(path, follow=True)  # never waits on a FIFO
    if why:
        raise InputError(f"readings file {path} {why}")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(part), dict) for part in parts):
        wanted = " and ".join(repr(part) for part in parts)
        raise InputError(f"readings file {path}: expected an object with {wanted} (from `gpufleet collect`)")
    return doc
