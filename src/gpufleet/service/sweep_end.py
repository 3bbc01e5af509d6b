"""How each sweep job ended, told from what it wrote; Slurm's word on a job says whether it still runs, and how it
ended while slurmctld still remembers it.

    watch(run_dir, record)   each job followed until it left Slurm's queue (its end read back at once, while
                             slurmctld holds it) or passed its bound: its wait to start, its time limit and Slurm's
                             time to end it (sweep.end_grace_s); a job whose node stopped responding (Slurm's own
                             state DOWN, or NOT_RESPONDING for NODE_LOST_S) is given up and cancelled, its node named
                             down with Slurm's state and reason. slurmctld lost (down, restarting, munge down): asked
                             again with backoff until the bounds, then Unreachable: the run is left for --collect or
                             the next sweep (unfinished)
    collect(run_dir)         each job's ending (below), decided once and kept in sweep.json; a later --collect
                             decides the jobs left open
    finish(run_dir, ...)     collect, the report over the judged documents, `gpufleet slurm`'s action, the ladder,
                             the costs; the run marked finished

A job's ending (job["ending"]):

    judged      the node stage ran to its end (its document says `finished`): that document is the verdict, whatever
                Slurm remembers of the job (MinJobAge passed, no accounting); also a job that ran on its node and
                failed there (the stage hung to the time limit, crashed): an `error` `sweep.sweep_job` in its document
    scheduler   Slurm could not run it: slurmctld unreachable (srun: Unable to confirm allocation ...), node failure
                (NODE_FAIL, BOOT_FAIL), the time limit passed before the node stage started, Slurm held it past its
                bound, or Slurm forgot a job whose stage did not finish. The scheduler's, never the node's: no
                verdict, not drained, no ladder step; the next sweep measures the node again
    node_down   its node stopped responding or was set DOWN: named with Slurm's own state and reason; not drained by
                gpufleet (Slurm took it out); measured again once Slurm gives it to jobs
    no_verdict  preempted by real work, cancelled, past its deadline, not submitted, or the node held by another
                gpufleet run: nothing to judge (what it measured is kept in sweep/not-judged/)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpufleet import report
from gpufleet.base import paths, runs, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.certify import issue
from gpufleet.fleet import service_log, store as fleet_store
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet.document_writer import record as record_document
from gpufleet.fleet.run_files import read_json
from gpufleet.service import ladder, outputs, retest
from gpufleet.service.sweep import GROUP, JOB_NAME, POLL_S, SWEEP_FILE, keep

MAX_DELAY_S = 60.0  # the longest wait between two tries of an unreachable slurmctld
NODE_LOST_S = 60.0  # a job's node NOT_RESPONDING this long: the job is given up
# Slurm's states of a job that Slurm itself could not run, and of one that ended without a verdict by another's hand.
SCHEDULER_STATES = ("NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED")
NO_VERDICT = ("PREEMPTED", "CANCELLED", "DEADLINE", "REVOKED", "REQUEUED")
RUNNING = (
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
)
ENDINGS = ("judged", "scheduler", "node_down", "no_verdict")
RE_SWEPT = (
    "the scheduler's failure, not the node's: no verdict, not drained, no ladder step; the next sweep measures it again"
)


# ---------------------------------------------------------------- following the jobs


def watch(run_dir: Path, record: dict, say=None) -> None:
    """Follow the run's jobs until each has ended or been given up (module docstring); sweep.json kept after each
    poll. Unreachable when slurmctld stays unreachable past the bounds of the jobs still open."""
    delay, lost = POLL_S, None
    while True:
        open_jobs = [j for j in record["jobs"] if j.get("job_id") and "slurm_end" not in j]
        if not open_jobs:
            return
        try:
            queued = {q["job_id"]: q for q in slurm.queued(JOB_NAME)}
            shown = slurm.show_nodes()
            for job in open_jobs:
                _follow(job, queued.get(job["job_id"]), shown.get(job["node"]), say)
        except slurm.Unreachable as exc:
            if lost is None:
                lost = {"from": schema.utc_now(), "error": str(exc)}
                record.setdefault("controller_lost", []).append(lost)
                (say or _quiet)(f"  slurmctld did not answer ({exc}); asking again until {_latest(open_jobs)}")
            keep(run_dir, record)
            left_s = max(service_log.epoch(j["bound"]) or 0 for j in open_jobs) - time.time()
            if left_s < 0:
                raise slurm.Unreachable(
                    f"slurmctld did not answer since {lost['from']} ({lost['error']}), past the bound of every "
                    f"job still open ({_latest(open_jobs)}): nothing was drained; the jobs may still run"
                ) from None
            time.sleep(min(delay, left_s + 1))
            delay = min(delay * 2, MAX_DELAY_S)
            continue
        if lost is not None:
            lost["to"] = schema.utc_now()
            (say or _quiet)(f"  slurmctld answers again ({lost['to']})")
            lost, delay = None, POLL_S
        keep(run_dir, record)
        time.sleep(POLL_S)


def _quiet(_line: str) -> None:
    pass


def _latest(jobs: list[dict]) -> str:
    return max(j["bound"] for j in jobs)


def _follow(job: dict, queued: dict | None, node: dict | None, say) -> None:
    """One poll of one job: where it stands, its end read back once it left the queue, given up when its node is
    lost or it passed its bound."""
    now = time.time()
    lost = node is not None and (node["base"] == "DOWN" or "NOT_RESPONDING" in node["flags"])
    if lost:
        job.setdefault("node_down", {"since": schema.utc_now()}).update(
            state=node["state"], reason=slurm.bare_reason(node["reason"])
        )
    elif queued is not None:
        job.pop("node_down", None)  # it answers again
    if queued is None:
        end = slurm.job(job["job_id"]) or {"state": None}  # None: slurmctld forgot it already (MinJobAge)
        job["slurm_end"] = dict(end, left_queue=schema.utc_now())
        (say or _quiet)(f"  {job['node']}: job {job['job_id']} ended {end['state'] or 'and Slurm no longer holds it'}")
        return
    job["seen"] = {k: queued.get(k) for k in ("state", "start", "elapsed_s", "slurm_reason")}
    down_s = now - (service_log.epoch((job.get("node_down") or {}).get("since")) or now)
    why = (
        f"its node {job['node']} is {node['state']} in Slurm"
        if lost and (node["base"] == "DOWN" or down_s >= NODE_LOST_S)
        else f"still {queued['state']} past its bound ({job['bound']})"
        if now > (service_log.epoch(job["bound"]) or now)
        else None
    )
    if why:
        try:
            slurm.cancel(job["job_id"])
            job["cancelled_by_sweep"] = schema.utc_now()
        except slurm.Unreachable:
            raise
        except InputError as exc:
            why += f"; scancel: {exc}"
        job["slurm_end"] = dict(job["seen"], given_up=why)
        (say or _quiet)(f"  {job['node']}: job {job['job_id']} given up: {why}")


# ---------------------------------------------------------------- each job's ending


def ending(job: dict, doc, output: str) -> tuple[str, str]:
    """(ending, note) of one job (module docstring), from what it wrote (`doc`: its host document, `output`: its
    output file) and what Slurm said of its end (job["slurm_end"])."""
    end = job.get("slurm_end") or {}
    state = end.get("state") or slurm.ended_as(output)  # once slurmctld forgot the job, its output still says
    if job.get("error"):
        return "no_verdict", f"not submitted: {job['error']}"
    held = next(
        (r for r in (doc or {}).get("results") or [] if r.get("check") == "node_lock" and r.get("status") == "error"),
        None,
    )
    if held:
        return "no_verdict", f"{held['reason']}: no verdict for the node"
    finished = isinstance(doc, dict) and doc.get("finished")
    down = job.get("node_down")
    if down and not finished:
        return "node_down", (
            f"{job['node']} stopped responding: Slurm shows it {down['state']} ({down.get('reason') or 'no reason'}); "
            f"job {job['job_id']} ended {state or 'unseen'}: no verdict, not drained by gpufleet. Once its slurmd "
            f"answers, Slurm gives it back (ReturnToService) or `scontrol update nodename={job['node']} state=resume`"
            "; the next sweep measures it"
        )
    if state in NO_VERDICT and not job.get("cancelled_by_sweep"):
        return "no_verdict", {
            "PREEMPTED": "preempted by real work: no verdict for the node; the next sweep takes it again",
            "CANCELLED": "cancelled before it ended: no verdict for the node",
            "DEADLINE": "could not start before its deadline (the node was taken): no verdict",
        }.get(state, f"ended {state}: no verdict for the node")
    if finished:
        late = f" (Slurm: {state})" if state and state != "COMPLETED" else ""
        return "judged", f"its node stage finished {finished}{late}: judged from its document"
    said = slurm.unreachable_in(output)
    if end.get("given_up"):
        return "scheduler", f"given up: {end['given_up']}; {RE_SWEPT}"
    if state in SCHEDULER_STATES or (said and state != "COMPLETED"):
        why = said or f"{state}: {end.get('slurm_reason') or 'Slurm lost the node'}"
        return "scheduler", f"Slurm could not run job {job['job_id']} ({why}): {RE_SWEPT}"
    if state == "TIMEOUT" and slurm.STAGE_STARTED not in output:
        return "scheduler", f"its time limit passed before the node stage started (Slurm held the job): {RE_SWEPT}"
    if state is None:
        return "scheduler", (
            f"job {job['job_id']} ended, Slurm no longer holds it (MinJobAge, no accounting) and its node stage did "
            f"not finish: {RE_SWEPT}"
        )
    return "judged", f"ended {state} on its node before its stage finished: an error sweep.sweep_job"


def collect(run_dir: Path) -> dict:
    """Each job's ending, decided once (a later --collect decides those left open); the documents of jobs that left
    no verdict moved aside (sweep/not-judged); an `error` `sweep.sweep_job` for a job that failed on its node. The
    record, with "judged": the hosts the report covers."""
    run_dir = Path(run_dir)
    record = read_json(run_dir / SWEEP_FILE)
    if not isinstance(record, dict) or not isinstance(record.get("jobs"), list):
        raise InputError(
            f"{run_dir / SWEEP_FILE}: no sweep record; expected the run folder of `gpufleet slurm sweep --submit`"
        )
    queued = None
    for job in record["jobs"]:
        if job.get("ending"):
            continue
        doc_path = run_dir / "hosts" / f"{job['host']}.json"
        doc = read_json(doc_path)
        if job.get("job_id") and "slurm_end" not in job:  # not followed to its end: a sweep stopped, or Slurm was lost
            try:
                queued = {q["job_id"]: q for q in slurm.queued(JOB_NAME)} if queued is None else queued
                if job["job_id"] in queued:
                    raise InputError(
                        f"sweep job {job['job_id']} on {job['node']} is {queued[job['job_id']]['state']}: judge the "
                        "sweep once its jobs have ended (they end by their time limit at the latest)"
                    )
                job["slurm_end"] = slurm.job(job["job_id"]) or {"state": None}
            except slurm.Unreachable:
                if not (isinstance(doc, dict) and doc.get("finished")):
                    raise
                job["slurm_end"] = {"state": None, "note": "Slurm could not be asked; the document had finished"}
        if job.get("retest"):
            retest.close(job["node"], job["retest"])  # drained again before anything reads its verdict
            keep(run_dir, record)
        job["ending"], job["note"] = ending(job, doc, _output(run_dir, job["host"]))
        job["judged"] = job["ending"] == "judged"
        job.update(
            {k: v for k, v in (job.get("slurm_end") or {}).items() if k in ("state", "start", "end", "elapsed_s")}
        )
        job["state"] = job.get("state") or ("NOT_SUBMITTED" if job.get("error") else "UNKNOWN")
        _costs(run_dir, job, doc)
        if not job["judged"] and doc_path.exists():
            aside = paths.make_dir(run_dir / "sweep" / "not-judged") / doc_path.name
            os.replace(doc_path, aside)
            job["note"] += f"; what it measured is kept in sweep/not-judged/{doc_path.name}"
        elif job["judged"] and not (isinstance(doc, dict) and doc.get("finished")):
            _job_error(run_dir, job, doc)
        keep(run_dir, record)
    record["judged"] = [j["host"] for j in record["jobs"] if j.get("judged")]
    keep(run_dir, record)
    return record


def _output(run_dir: Path, host: str) -> str:
    """The job's output file (sweep/<host>.out) as text; empty when it wrote none."""
    return (paths.read_bytes(run_dir / "sweep" / f"{host}.out")[0] or b"").decode("utf-8", "replace")


