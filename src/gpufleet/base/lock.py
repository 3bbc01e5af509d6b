"""One run per node at a time: the node lock.

A run takes the lock before it checks or loads a node's GPUs and gives it back at the end. A second run that
finds it held records an `error` naming the run that holds it instead of measuring beside it.

    /run/lock/gpufleet-node.lock  (gpufleet_lock_path)
    {"schema_version": 1, "run_id": "...", "controller": {"host", "pid", ...}, "taken": "<UTC>",
     "boot_id": "...", "holders": {"<inventory host>": {"since": "<UTC>", "expires_at": <epoch s>,
                                                         "heartbeat_at": <epoch s>}}}

Several inventory hosts of one run may share a machine (and so the file): each is a holder; the file goes when
the last one gives it back. A lock is taken over, with a note that says why, only when its holder is gone: the
node rebooted since (boot id), or the controller says the holding run is dead (its ansible-playbook main process,
recorded with its start time, is gone: `gpufleet.base.runs.dead_runs`, `gpufleet run alive`), or, for a run of another
controller, which this one cannot ask, every holder's lease expired. A run of the same controller whose process
still runs keeps the node however long it takes. A run that finds the node held fails it as an `error`, or first
waits up to `wait_s` (gpufleet_lock_wait_s) for it.

A stale lock is taken over only once no process of its run still works on the node: every engine process a run
starts there carries GPUFLEET_LOCK ({"path", "run_id", "holder", ...}) in its environment, and so does everything
it starts (`working()` finds them in /proc). While some remain, the record is marked "stopping" (by whom and why),
their guard sees it and stops them (guard.py), and the run that wants the node waits up to STOP_WAIT_S (or
gpufleet_lock_wait_s when longer) for them to be gone; after that it is refused, naming the run and its processes.
An engine process whose run no longer holds the lock (given back, taken over, told to stop) refuses to start.
Long jobs started in the background (NCCL and training across nodes) also check the holder's heartbeat, which
the controller renews while it waits for them: a job whose controller stopped waiting is stopped (guard.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from gpufleet.base import paths, schema
from gpufleet.base.errors import InputError

DEFAULT_PATH = "/run/lock/gpufleet-node.lock"
LOCK_SCHEMA_VERSION = 1
ENV = "GPUFLEET_LOCK"  # the lock an engine process works under: {"path", "run_id", "holder", "heartbeat_timeout_s"}
# How long a run waits, at the least, for the processes of a stale lock's run to stop once told to (their guard looks
# every 2 s, then gives what it started 5 s to end before it kills it).
STOP_WAIT_S = 60.0
# What to do about a node another run holds, in a playbook's run ({holder}, {path}: the lock's).
REMEDY_HELD = (
    "wait for that run to finish and re-run with --limit {holder} (gpufleet_lock_wait_s=SECONDS waits for it); if it "
    "was stopped on another controller, its lock is stale when its lease runs out (or remove {path} on the node once "
    "sure it is dead)"
)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _iso(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def read(path: str | Path) -> dict | None:
    """The lock record, or None when there is none; a record that cannot be read counts as none (said by
    `stale_reason` of the caller through the 'unreadable' key)."""
    rec, why = paths.read_json(path)
    if why and not os.path.lexists(path):  # given back
        return None
    if why:  # empty, cut short, bytes that are no UTF-8 text: no holder can be read from it
        return {"unreadable": why, "holders": {}}
    if not isinstance(rec, dict) or not isinstance(rec.get("holders"), dict):
        return {"unreadable": "not a lock record", "holders": {}}
    return rec


def stale_reason(rec: dict, now_s: float, dead_runs: tuple | list = (), controller: dict | None = None) -> str | None:
    """Why a lock record no longer holds the node, or None while it does. `controller` is the one asking: a lock
    taken from the same controller host is never stale by its lease, since that controller can say whether the run
    still goes (it names the run in `dead_runs` when it does not)."""
    if rec.get("unreadable"):
        return f"the lock file could not be read ({rec['unreadable']})"
    if rec.get("boot_id") and _boot_id() and rec["boot_id"] != _boot_id():
        return "the node rebooted since it was taken"
    if rec.get("run_id") in dead_runs:
        return "its run was stopped: the controller's ansible-playbook process for it is gone"
    if not rec["holders"]:
        return "it has no holder"
    if _same_controller(rec, controller):
        return None
    live = [h for h in rec["holders"].values() if isinstance(h, dict) and (h.get("expires_at") or 0) > now_s]
    if not live:
        last = max((h.get("expires_at") or 0 for h in rec["holders"].values() if isinstance(h, dict)), default=0)
        return f"its lease expired at {_iso(last)} without being given back" if last else "it has no holder"
    return None


def _same_controller(rec: dict, controller: dict | None) -> bool:
    holder_host = (rec.get("controller") or {}).get("host")
    return bool(holder_host) and holder_host == (controller or {}).get("host")


def describe(rec: dict) -> str:
    """ "run R (controller C, pid P), taken T" for messages."""
    ctl = rec.get("controller") or {}
    who = f"controller {ctl.get('host', '?')}, pid {ctl.get('pid', '?')}"
    return f"run {rec.get('run_id')!r} ({who}), taken {rec.get('taken')}, held for {', '.join(sorted(rec['holders'])) or 'nobody'}"


@contextlib.contextmanager
def _guarded(path: Path):
    """Serialise read-modify-write of the lock file between processes (a guard file beside it, never removed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.guard", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(
            f"cannot use the node lock {path}: {exc.strerror}; set gpufleet_lock_path to a file in a "
            "folder the node's user can write"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, rec: dict) -> None:
    paths.write_atomic(path, json.dumps(rec, sort_keys=True) + "\n", mode=0o644)


