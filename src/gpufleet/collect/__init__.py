"""Readers: NVML (collect.nvml), sysfs/procfs (collect.host) and the kernel
log (collect.kernel_log).

They return plain JSON-able dicts and never raise for a missing driver or
file: what could not be read is recorded with the reason, so a check can say
`error` or `skip` with that reason.
"""

from __future__ import annotations

from gpufleet.collect import host, kernel_log, nvml


def read_all(root: str = "/") -> dict:
    return {"nvml": nvml.read(), "host": host.read(root), "kernel_log": kernel_log.read(root)}