def _costs(run_dir: Path, job: dict, doc) -> None:
    """The job's seconds and GPU-seconds: its GPUs from its document, else the node's latest in the store (a job
    stopped before it wrote one), else Slurm's Gres; its seconds from Slurm, else as squeue last showed them."""
    seen = job.get("seen") or {}
    job["elapsed_s"] = job.get("elapsed_s") if job.get("elapsed_s") is not None else seen.get("elapsed_s")
    gpus = _gpus(doc)
    if gpus is None:
        store_path = fleet_store.default_path(run_dir.resolve().parent)
        if store_path.exists():
            with fleet_store.Store(store_path) as store:
                known = [r for r in store.node_runs(job["host"]) if store.gpus(r["run_id"], job["host"])]
                gpus = len(store.gpus(known[-1]["run_id"], job["host"])) if known else None
    if gpus is None:
        try:
            gpus = (slurm.show_nodes().get(job["node"]) or {}).get("gpus")
        except InputError:
            gpus = None
    job["gpus"] = gpus
    job["gpu_seconds"] = float((job["elapsed_s"] or 0) * (gpus or 0))
    job["gpu_hours"] = round(job["gpu_seconds"] / 3600, 4)  # for people; sums are made of the seconds


def _gpus(doc) -> int | None:
    for r in (doc or {}).get("results") or [] if isinstance(doc, dict) else []:
        if r.get("check") == "gpu_count" and isinstance(r.get("value"), int):
            return r["value"]
    return None


