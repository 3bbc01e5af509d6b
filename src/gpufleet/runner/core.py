"""Run the collection's playbooks through ansible-runner, show where every node stands, and say how it ended.

One invocation is one ansible-playbook run (`ansible_runner.run`), its private data dir the run folder's
runner/ (artifacts/<ident>/ keeps its command, output and events). The playbook does the work and writes the
run folder exactly as `ansible-playbook validate.yml` does; the runner adds the live view, the record of its
invocations (runner/runner.json) and the exit code:

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
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import paths, runs, schema
from gpufleet.errors import InputError
from gpufleet.report.formatting import check_id, ordered_results
from gpufleet.runner import record as rec
from gpufleet.runner.events import Failure, FleetState
from gpufleet.runner.private import ansible_local_tmp, recorded_vars, redact_command, write_private_vars
from gpufleet.runner.project import Project, tool_env

EXIT_ACCEPTED, EXIT_NOT_ACCEPTED, EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 130
# Variables the runner sets itself; the operator gives them through its options.
RESERVED_VARS = {
    "gpufleet_run_id": "--run-id",
    "gpufleet_reports_dir": "--reports-dir",
    "gpufleet_resume": "gpufleet fleet resume",
    "gpufleet_stages": "gpufleet fleet resume (it picks the stages)",
    "gpufleet_peers": "gpufleet fleet accept --peers",
    "gpufleet_tier": "--tier",
    "gpufleet_soak_duration_s": "--soak-duration-s",
}
# ansible-runner reads these from env/settings only (it drops settings passed as an argument when the file is
# absent): check the cancel flag every second, and keep ansible's own output out of ours.
RUNNER_SETTINGS = {"pexpect_timeout": 1, "suppress_ansible_output": True}
ACCEPTED, NOT_ACCEPTED = "accepted", "not accepted"
WHY_REASON_CHARS, WHY_MORE_CHECKS = 160, 5  # the end of a run: the first reason cut here, this many more checks named


@dataclass
class Invocation:
    """One playbook run of a run: what it runs and on which nodes."""

    command: str  # run, accept, resume, locate
    playbook: str  # validate, locate
    run_id: str
    reports_dir: Path
    inventory: str
    hosts: list[str]  # the nodes it covers (the limit), in inventory order
    limit: list[str] | None = None
    peers: list[str] = field(default_factory=list)
    stages: list[str] | None = None
    resume: bool = False
    user_vars: dict = field(default_factory=dict)  # -e and --tier: kept for a resume
    extra_vars: dict = field(default_factory=dict)  # playbook-specific (locate's options)

    @property
    def run_dir(self) -> Path:
        return self.reports_dir / self.run_id

    def extravars(self) -> dict:
        out = dict(self.user_vars)
        out.update(self.extra_vars)
        out["gpufleet_run_id"] = self.run_id
        out["gpufleet_reports_dir"] = str(self.reports_dir)
        if self.resume:
            out["gpufleet_resume"] = True
        if self.stages:
            out["gpufleet_stages"] = list(self.stages)
        if self.peers:
            out["gpufleet_peers"] = list(self.peers)
        return out


@dataclass
class Outcome:
    exit: int
    status: str  # ansible-runner's: successful, failed, canceled, ... or "error"
    rc: int | None
    interrupted: bool
    finals: dict  # host -> accepted / not accepted / why there is no verdict
    report: dict | None
    failures: list
    message: str = ""
    why: dict = field(default_factory=dict)  # host not accepted -> its failing checks, worst first (not_accepted_why)


def check_user_vars(user_vars: dict) -> None:
    for name, option in RESERVED_VARS.items():
        if name in user_vars:
            raise InputError(f"-e {name} is set by the runner; use {option} instead")


def prepare_run_dir(run_dir: Path, *, resume: bool) -> None:
    """Check the run id and its folder before anything runs; create runner/ for ansible-runner."""
    paths.safe_name(run_dir.name, "--run-id")
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


def report_finals(run_dir: Path, hosts: list[str], since: float) -> tuple[dict | None, dict]:
    """report.json when this invocation wrote it, and per node: accepted or not accepted."""
    path = run_dir / "report.json"
    doc, _ = rec.read_json(path)
    if doc is None or path.stat().st_mtime < since - 1:
        return None, {}
    nodes = doc.get("nodes") or {}
    finals = {}
    for host in hosts:
        verdict = (nodes.get(host) or {}).get("verdict")
        if verdict is None:
            finals[host] = "not in the report"
        else:
            finals[host] = ACCEPTED if verdict != schema.FAIL else NOT_ACCEPTED
    return doc, finals


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
    made_run_dir = not run_dir.exists()
    prepare_run_dir(run_dir, resume=inv.resume)
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
                playbook=project.playbook(inv.playbook),
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
            error = f"ansible-runner failed: {type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(vars_file.parent, ignore_errors=True)
            redact_command(artifact_dir, own_env)
        interrupted = stop.signum is not None
    if interrupted:
        stop_leftovers(run_dir)
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
        message = _ending(inv, code, status, rc, fleet, report) + _kept_note(kept)
    elif error:
        code, finals, message = EXIT_COULD_NOT_RUN, {h: "could not run" for h in inv.hosts}, error
    else:
        code, finals, message = (judge or judge_report)(inv, started, status, rc, fleet)
        report, _ = report_finals(run_dir, inv.hosts, started)
    fleet.finish({p: "peer" for p in inv.peers} | finals)
    view.update(list(fleet.nodes))
    why = not_accepted_why(report, finals)
    view.message(ending_text(why, message))
    view.stop()

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
        record = rec.read_record(run_dir) or record
        record["invocations"] = [entry if i.get("n") == n else i for i in record["invocations"]]
        rec.write_record(run_dir, record)
    return Outcome(code, status, rc, interrupted, finals, report, fleet.failures, message, why)


def not_accepted_why(report: dict | None, finals: dict) -> dict[str, list[dict]]:
    """For every node not accepted, its checks that failed or erred, worst first: [{check, status, reason}]."""
    nodes = (report or {}).get("nodes") or {}
    why = {}
    for host, final in finals.items():
        if final == NOT_ACCEPTED and host in nodes:
            bad, _ = ordered_results(nodes[host].get("results") or [])
            why[host] = [
                {"check": check_id(r), "status": r["status"], "reason": " ".join(str(r.get("reason") or "").split())}
                for r in bad
                if r["status"] in (schema.FAIL, schema.ERROR)
            ]
    return why


def ending_text(why: dict[str, list[dict]], message: str) -> str:
    """The last lines of a run: one per node not accepted (its worst cause with the reason, then the others), and
    the run's one-line ending last. A reason several checks give is said once, with how many checks gave it."""
    lines = []
    for host, bad in why.items():
        if not bad:
            lines.append(f"  {host}: not accepted, with no failing check in the report")
            continue
        groups = {}
        for b in bad:  # worst first already; the checks that give one reason together
            groups.setdefault(b["reason"] or f"\0{b['check']}", []).append(b)
        (first, *same), *rest = groups.values()
        reason = (
            first["reason"]
            if len(first["reason"]) <= WHY_REASON_CHARS
            else first["reason"][: WHY_REASON_CHARS - 3] + "..."
        )
        shared = f" and {len(same)} more check(s) with the same reason" if same else ""
        line = f"  {host}: {first['status']} {first['check']}{shared}: {reason or '(no reason given)'}"
        others = [
            f"{g[0]['check']} ({g[0]['status']}" + (f", {len(g)} checks with its reason)" if len(g) > 1 else ")")
            for g in rest[:WHY_MORE_CHECKS]
        ]
        if others:
            left = len(rest) - len(others)
            line += "; also " + ", ".join(others) + (f" and {left} more" if left else "")
        lines.append(line)
    return "\n".join([*lines, message])


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
                playbook=project.playbook("release"),
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


