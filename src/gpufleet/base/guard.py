"""Leave nothing behind on a node: stop what this engine started when the run that asked for it is gone.

The module that starts the engine (plugins/module_utils/engine_process.py) asks the kernel to send the engine SIGTERM
when the module dies (PR_SET_PDEATHSIG) and names itself in GPUFLEET_PARENT_PID; every engine process of a run
that holds the node lock names it in GPUFLEET_LOCK ({"path", "run_id", "holder", "heartbeat_timeout_s"}): when the
run loses the lock or is told to stop (a run that takes a stale lock over marks it so, lock.py), or, for a job the
controller waits on in the background, the controller stops renewing its heartbeat, the job is stopped; a process
whose run no longer holds the lock does not start at all. Either way every process group the engine started (torchrun and its ranks) is terminated and every
work folder it registered is removed; on SIGTERM the engine then exits. The controller's silence counts from the
job's start at the earliest (it was there to start it). Once stopped, the guard stays so: a process group tracked
after the stop (the engine was still preparing when its run went) is stopped at once.

    guard.start_from_env()            once, at the start of a command
    guard.track(proc) / untrack(proc) a child process group (started with start_new_session=True)
    guard.track_dir(path) / untrack_dir(path)
    guard.stopped()                   why the job was stopped, or None: results say it
    guard.at_stop(fn)                 fn() once the engine is stopped, before a signal ends it (a sweep job
                                      gives its node lock back)
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from gpufleet.base import lock
from gpufleet.base.errors import InputError

_groups: set[int] = set()
_dirs: set[str] = set()
_lock = threading.Lock()
_stopped: list[str] = []
_at_stop: list = []
_POLL_S = 2.0
_GRACE_S = 5.0

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child before exec (preexec_fn): the kernel sends `sig` when the parent goes. Linux only."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's own cleanup is all there is
        pass


def track(proc: subprocess.Popen) -> None:
    with _lock:
        _groups.add(proc.pid)
        late = bool(_stopped)
    if late:  # the run was stopped before this was started: it must not run unwatched
        _kill_groups()


def untrack(proc: subprocess.Popen) -> None:
    with _lock:
        _groups.discard(proc.pid)


def track_dir(path: str) -> None:
    with _lock:
        _dirs.add(path)


def untrack_dir(path: str) -> None:
    with _lock:
        _dirs.discard(path)


def stopped() -> str | None:
    return _stopped[0] if _stopped else None


def at_stop(fn) -> None:
    with _lock:
        _at_stop.append(fn)


def _kill_groups() -> None:
    with _lock:
        groups = set(_groups)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # torchrun starts each rank in a session of its own: their groups are stopped with it, found before the
        # SIGTERM while torchrun is still their parent, so a rank it had no time to stop does not run on.
        groups |= _descendant_groups(groups)
        alive = []
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
                alive.append(pgid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.monotonic() + _GRACE_S
        while time.monotonic() < deadline and any(_group_alive(g) for g in alive):
            time.sleep(0.1)
        groups = {g for g in alive if _group_alive(g)}


def _processes() -> dict[int, tuple[str, int, int]] | None:
    """{pid: (state, parent pid, process group)} of every process, or None without /proc."""
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    table = {}
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        table[int(pid)] = (state, int(ppid), int(pgrp))
    return table


def _descendant_groups(pgids: set[int]) -> set[int]:
    """The process groups of every process descended from a member of `pgids`."""
    table = _processes() or {}
    children: dict[int, list[int]] = {}
    for pid, (_state, ppid, _pgrp) in table.items():
        children.setdefault(ppid, []).append(pid)
    members = {pid for pid, (_state, _ppid, pgrp) in table.items() if pgrp in pgids}
    todo = list(members)
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in members:
                members.add(pid)
                todo.append(pid)
    return {table[pid][2] for pid in members}


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies (exited, their parent has not reaped them yet) do not
    count: a group of zombies is stopped, and waiting for it would only hold back the folders' removal."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    table = _processes()
    if table is None:  # no /proc: the kernel's answer above is all there is
        return True
    return any(pgrp == pgid and state != "Z" for state, _ppid, pgrp in table.values())


def _remove_dirs() -> None:
    with _lock:
        dirs = list(_dirs)
        _dirs.clear()
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


def stop(reason: str) -> None:
    """Stop every tracked process group and remove every tracked folder, once; results then carry `reason`."""
    with _lock:
        first = not _stopped
        if first:
            _stopped.append(reason)
    if first:
        print(f"gpufleet: stopping: {reason}", file=sys.stderr, flush=True)
    _kill_groups()
    _remove_dirs()
    with _lock:
        todo = list(_at_stop)
        _at_stop.clear()
    for fn in todo:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the stop goes on; the exit follows
            print(f"gpufleet: while stopping: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _on_signal(signum, frame) -> None:
    stop(f"the engine got {signal.Signals(signum).name}: the run that started it was stopped")
    # When the engine leads its own process group (a module started it), the group holds the benchmark workers
    # started without a session of their own; a shell's job group is not ours to kill.
    try:
        if os.getpgrp() == os.getpid():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(os.getpgrp(), signal.SIGTERM)
    finally:
        os._exit(128 + signum)


def _watch(parent_pid: int | None, lock_spec: dict | None, started_s: float) -> None:
    while not _stopped:
        if parent_pid and os.getppid() != parent_pid:
            _on_signal(signal.SIGTERM, None)
        if lock_spec:
            why = _lock_problem(lock_spec, started_s)
            if why:
                stop(why)
                return
        time.sleep(_POLL_S)


def _lock_problem(spec: dict, started_s: float) -> str | None:
    """Why the run this job works for no longer holds the node (lock.check). A spec without heartbeat_timeout_s
    watches the heartbeat for 120 s; null for a job the controller waits on directly, which renews none."""
    timeout_s = spec.get("heartbeat_timeout_s", 120)
    return lock.check(
        spec["path"], spec["run_id"], spec["holder"], None if timeout_s is None else float(timeout_s), since_s=started_s
    )


def start_from_env() -> None:
    """Install the signal handlers and, when the environment asks for it, the watcher thread. InputError when the
    run the environment names (GPUFLEET_LOCK) no longer holds the node: nothing is started for a run that was given
    back, taken over or told to stop."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    parent = os.environ.get("GPUFLEET_PARENT_PID")
    spec = os.environ.get("GPUFLEET_LOCK")
    parent_pid = int(parent) if parent and parent.isdigit() else None
    lock_spec = None
    if spec:
        try:
            lock_spec = json.loads(spec)
        except json.JSONDecodeError:
            lock_spec = None
        if not isinstance(lock_spec, dict) or not {"path", "run_id", "holder"} <= set(lock_spec):
            print(f"gpufleet: GPUFLEET_LOCK is not a lock spec ({spec!r}); not watching the lock", file=sys.stderr)
            lock_spec = None
    if parent_pid is None and lock_spec is None:
        return
    started_s = time.time()
    if lock_spec:
        why = _lock_problem(lock_spec, started_s)
        if why:
            raise InputError(f"not run: {why}")
    threading.Thread(target=_watch, args=(parent_pid, lock_spec, started_s), name="gpufleet-guard", daemon=True).start()