def _job_error(run_dir: Path, job: dict, doc) -> None:
    """The job ran but did not end well (its time limit, a failure, its node lost): an `error` in its document."""
    tail = _output(run_dir, job["host"])[-2000:]
    what = "before writing its document" if not isinstance(doc, dict) else "after the document it kept"
    res = schema.result(
        "sweep_job",
        schema.ERROR,
        f"sweep job {job['job_id']} ended {job['state']} {what}",
        group=GROUP,
        detail={"job_id": job["job_id"], "state": job["state"], "output_tail": tail},
        remedy=f"read sweep/{job['host']}.out; the node stage hung or died: the ladder re-tests the node",
        started=schema.utc_now(),
        seconds=0.0,
    )
    new = {
        "schema_version": schema.SCHEMA_VERSION,
        "host": job["host"],
        "started": res["started"],
        "seconds": 0.0,
        "results": [res],
    }
    record_document(run_dir, job["host"], new, [GROUP])


# ---------------------------------------------------------------- the run judged


def judge(run_dir: Path, *, names: dict | None = None) -> dict | None:
    """The report over the jobs' documents (None when no job left a verdict); the run marked finished."""
    record = collect(run_dir)
    if not record["judged"]:
        return None
    summary = report.build(Path(run_dir), expected_hosts=record["judged"], slurm_names=names)
    runs.finish(Path(run_dir), summary["verdict"])
    return summary


