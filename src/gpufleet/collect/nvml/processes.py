"""Which GPUs this node's processes may use (CUDA_VISIBLE_DEVICES) and the processes NVML lists on each."""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.collect.nvml.binding import MIB, call_first, pynvml, read_field


def process_name(pid: int, proc_root: str = "/proc") -> str | None:
    """/proc/<pid>/comm, else the first word of its cmdline (basename); None when neither is there."""
    base = Path(proc_root) / str(pid)
    try:
        name = (base / "comm").read_text(errors="replace").strip()
        if name:
            return name
    except OSError:
        pass
    try:
        first = (base / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        return None
    return os.path.basename(first.split()[0]) if first.split() else None


def process_list(kind: str, handle) -> list:
    fn = {"compute": "nvmlDeviceGetComputeRunningProcesses", "graphics": "nvmlDeviceGetGraphicsRunningProcesses"}[kind]
    # Newer bindings call the _v3 entry point, which older drivers lack: fall back to _v2.
    return call_first(
        (getattr(pynvml, fn, None), handle),
        (getattr(pynvml, f"{fn}_v3", None), handle),
        (getattr(pynvml, f"{fn}_v2", None), handle),
    )


def gpu_processes(handle, unreadable: dict) -> list | None:
    """Processes on one GPU (compute and graphics), one entry per pid."""
    by_pid: dict[int, dict] = {}
    for kind in ("compute", "graphics"):
        procs, err = read_field(process_list, kind, handle)
        if err:
            if kind == "compute":  # without the compute list the GPU cannot be called idle
                unreadable["processes"] = err
                return None
            unreadable["processes.graphics"] = err
            continue
        for proc in procs or []:
            pid = int(proc.pid)
            entry = by_pid.setdefault(
                pid, {"pid": pid, "name": process_name(pid), "used_memory_mib": None, "kinds": []}
            )
            if kind not in entry["kinds"]:
                entry["kinds"].append(kind)
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None:
                entry["used_memory_mib"] = max(entry["used_memory_mib"] or 0, int(used) // MIB)
    return [by_pid[pid] for pid in sorted(by_pid)]


def visible_indices(gpus: list[dict], cuda_visible_devices: str | None) -> dict:
    """The NVML GPUs that CUDA_VISIBLE_DEVICES leaves to this node's processes.

    Entries are NVML indices (CUDA orders GPUs of one model by PCI bus id, as NVML does) or GPU UUIDs
    ("GPU-..." or a unique prefix of one), read the way CUDA reads them: a negative or out-of-range index
    ends the list, and a repeated entry leaves no GPU visible. An entry that names no GPU NVML sees (a UUID
    matching none or several, a MIG instance, text) cannot be resolved here: then every GPU counts as
    visible, so that a typo never hides a GPU from a check, and `note` says so.

    Returns {"indices": [NVML index, ...], "all": bool (no restriction), "resolved": bool,
    "cuda_visible_devices": the value, "note": str | None}.
    """
    every = [g.get("index") for g in gpus]
    out = {"indices": every, "all": True, "resolved": True, "cuda_visible_devices": cuda_visible_devices, "note": None}
    if cuda_visible_devices is None:
        return out
    text = cuda_visible_devices.strip()
    uuids = {g.get("index"): (g.get("uuid") or "").lower() for g in gpus}
    chosen: list[int] = []
    for raw in text.split(",") if text else []:
        entry = raw.strip()
        if not entry:
            break  # as CUDA: an empty entry ends the list
        if entry.lstrip("+-").isdigit():
            index = int(entry)
            if index < 0 or index not in uuids:
                break  # CUDA ignores this entry and every one after it
        elif entry.upper().startswith("GPU-"):
            hits = [i for i, u in uuids.items() if u and u.startswith(entry.lower())]
            if len(hits) != 1:
                why = "matches no GPU UUID NVML sees" if not hits else f"matches {len(hits)} GPU UUIDs"
                return out | {
                    "resolved": False,
                    "note": f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: entry {entry!r} {why}, so every GPU is judged",
                }
            index = hits[0]
        else:
            what = "a MIG instance" if entry.upper().startswith("MIG-") else "neither an index nor a GPU UUID"
            return out | {
                "resolved": False,
                "note": f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: entry {entry!r} is {what}, so every GPU is judged",
            }
        if index in chosen:  # CUDA: a repeated device leaves none visible
            chosen = []
            break
        chosen.append(index)
    hidden = [i for i in every if i not in chosen]
    note = None
    if hidden:
        note = f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} leaves {len(chosen)} of {len(every)} GPUs to this node"
    return out | {"indices": chosen, "all": not hidden, "note": note}
