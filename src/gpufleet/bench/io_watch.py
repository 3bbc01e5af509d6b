"""The storage beside a drive benchmark: what moved on the scratch file's block device while it measured, and who
else moved data then, as bench.host_watch watches the CPUs.

Before and after a phase it reads the device's counts (/proc/diskstats: sectors read and written, milliseconds
busy) and every process's storage I/O (/proc/<pid>/io: read_bytes, write_bytes; another user's only as root).
What the device moved beyond the benchmark's own bytes, over the phase, is foreign I/O; over
`host_foreign_io_mib_s_max` MiB a second it disturbs the figure, as a CPU neighbour does, and the processes that
moved the most (not this run's: the engine's tree and its ancestors) are named.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpufleet.collect.host import load
from gpufleet.collect.host.files import read_text

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own
NAMED_MAX = 3


def block_device(path: str, sys_root: str = "/sys") -> str | None:
    """The block device (its /proc/diskstats name: "nvme0n1p2", "vda") a path's file system lives on, or None."""
    st = os.stat(path)
    link = Path(sys_root) / "dev/block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if not link.exists():
        return None
    real = Path(os.path.realpath(link))
    # a partition's counts miss what the rest of its disk does: the whole disk's are the drive's
    return real.parent.name if (real / "partition").exists() else real.name


def disk_counts(device: str | None, proc_root: str = "/proc") -> dict | None:
    """{"read_bytes", "written_bytes", "busy_ms"} of one device now, or None."""
    text, _ = read_text(Path(proc_root) / "diskstats")
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) >= 13 and f[2] == device:
            return {"read_bytes": int(f[5]) * SECTOR, "written_bytes": int(f[9]) * SECTOR, "busy_ms": int(f[12])}
    return None


def process_io(proc_root: str = "/proc") -> tuple[dict[int, tuple[int, str]], int]:
    """({pid: (read_bytes + write_bytes, name)} of every process whose io file this user may read, how many it may
    not)."""
    out, hidden = {}, 0
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        text, _ = read_text(Path(proc_root) / entry.name / "io")
        if text is None:
            hidden += 1
            continue
        fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        try:
            moved = int(fields["read_bytes"]) + int(fields["write_bytes"])
        except (KeyError, ValueError):
            continue
        out[int(entry.name)] = (moved, read_text(Path(proc_root) / entry.name / "comm")[0] or "?")
    return out, hidden


class IoWatch:
    """`start()`, the benchmark's phase, `stop(own_bytes)`: the phase judged ({"device", "seconds", "device_mib_s",
    "foreign_mib_s", "busy_pct", "disturbed", ...}); `foreign()` the disturbances, as bench.host_watch lists a
    neighbour (index None, kind "host_io", a label)."""

    def __init__(self, path: str, limit_mib_s: float | None, proc_root: str = "/proc", sys_root: str = "/sys"):
        self.proc_root, self.limit = proc_root, limit_mib_s
        self.device = block_device(path, sys_root)
        self.phases: list[dict] = []
        self._foreign: list[dict] = []
        self._t0 = time.monotonic()

    def start(self) -> None:
        self._start = (time.monotonic(), disk_counts(self.device, self.proc_root), process_io(self.proc_root)[0])

    def stop(self, own_bytes: int, phase: str) -> dict:
        t1, disk1, (procs1, hidden) = (
            time.monotonic(),
            disk_counts(self.device, self.proc_root),
            process_io(self.proc_root),
        )
        t0, disk0, procs0 = self._start
        dt = max(t1 - t0, 1e-6)
        ours = load.processes(self.proc_root)
        own = load.descendants(os.getpid(), ours) | load.ancestors(os.getpid(), ours)
        # a process new since the start started within the phase: all its bytes are in it
        movers = sorted(
            (
                (moved - procs0.get(pid, (0,))[0], pid, name)
                for pid, (moved, name) in procs1.items()
                if pid not in own and moved > procs0.get(pid, (0,))[0]
            ),
            reverse=True,
        )
        entry: dict = {"phase": phase, "device": self.device, "seconds": round(dt, 3), "processes_unreadable": hidden}
        if disk0 and disk1:
            moved = disk1["read_bytes"] - disk0["read_bytes"] + disk1["written_bytes"] - disk0["written_bytes"]
            foreign = max(0, moved - own_bytes)
            entry.update(
                device_mib_s=round(moved / dt / 2**20, 1),
                foreign_mib_s=round(foreign / dt / 2**20, 1),
                busy_pct=round(100.0 * (disk1["busy_ms"] - disk0["busy_ms"]) / (dt * 1000), 1),
            )
        else:  # no device counts (a file system on no block device): the processes' own bytes are all there is
            entry["foreign_mib_s"] = round(sum(m for m, _, _ in movers) / dt / 2**20, 1)
            entry["why_no_device"] = f"no /proc/diskstats line for the scratch file's device ({self.device})"
        entry["movers"] = [
            {"pid": pid, "name": name, "mib_s": round(m / dt / 2**20, 1)} for m, pid, name in movers[:NAMED_MAX]
        ]
        entry["disturbed"] = self.limit is not None and entry["foreign_mib_s"] > self.limit
        if entry["disturbed"]:
            t_s = [round(t0 - self._t0, 1), round(t1 - self._t0, 1)]
            self._foreign.append(
                {
                    "kind": "host_io",
                    "index": None,
                    "pid": movers[0][1] if movers else None,
                    "name": movers[0][2] if movers else None,
                    "first_s": t_s[0],
                    "last_s": t_s[1],
                    "label": label(entry, self.limit),
                }
            )
        self.phases.append(entry)
        return entry

    def foreign(self) -> list[dict]:
        return list(self._foreign)


def label(e: dict, limit: float) -> str:
    """'I/O not this run's on nvme0n1 during the write phase: 1,210 MiB/s (pid 4321 fio 1,180 MiB/s); limit 64 MiB/s'."""
    who = ", ".join(f"pid {m['pid']} {m['name']} {m['mib_s']:,.0f} MiB/s" for m in e["movers"])
    if not who and e.get("processes_unreadable"):
        who = f"{e['processes_unreadable']} processes' I/O unreadable without root"
    return (
        f"I/O not this run's on {e['device']} during the {e['phase']} phase: {e['foreign_mib_s']:,.0f} MiB/s"
        + (f" ({who})" if who else "")
        + f"; limit {limit:g} MiB/s"
    )