def _kept_note(kept: dict | str) -> str:
    if isinstance(kept, str):
        return f". Its node locks could not be given back ({kept}); the next run on this controller takes them over"
    if kept:
        return (
            f". Its node locks could not be given back on {', '.join(sorted(kept))} (did not answer); the next run "
            "on this controller takes them over"
        )
    return ""


def judge_report(inv: Invocation, started: float, status: str, rc, fleet: FleetState) -> tuple[int, dict, str]:
    """The exit code from the verdicts of the report this invocation wrote; none written, or no node answered:
    could not run."""
    report, finals = report_finals(inv.run_dir, inv.hosts, started)
    if report is None:
        return (
            EXIT_COULD_NOT_RUN,
            {h: "no report" for h in inv.hosts},
            _ending(inv, EXIT_COULD_NOT_RUN, status, rc, fleet, None),
        )
    silent = unreachable(report, inv.hosts)
    if inv.hosts and len(silent) == len(inv.hosts):
        named = "; ".join(f"{h}: {why}" for h, why in silent.items())
        return (
            EXIT_COULD_NOT_RUN,
            {h: "not reached" for h in inv.hosts},
            f"run {inv.run_id}: could not run: no node answered ({named[:600]}); report: {inv.run_dir / 'report.md'}",
        )
    fleet.finish(finals)
    code = EXIT_ACCEPTED if all(f == ACCEPTED for f in finals.values()) else EXIT_NOT_ACCEPTED
    return code, finals, _ending(inv, code, status, rc, fleet, report)


