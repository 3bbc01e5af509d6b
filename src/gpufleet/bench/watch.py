"""Foreign processes on the GPUs a benchmark measures.

A step's own processes are the benchmark's process and its descendants (its workers), read from /proc;
any other process NVML lists on a GPU during the step is foreign, and the step's figures are not the node's.
ProcessWatch keeps every process seen, own or foreign, with the first and last time it was seen;
wait_quiet() polls the GPUs, and the host (bench.host_watch), until no foreign process is left, for a bounded time.
"""

from __future__ import annotations

import os
import time

from gpufleet.bench.host_watch import HostWatch, Limits
from gpufleet.collect.host import load
from gpufleet.collect.nvml.binding import as_text, init_nvml, pynvml
from gpufleet.collect.nvml.processes import gpu_processes, visible_indices

# Every pid ever found in this process's tree: a worker of an earlier step that NVML still lists for a
# moment after it exited is no longer in /proc, yet it was ours.
_OWN_PIDS: set[int] = set()


def process_tree(root_pid: int, proc_root: str = "/proc") -> set[int]:
    """root_pid and all its descendants, from the parent pid in /proc/<pid>/stat."""
    return load.descendants(root_pid, load.processes(proc_root))


def when_utc(started_epoch: float | None, t_s: float) -> str:
    if started_epoch is None:
        return f"{t_s:.1f} s"
    return time.strftime("%H:%M:%SZ", time.gmtime(started_epoch + t_s))


def describe(p: dict, started_epoch: float | None) -> str:
    """ "pid 1534 (gpu_disturb, 1002 MiB) on GPU 0 from 10:01:02Z to 10:01:40Z"; a host neighbour
    (bench.host_watch): "48 processes python3 of user alice (...) on the host from 10:01:02Z to 10:01:40Z" """
    span = f"from {when_utc(started_epoch, p['first_s'])} to {when_utc(started_epoch, p['last_s'])}"
    if p.get("index") is None and p.get("label"):
        return f"{p['label']} on the host {span}"
    name = p.get("name") or "name unknown: not in this host's /proc"
    mem = f"{p['used_memory_mib']} MiB" if p.get("used_memory_mib") is not None else "memory not reported"
    return f"pid {p['pid']} ({name}, {mem}) on GPU {p['index']} {span}"


class ProcessWatch:
    """Processes seen on the GPUs during one step: `note(index, t_s, procs)` at every sample (procs as
    collect.nvml lists them: {"pid", "name", "used_memory_mib"}); `processes()` all of them, `foreign()`
    those outside the step's process tree."""

    def __init__(self, root_pid: int | None = None, proc_root: str = "/proc"):
        self.root_pid = root_pid or os.getpid()
        self.proc_root = proc_root
        self.seen: dict[tuple, dict] = {}
        self.unreadable: dict[int, str] = {}

    def is_own(self, pid: int) -> bool:
        if pid in _OWN_PIDS or pid == self.root_pid:
            return True
        try:
            _OWN_PIDS.update(process_tree(self.root_pid, self.proc_root))
        except OSError:  # no /proc: nothing is known to be ours but this process
            pass
        return pid in _OWN_PIDS

    def note(self, index: int, t_s: float, procs: list | None, error: str | None = None) -> None:
        if procs is None:
            self.unreadable.setdefault(index, error or "process list unreadable")
            return
        for p in procs:
            key = (index, p["pid"])
            seen = self.seen.get(key)
            if seen is None:
                seen = self.seen[key] = {
                    "index": index,
                    "pid": p["pid"],
                    "name": p.get("name"),
                    "own": self.is_own(p["pid"]),
                    "used_memory_mib": None,
                    "first_s": round(t_s, 1),
                    "samples": 0,
                }
            mem = p.get("used_memory_mib")
            if mem is not None:
                seen["used_memory_mib"] = max(seen["used_memory_mib"] or 0, mem)
            seen.update(last_s=round(t_s, 1), samples=seen["samples"] + 1, name=seen["name"] or p.get("name"))

    def processes(self) -> list[dict]:
        return sorted(self.seen.values(), key=lambda p: (p["first_s"], p["index"], p["pid"]))

    def foreign(self) -> list[dict]:
        return [p for p in self.processes() if not p["own"]]


def in_window(foreign: list[dict], index: int, lo_s: float, hi_s: float) -> list[dict]:
    """The foreign processes a soak window of GPU `index` keeps ([lo_s, hi_s)): the GPU's own (pid, name, memory)
    and the host's neighbours (kind, label), whom every GPU of the soak shares."""
    keys = ("pid", "name", "used_memory_mib", "kind", "label", "first_s", "last_s")
    return [
        {k: p[k] for k in keys if k in p}
        for p in foreign
        if p["index"] in (index, None) and p["first_s"] < hi_s and p["last_s"] >= lo_s
    ]


def list_processes(nv, handle) -> tuple[list | None, str | None]:
    """One GPU's compute and graphics processes through NVML (collect.nvml), or None and why."""
    unreadable: dict = {}
    procs = gpu_processes(handle, unreadable)
    return procs, unreadable.get("processes")


def wait_quiet(
    wait_s: float,
    poll_s: float = 1.0,
    indices: list[int] | None = None,
    host: Limits | None = None,
    gpus: bool = True,
) -> dict:
    """Poll the GPUs (those CUDA_VISIBLE_DEVICES leaves, or `indices`) until no foreign process is on any and, given
    `host` limits, until the host's last interval was within them (bench.host_watch), at most wait_s; gpus=False:
    the host alone. Returns {"quiet": bool, "waited_s", "processes": every process seen, the host's neighbours
    over its limits too, "error"}."""
    t0 = time.monotonic()
    watch = ProcessWatch()
    neighbours = HostWatch(interval_s=poll_s, limits=host).read_from(t0) if host else None
    handles: list = []
    if gpus:
        try:
            init_nvml()
        except Exception as exc:
            return {"quiet": False, "waited_s": 0.0, "processes": [], "error": f"NVML unavailable: {exc}"}
    try:
        if gpus:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            if indices is None:
                listed = [{"index": i, "uuid": as_text(pynvml.nvmlDeviceGetUUID(h))} for i, h in enumerate(handles)]
                indices = visible_indices(listed, os.environ.get("CUDA_VISIBLE_DEVICES"))["indices"]
        while True:
            t = time.monotonic() - t0
            present = []
            for i in indices if gpus else []:
                procs, err = list_processes(pynvml, handles[i])
                watch.note(i, t, procs, err)
                present += [p for p in procs or [] if not watch.is_own(p["pid"])]
            busy = False
            if neighbours:  # quiet once an interval was read and judged within the limits
                seen = neighbours.sample()
                busy = bool(neighbours.error) or seen is None or seen["disturbed"]
            seen_all = watch.processes() + (neighbours.foreign() if neighbours else [])
            if not present and not watch.unreadable and not busy:
                return {"quiet": True, "waited_s": round(t, 1), "processes": seen_all, "error": None}
            if t >= wait_s:
                errors = [f"GPU {i}: {e}" for i, e in watch.unreadable.items()]
                errors += [neighbours.error] if neighbours and neighbours.error else []
                return {
                    "quiet": False,
                    "waited_s": round(t, 1),
                    "processes": seen_all,
                    "error": "; ".join(errors) or None,
                }
            time.sleep(poll_s)
    finally:
        if gpus:
            pynvml.nvmlShutdown()
