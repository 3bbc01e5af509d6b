"""The disturbances of the calibration runs (tools/gpu_calibrate.py): the kinds, each kind's gpu_disturb processes,
a round's plan (which kind, on which GPUs, when and for how long) and the processes run to that plan."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = (
    "compute",
    "memcopy",
    "pcie",
    "other_user",
    "one_gpu",
    "short",
    "host_cpu",
    "host_memory",
    "disk_full",
    "disk_io",
)
# The host's own kinds: one set of processes on the machine, whatever its GPUs; the first two in place before the
# round's stages start (a node that comes with the fault), the last during them.
HOST_KINDS = ("host_cpu", "host_memory", "disk_full", "disk_io")
BEFORE_KINDS = ("host_memory", "disk_full")
NOBODY = 65534
# Each kind's gpu_disturb processes on one GPU: (its work, the uid it runs as; None: ours).
KIND_PROCESSES = {
    "compute": [(["--kind", "matmul"], None)],
    "short": [(["--kind", "matmul"], None)],
    "memcopy": [(["--kind", "copy"], None)],
    "pcie": [(["--kind", "pcie"], None)],
    "one_gpu": [(["--kind", "matmul", "--size", "2048"], None)],
    "other_user": [(["--kind", "matmul"], NOBODY), (["--kind", "copy", "--size", "1024"], NOBODY)],
    "host_cpu": [(["--kind", "cpu"], None)],  # the host's: gpu_disturb runs them as NEIGHBOUR, made when missing
    "host_memory": [(["--kind", "memory", "--procs", "2"], None)],
    "disk_full": [(["--kind", "fill"], None)],
    "disk_io": [(["--kind", "io", "--procs", "2"], None)],
}
NEIGHBOUR = "gpufleet-neighbour"


class Disturbance:
    """gpu_disturb processes on `gpus`, started `delay_s` after the round starts, for `duration_s` of work."""

    def __init__(
        self, kind: str, gpus: list[int], delay_s: float, duration_s: float, procs: int, cpu: bool, scratch: str = ""
    ):
        self.kind, self.gpus, self.delay_s, self.duration_s, self.cpu = kind, gpus, delay_s, duration_s, cpu
        self.scratch = scratch
        self.ready = threading.Event()  # its first line read: the fault is in place
        self.n_procs = procs  # host_cpu: how many busy processes
        self.record = {
            "kind": kind,
            "gpus": gpus if kind not in HOST_KINDS else [],
            "procs": procs or None,
            "delay_s": round(delay_s, 1),
            "duration_s": round(duration_s, 1),
            "pids": [],
            "user": None,
            "ready_epoch": None,
            "end_epoch": None,
            "lines": [],
        }
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.stop = threading.Event()
        self.procs: list = []

    def _commands(self) -> list[tuple[list[str], int | None]]:
        """The kind's processes on each of the round's GPUs (one GPU unless --gpus-disturbed says more)."""
        base = [sys.executable, str(HERE / "gpu_disturb.py"), "--seconds", str(self.duration_s)]
        if self.kind == "host_cpu":  # the host's, not a GPU's: one set (a logic check makes no user)
            user = [] if self.cpu else ["--as-user", NEIGHBOUR]
            return [
                (base + work + user + ["--procs", str(self.n_procs)], uid) for work, uid in KIND_PROCESSES[self.kind]
            ]
        if self.kind in HOST_KINDS:  # the memory (another user's) or the scratch drive
            extra = ["--as-user", NEIGHBOUR] if self.kind == "host_memory" and not self.cpu else []
            extra += (
                ["--share", "0.05"] if self.kind == "host_memory" and self.cpu else []
            )  # a logic check holds little
            extra += ["--path", self.scratch] if self.kind != "host_memory" else []
            return [(base + work + extra, uid) for work, uid in KIND_PROCESSES[self.kind]]
        wheres = [["--cpu"]] if self.cpu else [["--gpu", str(g)] for g in self.gpus]
        return [(base + where + work, user) for where in wheres for work, user in KIND_PROCESSES[self.kind]]

    def _run(self):
        if self.stop.wait(self.delay_s):
            return
        procs = self.procs
        for cmd, uid in self._commands():
            kw = {"user": uid, "group": uid, "extra_groups": []} if uid is not None and os.geteuid() == 0 else {}
            try:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw))
            except OSError as exc:  # recorded: a round whose disturbance never ran is not counted as disturbed
                self.record["error"] = f"{cmd[3:]} as uid {uid}: {exc}"
                continue
            self.record["user"] = uid
        for p in procs:
            self.record["pids"].append(p.pid)
            first = p.stdout.readline().strip()  # printed once CUDA is up, just before the work starts
            self.record["lines"].append(first)
            if first.startswith("gpu_disturb pid"):  # empty: stopped before it began (the stages were over)
                self.record["ready_epoch"] = self.record["ready_epoch"] or round(time.time(), 2)
        self.ready.set()  # in place, or never will be: the stages waiting for it go on
        for p in procs:
            rest = p.communicate()[0]
            self.record["lines"].append(rest.strip()[-300:])
        self.record["end_epoch"] = round(time.time(), 2)

    def start(self):
        self.thread.start()

    def finish(self):
        """The round's stages are over: one that has not started never will, one still running is stopped
        (SIGTERM: it prints its summary and exits), so no round runs into the next."""
        self.stop.set()
        for p in list(self.procs):
            if p.poll() is None:
                p.terminate()
        self.thread.join()


def let_others_run_python() -> None:
    """Another user's processes need to reach this interpreter (under /root, say): each folder on its path gets
    o+x. Only on the GPU machine, which is ours for the run."""
    path = Path(sys.executable).resolve()
    for d in [*path.parents][::-1]:
        try:
            os.chmod(d, d.stat().st_mode | 0o001)
        except OSError:
            pass


def plan_round(
    rng: random.Random, n_gpus: int, disturbed: bool, kinds: list[str], stage_s: float, gpus_disturbed: int = 1
) -> dict | None:
    """The round's disturbance, or None. It starts at a random moment inside the node stage (`stage_s`, the last
    round's), so that it meets the benchmarks; a short one lasts 1 to 3 s, inside one step. It runs on
    `gpus_disturbed` random GPUs (in the split layout each of them is a node of its own: a disturbed node-run each)."""
    if not disturbed:
        return None
    kind = rng.choice(kinds)
    gpus = sorted(rng.sample(range(n_gpus), min(max(gpus_disturbed, 1), n_gpus)))
    latest = max(4.0, 0.6 * stage_s)
    if kind in BEFORE_KINDS:  # in place before the stages, for all of them
        return {"kind": kind, "gpus": gpus, "delay_s": 0.0, "duration_s": stage_s + 60, "procs": 0}
    if kind == "short":
        delay, duration = rng.uniform(2, latest), rng.uniform(1, 3)
    else:
        delay, duration = rng.uniform(2, latest), rng.uniform(8, 40)
    procs = max(2, round(rng.uniform(0.15, 0.5) * (os.cpu_count() or 1))) if kind == "host_cpu" else 0
    return {"kind": kind, "gpus": gpus, "delay_s": delay, "duration_s": duration, "procs": procs}
