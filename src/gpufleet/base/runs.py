"""Start a run on the controller: check its names, create its folder, record the attempt.

    <reports_dir>/<run_id>/run.json   {"schema_version", "run_id", "playbook", "started", "tier", "hosts",
                                       "attempts": [{"attempt", "started", "playbook", "limit", "stages",
                                                     "hosts", "controller": {"host", "pid", "started_ticks", "boot_id"},
                                                     "finished", "verdict", "locks_not_given_back": {host: why}}]}

A run id names one run for good: starting a run whose folder already holds one is refused, unless the run is
resumed (gpufleet_resume), which adds an attempt to the same run. The controller of each attempt (host name, the
ansible-playbook main process, which lives as long as the run, its start time and the boot id) is recorded, so a later run on the same controller can tell a
run that was killed from one that is still going (`dead_runs`): the node locks such a run left behind are stale.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from gpufleet.base import paths, registry, schema
from gpufleet.base.errors import InputError

RUN_FILE = "run.json"
RUN_SCHEMA_VERSION = 1


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks since boot, command) of a process, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), cmdline


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def controller_identity(pid: int | None = None) -> dict:
    """This controller and the process the run lives as long as: the ansible-playbook main process this command
    runs under, or this process when there is none.

    Ansible runs each task in a worker forked from ansible-playbook (the same command line) that ends with the
    task, so the main process is the outermost of the ancestors whose command line names ansible-playbook. Its
    start time (clock ticks since boot) and the boot id tell it from a later process given the same pid."""
    pid = pid or os.getpid()
    main_process = None
    seen = 0
    while pid > 1 and seen < 64:
        stat = _proc_stat(pid)
        if stat is None:
            break
        if "ansible-playbook" in stat[2]:
            main_process = (pid, stat[1])
        elif main_process is not None:
            break  # above the main process: the shell or ansible-runner that started it
        pid, seen = stat[0], seen + 1
    if main_process is None:
        own = _proc_stat(os.getpid())
        main_process = (os.getpid(), own[1] if own else None)
    return {
        "host": socket.gethostname(),
        "pid": main_process[0],
        "started_ticks": main_process[1],
        "boot_id": _boot_id(),
    }


def controller_alive(controller: dict) -> bool | None:
    """Whether the recorded controller process still runs; None when it ran on another host (cannot tell)."""
    if not isinstance(controller, dict) or controller.get("host") != socket.gethostname():
        return None
    if controller.get("boot_id") and controller["boot_id"] != _boot_id():
        return False
    stat = _proc_stat(controller.get("pid") or 0)
    return stat is not None and stat[1] == controller.get("started_ticks")


def new_run_id() -> str:
    """A run id for a run started without one: the UTC time, to the second."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def run_id_of(run_dir: Path | str) -> str:
    """The run's id, as `run start` recorded it in run.json: the one every report, store row and resume uses, so a
    renamed or moved run folder keeps its id. A folder without a readable run.json (a run from before run records)
    is known by its name."""
    doc, _ = paths.read_json(Path(run_dir) / RUN_FILE)
    if isinstance(doc, dict) and isinstance(doc.get("run_id"), str) and doc["run_id"]:
        return doc["run_id"]
    return Path(run_dir).resolve().name


def read_run(run_dir: Path) -> dict:
    """run.json; InputError naming it when it cannot be read, is damaged (bytes that are no UTF-8 text, not JSON)
    or is no run record, and saying what to do."""
    path = Path(run_dir) / RUN_FILE
    doc, why = paths.read_json(path)
    if why is None and (not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list)):
        why = "is not a run record (a JSON object with a list of attempts)"
    if why:
        raise InputError(
            f"{path} {why}; expected the run record `gpufleet run start` writes: restore it, or move it aside "
            "(the run is then known by its folder's name and its host documents)"
        )
    return doc


def going(run_dir: Path) -> bool:
    """Whether the run may still be going: its latest attempt has no report yet and its controller runs, or ran on
    another controller, which this one cannot ask. A folder without a readable run record is taken as ended."""
    try:
        attempts = read_run(Path(run_dir))["attempts"]
    except InputError:
        return False
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    return not last.get("finished") and controller_alive(last.get("controller")) is not False