def working(path: str | Path, run_id: str | None) -> list[dict]:
    """The processes on this node that work for `run_id` (None: for any run) under the lock at `path` (their
    environment's GPUFLEET_LOCK names both), [{"pid", "command"}]; a process whose environment this user cannot
    read is another user's, not a run's of this lock."""
    want = os.path.normpath(str(path))
    workers = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
            if f"{ENV}=".encode() not in environ:
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry.name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not reaped yet: works no more
                    continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for var in environ.split(b"\0"):
            if var.startswith(f"{ENV}=".encode()):
                try:
                    spec = json.loads(var[len(ENV) + 1 :])
                except ValueError:
                    spec = None
                if (
                    isinstance(spec, dict)
                    and (run_id is None or spec.get("run_id") == run_id)
                    and os.path.normpath(str(spec.get("path"))) == want
                ):
                    workers.append({"pid": int(entry.name), "command": command[:200]})
    return workers


def acquire(
    path: str | Path,
    run_id: str,
    holder: str,
    ttl_s: float,
    *,
    controller: dict | None = None,
    dead_runs: tuple | list = (),
    wait_s: float = 0,
    poll_s: float = 1.0,
    stop_wait_s: float = STOP_WAIT_S,
) -> dict:
    """Take (or join, for the same run) the node's lock for `holder`, waiting up to `wait_s` while another run
    holds it, and up to `stop_wait_s` at the least while the processes of a stale lock's run stop.

    Returns {"acquired": True, "record", "stale": None or {"reason", "previous", "waited_for"}, "waited_s"} or
    {"acquired": False, "record", "reason", "waited_s", "working"} when another run holds it.
    """
    started = time.monotonic()
    waited_for: dict[int, dict] = {}
    while True:
        # Waited: the time before the attempt that decides. The attempt's own work (a stale lock's check reads every
        # process's environment, slow on a busy node) is not waiting.
        waited_s = time.monotonic() - started
        got = _acquire_once(Path(path), run_id, holder, ttl_s, controller, dead_runs)
        waited_for.update((p["pid"], p) for p in got.get("working") or [])
        if got.get("stale") and waited_for:
            got["stale"]["waited_for"] = list(waited_for.values())
        limit = max(wait_s, stop_wait_s) if got.get("working") else wait_s
        elapsed_s = time.monotonic() - started
        if got["acquired"] or elapsed_s >= limit:
            if not got["acquired"] and limit > 0:
                got["reason"] += (
                    f" (waited {waited_s:.0f} s of "
                    + (f"gpufleet_lock_wait_s {wait_s:g}" if limit == wait_s else f"{stop_wait_s:g} s for them to stop")
                    + ")"
                )
            return dict(got, waited_s=round(waited_s, 1))
        time.sleep(min(poll_s, max(limit - elapsed_s, 0.01)))


def _acquire_once(
    path: Path, run_id: str, holder: str, ttl_s: float, controller: dict | None, dead_runs: tuple | list
) -> dict:
    now = time.time()
    with _guarded(path):
        rec = read(path)
        stale = None
        if rec is not None and rec.get("run_id") != run_id:
            why = stale_reason(rec, now, dead_runs, controller)
            if why is None:
                lease = (
                    ""
                    if _same_controller(rec, controller)
                    else "; its lease runs to "
                    + _iso(max((h.get("expires_at") or 0) for h in rec["holders"].values() if isinstance(h, dict)))
                )
                return {"acquired": False, "record": rec, "reason": f"the node is held by {describe(rec)}{lease}"}
            # A record that cannot be read names no run: whatever works under this lock is waited for (its guard
            # reads the same record and stops).
            left = working(path, rec.get("run_id")) if rec.get("run_id") or rec.get("unreadable") else []
            if left:
                # Its run is gone, not what it started here: they are told to stop (their guard reads this), and the
                # node is taken over once none is left, never while one still measures.
                if (rec.get("stopping") or {}).get("by") != run_id:
                    rec["stopping"] = {"by": run_id, "since": schema.utc_now(), "reason": why}
                    _write(path, rec)
                named = ", ".join(f"pid {p['pid']} ({p['command'][:80]})" for p in left[:5])
                return {
                    "acquired": False,
                    "record": rec,
                    "working": left,
                    "reason": f"the node is held by {describe(rec)}: {why}, but {len(left)} of its processes still "
                    f"work on the node ({named}); they were told to stop, and the node is taken over once "
                    "they have",
                }
            stale = {"reason": why, "previous": rec}
            rec = None
        if rec is None:
            rec = {
                "schema_version": LOCK_SCHEMA_VERSION,
                "run_id": run_id,
                "controller": controller or {},
                "taken": schema.utc_now(),
                "boot_id": _boot_id(),
                "holders": {},
            }
        now = time.time()  # after the look for a stale run's processes: the moment the node is this run's
        rec["holders"][holder] = {"since": schema.utc_now(), "expires_at": now + ttl_s, "heartbeat_at": now}
        _write(path, rec)
    return {"acquired": True, "record": rec, "stale": stale}


