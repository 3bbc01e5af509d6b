"""A node gpufleet drained for a step of its ladder, measured again by a sweep job on that node (service/sweep.py).

Slurm starts no job on a drained node, whoever submits it, and a resumed node takes the next user's job. So for each
node drained by gpufleet whose ladder waits for a measurement (ladder.awaiting_measurement: a re-test, reset or
reboot taken, or a person's clear, and no run of the node since), the sweep:

    1. reserves the node for the sweep's user alone (`scontrol create reservation ... users=<user> flags=maint
       duration=infinite`) and waits until Slurm shows it RESERVED;
    2. resumes it: idle now, but only a job that asks for the reservation may start there, and only the sweep's
       user may ask;
    3. submits the sweep job with `--reservation` (sweep.job_request);
    4. once that job has ended (or never started), drains the node again with the reason it had, and only then
       deletes the reservation (close).

The node is never open to a user's job: drained until step 2, reserved from step 1 to step 4, drained after it.
A sweep stopped between its steps leaves the reservation, which has no end: the node stays reserved, and the next
sweep drains it again (with the reason its run recorded in sweep.json) and deletes the reservation (leftovers)
before it plans.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import time
from pathlib import Path

from gpufleet.base import paths, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet import service_log
from gpufleet.fleet.run_files import read_json
from gpufleet.service import ladder

PREFIX = "gpufleet-retest-"
WAIT_S = 120  # for Slurm to show the reservation on the node, then the resumed node responding
POLL_S = 1.0


def name(node: str) -> str:
    return f"{PREFIX}{node}"


def candidates(shown: dict, nodes: list[str], hosts: dict, store, reports_dir: Path, sweep_file: str) -> dict:
    """{Slurm node: why} of the nodes among `nodes` that gpufleet drained (idle, DRAIN alone, its own reason, not
    handed over for RMA) and whose ladder waits for a measurement no sweep is making (one that still runs, between
    its job and its judgement, takes the next step itself)."""
    out = {}
    for node in nodes:
        now = shown[node]
        if now["base"] != "IDLE" or now["flags"] != ["DRAIN"] or not slurm.is_own(now["reason"]):
            continue
        if slurm.is_rma(now["reason"]):
            continue  # with the vendor: nothing to measure until a person clears it
        host = hosts.get(node, node)
        step = ladder.awaiting_measurement(store.events(host, "ladder"), store.node_runs(host))
        if step and not _in_progress(Path(reports_dir), sweep_file, node, step.get("at") or ""):
            by = f" by {step['by']}" if step.get("by") else ""
            out[node] = f"{step['step']}{by} in run {step['run_id']} ({step.get('at')}), not measured since"
    return out


def _in_progress(reports_dir: Path, sweep_file: str, node: str, at: str) -> bool:
    """Whether a sweep that still runs opened a re-test of `node` since `at` (a sweep that stopped measured nothing
    anyone will judge)."""
    since = (service_log.epoch(at) or 0) - 1
    for path in reports_dir.glob(f"*/{sweep_file}"):
        if path.stat().st_mtime < since:
            continue
        record = read_json(path)
        for job in record.get("jobs") or [] if isinstance(record, dict) else []:
            retest = job.get("retest") if isinstance(job, dict) else None
            if job.get("node") == node and isinstance(retest, dict) and (retest.get("opened") or "") >= at:
                if _sweep_alive(retest):
                    return True
    return False


def _until(node: str, test) -> bool:
    """Whether Slurm shows `node` so (test(its state)) within WAIT_S, asked every POLL_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        now = slurm.show_nodes().get(node)
        if now is not None and test(now):
            return True
        time.sleep(POLL_S)
    return False


def open_for_job(node: str, reason_before: str) -> dict:
    """Steps 1 and 2: {"reservation", "user", "reason_before", "opened"}. InputError when Slurm does not show the
    node reserved in time: the reservation is deleted again and the node stays drained."""
    resv, user = name(node), pwd.getpwuid(os.getuid()).pw_name
    sweep = {"sweep_host": socket.gethostname(), "sweep_pid": os.getpid()}  # who closes it (leftovers)
    slurm.reserve(resv, node, user)
    if not _until(node, lambda n: "RESERVED" in n["flags"]):
        slurm.unreserve(resv)
        raise InputError(f"Slurm did not show {node} reserved ({resv}) within {WAIT_S} s: left drained, not re-tested")
    try:
        slurm.resume(node)
    except InputError:
        slurm.unreserve(resv)  # still drained: as it was
        raise
    _until(node, lambda n: "NOT_RESPONDING" not in n["flags"])  # else the job waits for it
    return {"reservation": resv, "user": user, "reason_before": reason_before, "opened": schema.utc_now(), **sweep}


def close(node: str, retest: dict) -> None:
    """Step 4, once: the node drained again with the reason it had, then its reservation deleted."""
    if retest.get("closed"):
        return
    slurm.drain(node, retest["reason_before"])
    if retest["reservation"] in slurm.reservations():
        slurm.unreserve(retest["reservation"])
    retest["closed"] = schema.utc_now()


def leftovers(reports_dir: Path, queued: list[dict], sweep_file: str) -> list[dict]:
    """Re-test reservations no sweep job is in (a sweep stopped between its steps): each node drained again with the
    reason its sweep recorded (else held for re-acceptance, the safe side), the reservation deleted, and that
    sweep's record marked closed. What was done, one entry per reservation."""
    in_use = {q["reservation"] for q in queued if q.get("reservation")}
    done = []
    for resv in sorted(r for r in slurm.reservations() if r.startswith(PREFIX) and r not in in_use):
        node = resv[len(PREFIX) :]
        path, record, retest = _recorded(Path(reports_dir), resv, sweep_file)
        if retest is not None and _sweep_alive(retest):
            continue  # its sweep is still there, between its job's end and closing it
        reason = (retest or {}).get("reason_before") or slurm.reason(
            f"{slurm.REACCEPT} re-test left unfinished ({resv}): accept it to resume", by="a later sweep"
        )
        slurm.drain(node, reason)
        slurm.unreserve(resv)
        if retest is not None:
            retest.update(closed=schema.utc_now(), note="closed by a later sweep: the one that opened it had stopped")
            paths.write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
        done.append({"reservation": resv, "node": node, "drained": reason, "run_id": (record or {}).get("run_id")})
    return done


def _sweep_alive(retest: dict) -> bool:
    """Whether the sweep that opened a re-test still runs: on this host, its process; on another, assumed so (the
    node stays reserved, never open, until that sweep or a person closes it)."""
    if retest.get("sweep_host") != socket.gethostname():
        return True
    try:
        cmdline = Path(f"/proc/{int(retest.get('sweep_pid') or 0)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return b"gpufleet" in cmdline


def _recorded(reports_dir: Path, resv: str, sweep_file: str) -> tuple[Path | None, dict | None, dict | None]:
    """(sweep.json, its record, the open re-test in it) of that reservation, the newest record first; Nones if none."""
    for path in sorted(reports_dir.glob(f"*/{sweep_file}"), key=lambda p: p.stat().st_mtime, reverse=True):
        record = read_json(path)
        for job in record.get("jobs") or [] if isinstance(record, dict) else []:
            retest = job.get("retest") if isinstance(job, dict) else None
            if isinstance(retest, dict) and retest.get("reservation") == resv and not retest.get("closed"):
                return path, record, retest
    return None, None, None
