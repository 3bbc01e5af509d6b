"""Readers: NVML (collect.nvml), sysfs/procfs (collect.host), the kernel
log (collect.kernel_log) and the software and firmware versions beside NVML's
(collect.software).

They return plain JSON-able dicts and never raise for a missing driver or
file: what could not be read is recorded with the reason, so a check can say
`error` or `skip` with that reason.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.collect import host, kernel_log, nvml, software
from gpufleet.base import paths
from gpufleet.collect.host.dmi import NAMES, SERIALS, read_dmi
from gpufleet.base.errors import InputError

GPU_IDENTITY = ("index", "name", "uuid", "serial", "pci_bus_id")


def read_all(root: str = "/") -> dict:
    return {
        "nvml": nvml.read(),
        "host": host.read(root),
        "kernel_log": kernel_log.read(root),
        "software": software.read(root),
    }


def board(readings: dict) -> dict | None:
    """The machine's identity in the readings (collect.host.dmi): its serials and names, `unreadable` saying why one
    is missing; None for readings that hold none (recorded before gpufleet read it)."""
    dmi = (readings.get("host") or {}).get("dmi")
    if not isinstance(dmi, dict):
        return None
    fields, not_read = dmi.get("fields") or {}, dmi.get("not_read") or {}
    return {k: fields.get(k) for k in SERIALS + NAMES} | {
        "unreadable": {k: not_read[k] for k in SERIALS + NAMES if k in not_read}
    }


def identity(root: str = "/") -> dict:
    """This machine's hardware now, as a certificate binds it (`gpufleet collect --identity`, what `gpufleet verify
    --live` runs): {"board": board(), "nvml": {"available", "error"}, "gpus": [{index, name, uuid, serial,
    pci_bus_id}]}. NVML's GPUs, all of them, as gpu_inventory.gpu_count's detail lists them."""
    nv = nvml.read()
    return {
        "board": board({"host": {"dmi": read_dmi(Path(root))}}),
        "nvml": {"available": bool(nv.get("available")), "error": nv.get("error")},
        "gpus": [{k: g.get(k) for k in GPU_IDENTITY} for g in nv.get("gpus") or []],
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
