"""Run the collection's playbooks through ansible-runner, show where every node stands, and say how it ended.

One invocation is one ansible-playbook run (`ansible_runner.run`), its private data dir the run folder's
runner/ (artifacts/<ident>/ keeps its command, output and events). The playbook does the work and writes the
run folder exactly as `ansible-playbook validate.yml` does; the runner adds the live view, the record of its
invocations (runner/runner.json) and the exit code (how it is told: runner/ending.py):

    0  every node accepted            1  some node not accepted (report.json's verdicts)
    2  could not run: bad input, a playbook error before any node, ansible-runner failing
    130  interrupted (SIGINT or SIGTERM): ansible-playbook was stopped through ansible-runner's cancel
         callback; every node that finished has its document, the run's node locks are given back (release.yml;
         the nodes it could not reach are named), and `gpufleet fleet resume RUN_ID` goes on
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from gpufleet.base import paths, runs, schema
from gpufleet.base.errors import InputError
from gpufleet.runner import record as rec
from gpufleet.runner.ending import ending_line, ending_text, judge_report, kept_note, not_accepted_why, report_finals
from gpufleet.runner.events import Failure, FleetState
from gpufleet.runner.invocation import (
    ACCEPTED,
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    NOT_ACCEPTED,
    Invocation,
    Outcome,
)
from gpufleet.runner.private import (
    ansible_local_tmp,
    playbook_command,
    recorded_vars,
    redact_command,
    write_private_vars,
)
from gpufleet.runner.project import Project, tool_env

# ansible-runner reads these from env/settings only (it drops settings passed as an argument when the file is
# absent): check the cancel flag every second, and keep ansible's own output out of ours.
RUNNER_SETTINGS = {"pexpect_timeout": 1, "suppress_ansible_output": True}


def prepare_run_dir(run_dir: Path, *, resume: bool) -> None:
    """Check the run id and its folder before anything runs; create runner/ for ansible-runner."""
    paths.own_folder(run_dir.parent, run_dir.name, "--run-id")
    used = (run_dir / "run.json").exists() or (run_dir / "hosts").exists()
    if used and not resume:
        raise InputError(
            f"run id {run_dir.name!r} is already used by the run in {run_dir}: a run id names one run; "
            f"choose another --run-id (or leave it out), or go on with `gpufleet fleet resume {run_dir.name}`"
        )
    holder = rec.read_record(run_dir) if (rec.runner_dir(run_dir) / rec.RECORD).exists() else None
    for inv in (holder or {}).get("invocations", []):
        if not inv.get("ended") and runs.controller_alive(inv.get("controller") or {}):
            raise InputError(
                f"run {run_dir.name} is running now (gpufleet pid {inv['controller'].get('pid')}); wait "
                "for it or stop it with Ctrl-C before starting another invocation of it"
            )
    left = rec.running_playbooks(run_dir)
    if left:
        raise InputError(
            f"run {run_dir.name}: processes of an earlier invocation are still running (pids "
            f"{', '.join(map(str, left))}), left by a controller that was killed; stop them "
            f"(kill {' '.join(map(str, left))}) or wait for them, then run this again"
        )
    paths.make_dir(rec.runner_dir(run_dir) / "env")
    paths.make_dir(rec.runner_dir(run_dir) / "artifacts")
    settings = rec.runner_dir(run_dir) / "env" / "settings"
    paths.write_atomic(settings, json.dumps(RUNNER_SETTINGS) + "\n")


def stop_leftovers(run_dir: Path, grace_s: float = 5.0) -> list[int]:
    """End the ansible-playbook workers a cancelled run leaves: ansible-runner kills ansible-playbook's process
    group, but each worker runs in a session of its own and would finish its task (a benchmark, say) first."""
    pids = rec.running_playbooks(run_dir)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            pids = rec.running_playbooks(run_dir)
            if not pids:
                return []
            time.sleep(0.2)
    return pids


class _Stop:
    """SIGINT and SIGTERM set a flag that ansible-runner's cancel callback returns; the handlers go afterwards."""

    def __init__(self):
        self.signum: int | None = None
        self.saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

    def cancel(self) -> bool:
        return self.signum is not None