def result(got: dict, path: str | Path, run_id: str, started: str, remedy: str) -> dict:
    """`lock.node_lock`, as a node's document records it: pass when this run holds the node (and whose stale lock
    it took over), else the error naming the run that holds it, with `remedy`: nothing is measured beside another
    run, whose figures would be neither run's."""
    detail = {
        "path": str(path),
        "record": got.get("record"),
        "stale": got.get("stale"),
        "waited_s": got.get("waited_s") or 0,
    }
    if got.get("acquired"):
        stale = got.get("stale")
        reason = f"held by this run ({run_id})" + (
            f"; took over the stale lock of run {(stale.get('previous') or {}).get('run_id', '?')}: {stale.get('reason')}"
            if stale
            else ""
        )
        return schema.result(
            "node_lock", schema.PASS, reason, group="lock", detail=detail, started=started, seconds=0.0
        )
    return schema.result(
        "node_lock",
        schema.ERROR,
        f"not measured: {got.get('reason')}. Figures taken while another run loads the GPUs would be neither run's",
        group="lock",
        detail=detail,
        remedy=remedy,
        started=started,
        seconds=0.0,
    )


def heartbeat(path: str | Path, run_id: str, holder: str) -> dict:
    """The controller is still waiting on this holder's jobs: {"held": bool, "reason"}."""
    path, now = Path(path), time.time()
    with _guarded(path):
        rec = read(path)
        if rec is None or rec.get("run_id") != run_id or holder not in rec["holders"]:
            return {"held": False, "reason": _lost(rec, run_id, holder, path)}
        rec["holders"][holder]["heartbeat_at"] = now
        _write(path, rec)
    return {"held": True, "reason": None}


def release(path: str | Path, run_id: str, holder: str) -> dict:
    """Give the lock back for `holder`; the file goes with the last holder. {"released": bool, "reason"}."""
    path = Path(path)
    with _guarded(path):
        rec = read(path)
        if rec is None or rec.get("run_id") != run_id or holder not in rec["holders"]:
            return {"released": False, "reason": _lost(rec, run_id, holder, path)}
        del rec["holders"][holder]
        if rec["holders"]:
            _write(path, rec)
        else:
            path.unlink(missing_ok=True)
    return {"released": True, "reason": None}


def check(
    path: str | Path, run_id: str, holder: str, heartbeat_timeout_s: float | None, since_s: float = 0
) -> str | None:
    """Why a job of `run_id` on this node must stop (lock lost, its run told to stop, or the controller stopped
    waiting), or None. `since_s` (epoch s) is when the job started: the controller was there to start it, so its
    silence counts from then at the earliest (its first poll may come well after the lock was taken on a busy
    controller). heartbeat_timeout_s None: the controller renews no heartbeat for this job (it waits on it directly)."""
    rec, now = read(path), time.time()
    if rec is None or rec.get("run_id") != run_id or holder not in rec.get("holders", {}):
        return _lost(rec, run_id, holder, path)
    if isinstance(rec.get("stopping"), dict):
        stop = rec["stopping"]
        return (
            f"run {run_id!r} was told to stop: {stop.get('reason')}; run {stop.get('by')!r} takes the node over once "
            "nothing of it works here"
        )
    if heartbeat_timeout_s is None:
        return None
    beat = max(rec["holders"][holder].get("heartbeat_at") or 0, since_s)
    if now - beat > heartbeat_timeout_s:
        return (
            f"the controller has not checked on this job for {now - beat:.0f} s (more than "
            f"{heartbeat_timeout_s:g} s): it was stopped or lost its connection"
        )
    return None


def _lost(rec: dict | None, run_id: str, holder: str, path: str | Path = "") -> str:
    if rec is not None and rec.get("unreadable"):
        return (
            f"run {run_id!r} no longer holds the node lock: the lock file {path} could not be read "
            f"({rec['unreadable']}); the next run takes it over"
        )
    if rec is None:
        return f"run {run_id!r} no longer holds the node lock: it was given back or removed"
    if rec.get("run_id") != run_id:
        return f"run {run_id!r} no longer holds the node lock: {describe(rec)}"
    return f"{holder} no longer holds the node lock of run {run_id!r}"