def finish(run_dir: Path, opts: dict) -> dict:
    """The run judged and acted on (module docstring): {"run_dir", "report", "slurm", "ladder", "service", "ok",
    "lines"} (lines: what the console says). Unreachable when Slurm is lost on the way: the run is marked unfinished,
    nothing drained that was not already, and a later --collect or sweep finishes it."""
    run_dir = Path(run_dir)
    names = opts.get("names")
    try:
        summary = judge(run_dir, names=names)
        done = {"run_dir": str(run_dir), "report": summary, "slurm": None, "ladder": None}
        if summary is not None:
            if opts.get("action", "none") != "none":
                done["slurm"] = fleet_slurm.act(run_dir, opts["action"], opts["max_drain"], names=names)
            done["ladder"] = ladder.judge(
                run_dir, act=opts.get("act"), site_commands=opts.get("site"), max_actions=opts["max_drain"], names=names
            )
            if opts.get("signer") is not None:
                done["certificates"] = issue.certify(run_dir, opts["signer"])
    except slurm.Unreachable as exc:
        left_for_later(run_dir, str(exc))
        raise
    data = outputs.write(run_dir)
    record = read_json(run_dir / SWEEP_FILE)
    record.pop("unfinished", None)
    record["finished"] = schema.utc_now()
    keep(run_dir, record)
    ok = summary is None or summary["verdict"] != "fail"
    ok = ok and (done["slurm"] or {"ok": True})["ok"] and (done["ladder"] or {"ok": True})["ok"]
    lines = [
        f"sweep {run_dir.name}: " + (f"report verdict {summary['verdict']}" if summary else "no job left a verdict")
    ]
    lines += [
        f"  {host} not accepted: {'; '.join(node['causes'])}"
        for host, node in (summary or {}).get("nodes", {}).items()
        if node["verdict"] == "fail"
    ]
    lines += [f"  {j['node']}: {j['note']}" for j in record["jobs"] if j.get("ending") in ("scheduler", "node_down")]
    lost = record.get("controller_lost") or []
    lines += [f"  slurmctld did not answer from {x['from']} to {x.get('to', 'the end')}: {x['error']}" for x in lost]
    if done["slurm"]:
        lines += fleet_slurm.summary_lines(done["slurm"])
    if done.get("certificates"):
        lines.append(issue.summary_text(done["certificates"]))
    return dict(done, service=outputs.json_section(data), ok=ok, lines=lines + [""] + outputs.md_section(data))


def left_for_later(run_dir: Path, why: str) -> None:
    """Mark the run unfinished in its sweep.json, with why: a later --collect, or the next sweep, finishes it."""
    record = read_json(Path(run_dir) / SWEEP_FILE)
    if isinstance(record, dict):
        record["unfinished"] = {"at": schema.utc_now(), "why": why}
        keep(Path(run_dir), record)


def unfinished(reports_dir: Path) -> list[Path]:
    """The run folders of sweeps left unfinished (left_for_later), oldest first: the next sweep finishes them."""
    found = []
    for path in Path(reports_dir).glob(f"*/{SWEEP_FILE}"):
        record = read_json(path)
        if isinstance(record, dict) and record.get("unfinished") and not record.get("finished"):
            found.append((record["unfinished"].get("at") or "", path.parent))
    return [p for _, p in sorted(found)]