def invoke(
    project: Project, inv: Invocation, view, *, envvars: dict | None = None, judge=None, describe=None
) -> Outcome:
    """Run one playbook through ansible-runner with the live view; record it; say how it ended.

    `judge(inv, started, status, rc, fleet) -> (exit code, {host: final verdict}, message)` reads what the
    playbook left (default: the verdicts of report.json); it is not asked when the run was interrupted.
    """
    try:
        import ansible_runner  # the controller extra; only needed here
    except ImportError:
        raise InputError(
            "ansible-runner is not installed beside this Python: install the controller extra "
            "(pip install 'gpufleet[controller]')"
        ) from None

    run_dir = inv.run_dir
    made_run_dir, made_runner = not run_dir.exists(), not rec.runner_dir(run_dir).exists()
    try:
        prepare_run_dir(run_dir, resume=inv.resume)
    except InputError:  # refused (a full disk, say): nothing of this invocation is left behind
        left = run_dir if made_run_dir else rec.runner_dir(run_dir) if made_runner else None
        if left is not None and not os.path.islink(run_dir):  # never through a link (a planted one was refused)
            shutil.rmtree(left, ignore_errors=True)
        raise
    record = rec.read_record(run_dir) or {
        "schema_version": rec.RECORD_SCHEMA_VERSION,
        "run_id": inv.run_id,
        "reports_dir": str(inv.reports_dir),
        "invocations": [],
    }
    record.update(project=str(project.root) if project.root else None, inventory=inv.inventory)
    n = len(record["invocations"]) + 1
    ident = f"{n:03d}-{inv.command}"
    started = time.time()
    entry = {
        "n": n,
        "ident": ident,
        "command": inv.command,
        "playbook": inv.playbook,
        "started": schema.utc_now(),
        "started_epoch": started,
        "ended": None,
        "status": "running",
        "rc": None,
        "exit": None,
        "interrupted": False,
        "limit": inv.limit,
        "stages": inv.stages,
        "peers": inv.peers,
        "hosts": inv.hosts,
        "last_stage": {},
        "controller": runs.controller_identity(os.getpid()),
    }
    entry["extravars"], entry["extravars_withheld"] = recorded_vars(inv.user_vars)
    record["invocations"].append(entry)
    rec.write_record(run_dir, record)

    fleet = FleetState(inv.hosts, inv.peers)
    fleet.describe = describe
    view.start(fleet)
    limit = ",".join(inv.limit) if inv.limit else None
    stages = f", stages {', '.join(inv.stages)}" if inv.stages else ""
    peers = f", peers {', '.join(inv.peers)}" if inv.peers else ""
    view.message(
        f"run {inv.run_id}: {inv.command} ({inv.playbook}.yml, {project.describe()}) on "
        f"{len(inv.hosts)} node(s): {', '.join(inv.hosts)}{stages}{peers}"
    )

    def on_event(event: dict) -> bool:
        if event.get("event") == "playbook_on_start":  # the playbook has read its extra variables: none kept on disk
            shutil.rmtree(vars_file.parent, ignore_errors=True)
        try:
            changed = fleet.apply(event) + fleet.tick()
        except Exception as exc:  # the view must never stop the run
            changed = []
            fleet.failures.append(Failure("", "the live view", repr(exc), node_play=False))
        if changed:
            view.update(changed)
        return True  # keep every event in the artifacts

    # The mark lets a later invocation find an ansible-playbook its killed controller left running. Ansible's own
    # temporary folder (ansible-local-*) goes into one of ours, removed when the run ends however it ends: a
    # cancelled ansible-playbook has no time to remove its own.
    local_tmp = ansible_local_tmp()
    env = {
        "PATH": tool_env()["PATH"],
        "GPUFLEET_RUNNER_RUN_DIR": str(run_dir),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_LOCAL_TEMP": str(local_tmp),
        **(envvars or {}),
    }
    status, rc, error = "error", None, ""
    artifact_dir = rec.runner_dir(run_dir) / "artifacts" / ident
    own_env = set(env) - set(envvars or {})

    def on_status(data: dict, runner_config=None) -> None:
        if data.get("status") == "running":  # ansible-playbook started: its command artifact is written
            redact_command(artifact_dir, own_env)

    def cancel() -> bool:
        # ansible-runner asks about once a second (pexpect_timeout): also the moment to show started tasks.
        changed = fleet.tick()
        if changed:
            view.update(changed)
        return stop.cancel()

    vars_file = write_private_vars(inv.extravars())
    with _Stop() as stop:
        try:
            runner = ansible_runner.run(
                private_data_dir=str(rec.runner_dir(run_dir)),
                project_dir=str(project.cwd),
                **playbook_command(project.playbook(inv.playbook), vars_file),
                inventory=inv.inventory,
                limit=limit,
                extravars=str(vars_file),
                envvars=env,
                ident=ident,
                event_handler=on_event,
                status_handler=on_status,
                cancel_callback=cancel,
                quiet=True,
                suppress_env_files=True,
                rotate_artifacts=0,
            )
            status, rc = runner.status, runner.rc
        except InputError:
            raise
        except Exception as exc:  # ansible-runner itself failed: nothing ran, or not to the end
            error = could_not_run(inv, exc)
        finally:
            shutil.rmtree(vars_file.parent, ignore_errors=True)
            redact_command(artifact_dir, own_env)
        interrupted = stop.signum is not None
    # ansible-playbook ended by a signal (killed alone): what gives the node locks back at its end never ran
    killed = not (interrupted or error) and rc is None and (run_dir / runs.RUN_FILE).exists()
    if interrupted or error or killed:  # ansible-playbook may go on without the runner that reads it: stopped
        stop_leftovers(run_dir)
    if interrupted or killed:
        kept = release_locks(project, inv, env, own_env, ident)
    shutil.rmtree(local_tmp, ignore_errors=True)
    last_stage = {h: n.stage for h, n in fleet.nodes.items()}
    report, finals = None, {}
    if interrupted:
        code = EXIT_INTERRUPTED
        report, finals = report_finals(run_dir, inv.hosts, started)
        finals = {h: "interrupted" for h in inv.hosts} | {
            h: f for h, f in finals.items() if f in (ACCEPTED, NOT_ACCEPTED)
        }
        message = ending_line(inv, code, status, rc, fleet, report) + kept_note(kept, inv)
    elif error:  # the nodes that wrote their document were measured: they keep it, and only the report is missing
        measured = {h for h in inv.hosts if _written_since(run_dir / "hosts" / f"{h}.json", started)}
        code, message = EXIT_COULD_NOT_RUN, error
        finals = {h: "no report" if h in measured else "could not run" for h in inv.hosts}
    else:
        code, finals, message = (judge or judge_report)(inv, started, status, rc, fleet)
        report, _ = report_finals(run_dir, inv.hosts, started)
        if killed:
            message += kept_note(kept, inv, killed=True)

    entry.update(
        ended=schema.utc_now(),
        status="interrupted" if interrupted else status,
        rc=rc,
        exit=code,
        interrupted=interrupted,
        last_stage=last_stage,
    )
    if made_run_dir and not (run_dir / runs.RUN_FILE).exists():
        # The playbook stopped before it started the run (input refused, interrupted at once): no run folder is
        # left holding only ansible-runner's files, and the run id stays free.
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        try:
            record = rec.read_record(run_dir) or record
            record["invocations"] = [entry if i.get("n") == n else i for i in record["invocations"]]
            rec.write_record(run_dir, record)
        except InputError as exc:  # a full disk, say: the run's ending stands, said with it
            message += f"; its end is not recorded in runner.json: {exc}"
    fleet.finish({p: "peer" for p in inv.peers} | finals)
    view.update(list(fleet.nodes))
    why = not_accepted_why(report, finals)
    view.message(ending_text(why, message))
    view.stop()
    return Outcome(code, status, rc, interrupted, finals, report, fleet.failures, message, why)