def dead_runs(reports_dir: Path) -> list[str]:
    """Runs of this controller whose latest attempt's ansible-playbook is gone without a report: killed."""
    dead = []
    for path in sorted(reports_dir.glob(f"*/{RUN_FILE}")):
        try:
            doc = read_run(path.parent)
        except InputError:
            continue
        last = doc["attempts"][-1] if doc["attempts"] else {}
        if not last.get("finished") and controller_alive(last.get("controller")) is False:
            dead.append(doc.get("run_id") or path.parent.name)
    return dead


def start(
    reports_dir: str,
    run_id: str | None,
    *,
    playbook: str,
    hosts: list[str],
    tier: str | None = None,
    resume: bool = False,
    limit: str | None = None,
    stages: list[str] | None = None,
    dry_run: bool = False,
) -> dict:
    """Create or resume the run; return {"run_id", "run_dir", "attempt", "resumed", "controller", "dead_runs"}.

    The run id is minted here when none is given (gpufleet_run_id left out): the one place a run gets its id.
    `dry_run` (validate.yml --check): the same checks, nothing created or recorded; "dry_run": true in the answer.
    """
    run_id = run_id or new_run_id()
    paths.run_id(run_id, "gpufleet_run_id")
    for host in hosts:
        paths.safe_name(host, "the inventory host name")
    if not reports_dir or not os.path.isabs(reports_dir):
        raise InputError(f"gpufleet_reports_dir must be an absolute path; got {reports_dir!r}")
    reports = Path(reports_dir).resolve() if dry_run else paths.make_dir(Path(reports_dir).resolve())
    run_dir = paths.own_folder(reports, run_id, "gpufleet_run_id")
    now = schema.utc_now()
    controller = controller_identity()
    used = (run_dir / RUN_FILE).exists() or (run_dir / "hosts").exists()
    if used and not resume:
        started = ""
        try:
            started = f", started {read_run(run_dir).get('started')}"
        except InputError:
            pass
        raise InputError(
            f"gpufleet_run_id {run_id!r} is already used by the run in {run_dir}{started}: a run id names one run "
            f"and is never overwritten; choose another gpufleet_run_id (or leave it out for a new one), or resume "
            f"that run with `gpufleet fleet resume {run_id}` (gpufleet_resume=true)"
        )
    if resume and not used:
        raise InputError(f"gpufleet_resume is set but there is no run {run_id!r} in {reports} to resume")
    if dry_run:
        return {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "attempt": None,
            "resumed": bool(used),
            "controller": controller,
            "dead_runs": [],
            "dry_run": True,
        }
    paths.make_dir(run_dir)
    paths.make_dir(run_dir / "hosts")
    tier = tier or registry.DEFAULT_RUN_TIER  # what the engine's node stage runs when no tier is asked for
    if used and (run_dir / RUN_FILE).exists():
        doc = read_run(run_dir)
    else:  # a new run, or one from before run records: hosts/ without run.json
        doc = {
            "schema_version": RUN_SCHEMA_VERSION,
            "run_id": run_id,
            "playbook": playbook,
            "started": now,
            "tier": tier,
            "hosts": [],
            "attempts": [],
        }
    doc["hosts"] = sorted(set(doc.get("hosts") or []) | set(hosts))
    attempt = {
        "attempt": len(doc["attempts"]) + 1,
        "started": now,
        "playbook": playbook,
        "limit": limit or None,
        "stages": stages or None,
        "tier": tier,
        "hosts": list(hosts),
        "controller": controller,
    }
    doc["attempts"].append(attempt)
    paths.write_atomic(run_dir / RUN_FILE, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "attempt": attempt["attempt"],
        "resumed": bool(used),
        "controller": controller,
        "dead_runs": [r for r in dead_runs(reports) if r != run_id],
    }


def finish(run_dir: Path, verdict: str | None) -> None:
    """Mark the latest attempt finished (the report was made), so it is never taken for a killed run."""
    _update_attempt(run_dir, finished=schema.utc_now(), verdict=verdict)


def record_locks_kept(run_dir: Path, kept: dict) -> None:
    """Record in the latest attempt the nodes whose lock it could not give back, {host: why}: their next run
    takes them over (this controller's ansible-playbook is gone) or waits out the lease (another controller's)."""
    _update_attempt(run_dir, locks_not_given_back=kept)


def _update_attempt(run_dir: Path, **fields) -> None:
    path = run_dir / RUN_FILE
    if not path.exists():
        return
    doc = read_run(run_dir)
    if doc["attempts"]:
        doc["attempts"][-1].update(fields)
    paths.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