def unreachable(report: dict, hosts: list[str]) -> dict[str, str]:
    """The nodes of `hosts` the run could not reach (their `connection.reachable` error), with its reason."""
    out = {}
    for host in hosts:
        for r in ((report.get("nodes") or {}).get(host) or {}).get("results") or []:
            if r.get("group") == "connection" and r.get("check") == "reachable" and r.get("status") == schema.ERROR:
                out[host] = " ".join(str(r.get("reason") or "").split())[:WHY_REASON_CHARS]
                break
    return out


def fleet_started_epoch(inv: Invocation) -> float:
    """When the latest invocation of this run started (runner.json)."""
    doc = rec.read_record(inv.run_dir) or {}
    invocations = doc.get("invocations") or [{}]
    return float(invocations[-1].get("started_epoch") or 0)


def _ending(inv: Invocation, code: int, status: str, rc, fleet: FleetState, report: dict | None) -> str:
    run_dir = inv.run_dir
    if code == EXIT_INTERRUPTED:
        since = fleet_started_epoch(inv)
        written = [
            h
            for h in inv.hosts
            if (run_dir / "hosts" / f"{h}.json").exists() and (run_dir / "hosts" / f"{h}.json").stat().st_mtime >= since
        ]
        kept = (
            f"the documents of {', '.join(written)} are in {run_dir / 'hosts'}"
            if written
            else f"nothing finished ({run_dir})"
        )
        return (
            f"run {inv.run_id}: interrupted; {kept}. Go on with: gpufleet fleet resume {inv.run_id} "
            f"--reports-dir {inv.reports_dir}"
        )
    if code == EXIT_COULD_NOT_RUN:
        # The controller's own tasks first: a variable refused before any node, a report that could not be made.
        failed = sorted((f for f in fleet.failures if f.msg), key=lambda f: f.node_play)
        why = (
            "; ".join(f"{f.task}: {' '.join(f.msg.split())}" for f in failed[:3])
            or f"ansible-playbook ended {status} (rc {rc})"
        )
        if not (
            run_dir / runs.RUN_FILE
        ).exists():  # the run never started: its folder goes (invoke), nothing to point at
            return f"run {inv.run_id}: could not run: {why}"
        return f"run {inv.run_id}: could not run: {why}. ansible-runner's output: {rec.runner_dir(run_dir)}/artifacts"
    bad = [h for h in inv.hosts if fleet.nodes[h].final != ACCEPTED]
    files = (report or {}).get("files") or {}
    where = files.get("md") or str(run_dir / "report.md")
    if code == EXIT_ACCEPTED:
        return f"run {inv.run_id}: all {len(inv.hosts)} node(s) accepted; report: {where}"
    return f"run {inv.run_id}: {len(bad)} of {len(inv.hosts)} node(s) not accepted: {', '.join(bad)}; report: {where}"