def could_not_run(inv: Invocation, exc: Exception) -> str:
    """Why ansible-runner failed, in words; a full disk under the run folder (ansible-runner writes its events there)
    named with what to do once there is room: the documents written stay, and the report adds the run to history."""
    full = paths.full_disk(inv.run_dir / runs.RUN_FILE)
    if not full:
        return f"ansible-runner failed: {type(exc).__name__}: {exc}"
    return (
        f"{full}: ansible-runner could not write the run's events there ({exc}); the run was stopped, the "
        f"documents of the nodes it measured are kept in {inv.run_dir / 'hosts'}: make room, then `gpufleet "
        f"report {inv.run_dir}` reports them and adds the run to the history (`gpufleet fleet resume "
        f"{inv.run_id}` measures what did not finish)"
    )


def _written_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since - 1
    except OSError:
        return False


def release_locks(project: Project, inv: Invocation, env: dict, own_env: set[str], ident: str) -> dict | str:
    """Give back the node locks of an interrupted run (release.yml on its nodes and peers): {node: why} for the
    nodes it could not reach, or what kept the release from running at all. Its extra variables and environment
    stay out of the run folder as the run's own do."""
    import ansible_runner

    release_ident = f"{ident}-release"
    vars_file = write_private_vars(inv.extravars())
    with _Stop():  # a second Ctrl-C does not cut the release short; the run is already stopped
        try:
            ansible_runner.run(
                private_data_dir=str(rec.runner_dir(inv.run_dir)),
                project_dir=str(project.cwd),
                **playbook_command(project.playbook("release"), vars_file),
                inventory=inv.inventory,
                limit=",".join(inv.hosts + inv.peers),
                extravars=str(vars_file),
                envvars=env,
                ident=release_ident,
                quiet=True,
                suppress_env_files=True,
                rotate_artifacts=0,
            )
        except Exception as exc:  # the locks stay; the next run on this controller takes them over at once
            return f"ansible-runner failed: {type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(vars_file.parent, ignore_errors=True)
            redact_command(rec.runner_dir(inv.run_dir) / "artifacts" / release_ident, own_env)
    try:
        last = runs.read_run(inv.run_dir)["attempts"][-1]
    except (InputError, IndexError):
        return {}
    return last.get("locks_not_given_back") or {}
