"""Real neighbours on the host for tests/test_host_watch.py, in a PID namespace of their own.

Run as root: `unshare --pid --fork --mount-proc <python> tests/host_neighbours.py CASE`. /proc then lists this
scenario's processes alone, so what the host watch names is what the scenario started, whatever else the machine
runs. Pid 1 (this file, `init`) reaps every orphan and exits with the scenario's code; when it exits, the kernel
kills whatever is left in the namespace, so no busy loop outlives a test. The processes:

    init (pid 1) -> ancestor (busy: a spinning thread, as a busy shell or module above the engine would be)
                      -> scenario (the engine: the host watch or measure.watched; prints one JSON line)
                           -> own_busy (a worker of the step, busy)
    init -> neighbour x 2 (busy, uid 65534, orphaned to init: nobody's process of this run)
    init -> marked (busy, root, its environment carries the scenario's GPUFLEET_RUN_MARK)

Every wait is for an event (a pid printed once its process is busy under its uid, the watch naming it, a process
gone), never a fixed time.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]

from waiting import wait_for  # noqa: E402

NOBODY = 65534
DEADLINE_S = 120


def name_process(name: str) -> None:
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/stat's name


def spin() -> None:
    while True:
        pass


def launch(name: str, uid: int | None, env: dict | None = None) -> int:
    """A busy process named `name`, under `uid`, orphaned to init (its launcher exits at once): its pid, once it
    runs under that uid."""
    cmd = [sys.executable, __file__, "orphan", name, str(uid if uid is not None else -1)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    pid = int(proc.stdout.readline())
    proc.stdout.close()
    proc.wait(timeout=DEADLINE_S)
    return pid


def orphan(name: str, uid: int) -> None:
    """The launcher: fork the busy process, which says its pid once it runs as `uid`, and exit."""
    if os.fork() == 0:
        if uid >= 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        name_process(name)
        print(os.getpid(), flush=True)
        os.close(1)
        spin()
    os._exit(0)


def own_worker() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "worker"], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # busy from here
    return proc


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(gone(p) for p in pids), DEADLINE_S, f"neighbours {pids} gone")


def tenth_of_a_core_pct() -> float:
    """A limit any busy loop passes on a loaded machine: a tenth of one CPU, as a share of all of them."""
    return round(10.0 / os.sysconf("SC_NPROCESSORS_ONLN"), 3)


# --- the cases -------------------------------------------------------------------------------------------------


def case_watch() -> dict:
    """The host watch beside neighbours, the step's own worker, a busy ancestor and a marked process."""
    from gpufleet.bench.host_watch import MARK_ENV, HostWatch, Limits
    from gpufleet.bench.watch import wait_quiet

    mark = f"run-{os.getpid()}"
    neighbours = [launch("neighbour", NOBODY) for _ in range(2)]
    marked = launch("marked", None, env={**os.environ, MARK_ENV: mark})
    own = own_worker()
    os.environ[MARK_ENV] = mark
    limits = Limits(cpu_pct=tenth_of_a_core_pct(), swap_mib_s=None)
    watch = HostWatch(interval_s=0.5, limits=limits).start()
    named = lambda: {p for e in watch.foreign() for p in e.get("pids") or []}  # noqa: E731
    wait_for(lambda: set(neighbours) <= named(), DEADLINE_S, "the watch naming both neighbours")
    watch.stop()
    seen = {"foreign": watch.foreign(), "summary": watch.summary()}
    stop(neighbours)
    # Quiet once the neighbours are gone, though the worker, the ancestor and the marked process still spin.
    quiet = wait_quiet(DEADLINE_S, poll_s=0.5, host=limits, gpus=False)
    own.kill()
    return {
        **seen,
        "quiet": quiet,
        "neighbours": neighbours,
        "own": own.pid,
        "ancestor": os.getppid(),
        "marked": marked,
        "limit_pct": limits.cpu_pct,
    }


def step_beside(neighbours: list[int], epoch_at: list):
    """A benchmark step for measure.watched: a host watch (the profile's limits, as a sampler started inside a
    step gets them) for as long as it takes to name the neighbours while they run, two intervals once they are
    gone; its output as a benchmark's, with the sampler's summary under "monitor"."""
    from gpufleet.bench.host_watch import HostWatch

    def run() -> dict:
        epoch = time.time()
        watch = HostWatch(interval_s=0.5).start()
        running = not all(gone(p) for p in neighbours)
        wait_for(
            (lambda: watch.foreign()) if running else (lambda: watch.intervals >= 2),
            DEADLINE_S,
            "the step's watch naming a neighbour" if running else "two intervals measured",
        )
        watch.stop()
        epoch_at.append(epoch)
        monitor = {"foreign": watch.foreign(), "host": watch.summary(), "started_epoch": epoch, "processes": []}
        return {"device": "cpu", "value": 790.0, "monitor": monitor}

    return run


def judge(out: dict, profile: dict) -> list:
    from gpufleet.base.schema import PASS, result

    return [result("matmul_bf16", PASS, "790 TFLOPS", value=out["value"], unit="TFLOPS")]


def case_watched(stops: bool) -> dict:
    """measure.watched of a step beside two neighbours: they stop once the step waits for the host to be quiet
    (`stops`), or never do within disturbed_wait_s."""
    from gpufleet.base import profiles
    from gpufleet.bench.host_watch import Limits
    from gpufleet.bench.watch import wait_quiet
    from gpufleet.node.measure import foreign_processes, watched

    neighbours = [launch("neighbour", NOBODY) for _ in range(2)]
    profile = profiles.resolve(
        None,
        overrides={"host_foreign_cpu_share_max": tenth_of_a_core_pct(), "disturbed_wait_s": 60 if stops else 2},
    )
    waits: list = []

    def wait(wait_s):  # as measure.watched waits by default, on the host alone: this machine has no GPU to list
        if stops:
            stop(neighbours)
        waits.append(wait_quiet(wait_s, poll_s=0.5, host=Limits.of(profile), gpus=False))
        return waits[-1]

    log: list = []
    epochs: list = []
    results = watched("matmul", step_beside(neighbours, epochs), judge, profile, log=log, wait=wait)
    node = foreign_processes("matmul", log)
    if not stops:
        stop(neighbours)
    return {"results": results, "node": node, "waits": waits, "neighbours": neighbours, "epochs": epochs}


# --- the processes ------------------------------------------------------------------------------------------------


def scenario(case: str) -> None:
    out = {"watch": case_watch, "again": lambda: case_watched(True), "never_quiet": lambda: case_watched(False)}[case]()
    print(json.dumps(out, default=str), flush=True)


def ancestor(case: str) -> int:
    """Above the scenario, busy: a spinning thread while it waits for the scenario."""
    pid = os.fork()
    if pid == 0:
        try:
            scenario(case)
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    threading.Thread(target=spin, daemon=True).start()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def init(case: str) -> int:
    """Pid 1 of the namespace: the ancestor's exit code, every orphan reaped meanwhile."""
    pid = os.fork()
    if pid == 0:
        os._exit(ancestor(case))
    while True:
        done, status = os.wait()
        if done == pid:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "orphan":
        orphan(sys.argv[2], int(sys.argv[3]))
    elif what == "worker":
        name_process("own_busy")
        print(os.getpid(), flush=True)
        spin()
    else:
        if os.getpid() != 1:
            sys.exit("run inside a PID namespace of its own: unshare --pid --fork --mount-proc python " + __file__)
        sys.exit(init(what))
