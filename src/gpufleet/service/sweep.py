"""`gpufleet slurm sweep --tier smoke|acceptance`: a tier's node stage on idle nodes, as Slurm jobs that real work
preempts, judged as a run.

    where       idle nodes of the chosen partitions only (base state IDLE, no flag: not drained, down, reserved,
                completing or powered down); one job a node, --exclusive, --nodelist that node: never beside a job;
                and the nodes gpufleet drained whose ladder waits for a measurement, each in a reservation of its
                own that no user's job can enter (retest.py)
    priority    --nice (default 10000) and the site's --qos; submitted to a partition (or QOS) that real work
                preempts (docs/fleet-in-service.md); --no-requeue, so a preempted job is cancelled, never requeued:
                it leaves no verdict for its node, only a note, and the next sweep takes the node again
    time        --time (the tier's limit) and --deadline: a job that cannot start in time is removed by Slurm;
                at most --max-share of the idle nodes (default 25%, at least one node) held at once, the sweep
                jobs already queued counted, the nodes whose certificates expire soonest first (sweep_order), then
                those measured longest ago
    on the node `srun ... gpufleet node-stage`: the engine in the job, its document written to the run's hosts/ in
                the shared reports folder; nothing over SSH
    the run     RUN_DIR/run.json (playbook sweep), sweep.json (the plan, each job and what became of it), the
                report over the documents of the jobs that ran to their end (or failed: an `error` `sweep.sweep_job`),
                judged against the baseline, the fleet and each node's history as usual; then `gpufleet slurm`'s
                action with its breaker, the ladder, and the costs (outputs.py)

Without --submit the sweep is a plan: which nodes, which are skipped and why, the sbatch line of each; nothing is
submitted.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import time
from pathlib import Path

from gpufleet.base import certificates, paths, profiles, registry, runs, schema, slurm
from gpufleet import report
from gpufleet.base.errors import InputError
from gpufleet.fleet import references, store as fleet_store
from gpufleet.fleet.document_writer import record as record_document
from gpufleet.fleet.run_files import read_json
from gpufleet.service import retest

# The run tiers a node stage in a job runs, and each job's time limit in minutes (registry.RunTier.sweep_minutes;
# the soak lasts hours: no sweep). The node stage took 35.3 s (smoke) and 44.4 s (acceptance) on one H100
# (docs/results/2026-11-23-h100-x1-fleet); the limit leaves room for a slow start, a node with eight GPUs and a
# measurement taken again.
TIME_LIMIT_MIN = {t.name: t.sweep_minutes for t in registry.RUN_TIERS if t.sweep_minutes}
TIERS = tuple(TIME_LIMIT_MIN)
JOB_NAME = "gpufleet-sweep"
SWEEP_FILE = "sweep.json"
GROUP = "sweep"
DEFAULT_SHARE = "25%"
DEFAULT_NICE = 10000
DEFAULT_WAIT_MIN = 10
POLL_S = 5.0
# Jobs whose node gets no verdict: preempted by real work, cancelled, or never started before their deadline.
NO_VERDICT = ("PREEMPTED", "CANCELLED", "DEADLINE", "REVOKED", "REQUEUED")
RUNNING = (
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "SIGNALING",
    "STAGE_OUT",
)
# What the controller passes into the job: never its whole environment (tokens, passwords).
# The site's profiles and checks turned off reach the engine as they do from the playbooks (profiles.SITE_DIR_ENV,
# engine.CHECKS_DISABLED_ENV).
EXPORTED = (
    "PATH",
    "LANG",
    "SLURM_CONF",
    "PYTHONPATH",
    "GPUFLEET_PROFILE_DIR",
    profiles.SITE_DIR_ENV,
    "GPUFLEET_CHECKS_DISABLED",
    "GPUFLEET_SCRATCH_DIR",
)
_SHARE = re.compile(r"(\d+)(%?)")


def parse_share(value) -> tuple[int, bool]:
    parts = _SHARE.fullmatch(str(value).strip())
    if not parts or int(parts.group(1)) < 1 or (parts.group(2) and int(parts.group(1)) > 100):
        raise InputError(
            f"gpufleet_sweep_max_share (--max-share) is {value!r}; expected a count of nodes (e.g. 4) or a "
            "percent of the idle nodes from 1% to 100% (e.g. 25%)"
        )
    return int(parts.group(1)), bool(parts.group(2))


def idle_or_why(node: dict) -> str | None:
    """None when Slurm may give the node to a job now and none runs there; else why it is skipped."""
    if node["base"] == "IDLE" and not node["flags"]:
        return None
    if node["base"] in ("ALLOCATED", "MIXED"):
        return f"running a job ({node['state']})"
    reason = f": {node['reason']}" if node.get("reason") else ""
    return f"not idle: {node['state']}{reason}"


def preemption_problem(config: dict, parts: dict, submit_to: list[str], qos: str | None) -> str | None:
    """Why sweep jobs could not be preempted by real work here, or None. preempt/partition_prio: the partition the
    jobs go to must have a lower PriorityTier than another partition over its nodes; preempt/qos: a QOS is named."""
    kind = config.get("PreemptType", "preempt/none")
    if kind in ("preempt/none", "(null)", ""):
        return (
            "PreemptType is preempt/none in slurm.conf: real work could not preempt a sweep job. Set "
            "PreemptType=preempt/partition_prio (a sweep partition of lower PriorityTier) or preempt/qos, with "
            "PreemptMode=CANCEL or REQUEUE (docs/fleet-in-service.md)"
        )
    if kind == "preempt/qos" and not qos:
        return "PreemptType is preempt/qos: name the QOS that real work preempts with --qos (gpufleet_sweep_qos)"
    if kind == "preempt/partition_prio":
        top = max((p["priority_tier"] for p in parts.values()), default=1)
        low = [name for name in submit_to if parts.get(name, {}).get("priority_tier", top) >= top]
        if low:
            return (
                f"PreemptType is preempt/partition_prio, but partition {low[0]} has the highest PriorityTier "
                f"({top}): submit sweeps to a partition below the one real work runs in (--sweep-partition)"
            )
    return None


def sweep_order(last_tested: dict, valid_until: dict | None = None, hosts: dict | None = None):
    """The key a sweep takes idle nodes in by: the node whose certificate expires soonest first, one without a
    certificate before any (base/certificates.py's claims, {host: valid_until}), then the node measured longest ago."""

    def key(node: str) -> tuple:
        host = (hosts or {}).get(node, node)
        return ((valid_until or {}).get(host) or "", last_tested.get(host) or "", node)

    return key


def plan(
    shown: dict,
    partitions: list[str],
    queued: list[dict],
    share: tuple[int, bool],
    last_tested: dict,
    hosts: dict | None = None,
    awaiting: dict | None = None,
    valid_until: dict | None = None,
) -> dict:
    """Which nodes this sweep takes: {"idle", "skipped": {node: why}, "chosen", "deferred": {node: why}, "allowed",
    "held", "retest": {node: why}}. `queued`: sweep jobs slurmctld holds now (any sweep); `last_tested`: {node: when
    its latest document was made}; `hosts`: {Slurm node: inventory name}; `awaiting`: {node: why} of the drained nodes
    whose ladder waits for a measurement (retest.candidates): measured as well, in a reservation, outside the share
    (they are out of service already)."""
    awaiting = {n: why for n, why in (awaiting or {}).items() if n in shown}
    queued_share = [q for q in queued if not str(q.get("reservation") or "").startswith(retest.PREFIX)]
    member = {n: v for n, v in shown.items() if set(v["partitions"]) & set(partitions)}
    unknown = [p for p in partitions if not any(p in v["partitions"] for v in shown.values())]
    if unknown:
        raise InputError(
            f"partition {unknown[0]} holds no node Slurm lists (scontrol show node); expected the partitions "
            "of the nodes to sweep (gpufleet_sweep_partitions, --partition)"
        )
    held = {q["node"]: q for q in queued if q.get("node")}
    skipped, idle = {}, []
    for name, node in sorted(member.items()):
        if name in awaiting and name not in held:
            continue
        if name in held:
            skipped[name] = f"a sweep job ({held[name]['job_id']}, {held[name]['state']}) is already there"
            continue
        why = idle_or_why(node)
        if why:
            skipped[name] = why
        else:
            idle.append(name)
    number, percent = share
    pool = len(idle) + len([q for q in queued_share if q.get("node") in member])
    allowed = max(1, math.floor(pool * number / 100)) if percent else number
    free = max(0, allowed - len(queued_share))
    order = sorted(idle, key=sweep_order(last_tested, valid_until, hosts))
    chosen = order[:free]
    deferred = {
        n: f"over the share: {allowed} of {pool} idle node(s) at once, {len(queued_share)} sweep job(s) already queued"
        for n in order[free:]
    }
    return {
        "partitions": partitions,
        "idle": idle,
        "skipped": skipped,
        "chosen": chosen,
        "deferred": deferred,
        "allowed": allowed,
        "held": len(queued_share),
        "share": f"{number}{'%' * percent}",
        "retest": {n: why for n, why in sorted(awaiting.items()) if n in member and n not in held},
    }


def job_request(
    run_dir: Path, run_id: str, node: str, host: str, opts: dict, reservation: str | None = None
) -> tuple[list[str], str]:
    """(sbatch options, batch script) of one node's job; in `reservation` for a re-test of a drained node."""
    limit_min = opts["time_limit_min"]
    argv = [
        opts["python"],
        "-m",
        "gpufleet",
        "node-stage",
        "--tier",
        opts["tier"],
        "--run-dir",
        str(run_dir),
        "--run-id",
        run_id,
        "--host",
        host,
        "--lock-path",
        opts["lock_path"],
        "--lock-ttl-s",
        str(limit_min * 60 + 120),
    ]
    for key, flag in (("thresholds", "--thresholds"), ("profile", "--profile"), ("depth", "--depth")):
        if opts.get(key):
            argv += [flag, opts[key]]
    if opts.get("benchmarks") is not None:
        argv += ["--benchmarks", *opts["benchmarks"]]
    argv += [a.replace("{node}", node).replace("{host}", host) for a in opts.get("node_args") or []]
    script = (
        f"#!/bin/sh\n# gpufleet slurm sweep: run {run_id}, tier {opts['tier']}, node {node} (docs/fleet-in-service.md)\n"
        f"exec srun --nodes=1 --ntasks=1 {shlex.join(argv)}\n"
    )
    exported = [k for k in EXPORTED if k in os.environ]
    options = [
        f"--job-name={JOB_NAME}",
        f"--comment={run_id}",
        # A re-test goes to the node's own partition: a user's job waiting in a partition of a higher PriorityTier
        # holds the node against every job of a lower one, the reservation's too; in the reservation no user's job
        # can preempt it anyway.
        f"--partition={opts['node_partition'][node] if reservation else opts['submit_partition'] or opts['node_partition'][node]}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",
        f"--time={limit_min}",
        f"--nice={opts['nice']}",
        "--no-requeue",
        f"--deadline=now+{(opts['wait_min'] + limit_min) * 60}",
        f"--output={run_dir / 'sweep' / (host + '.out')}",
        f"--chdir={run_dir / 'sweep'}",
        f"--export={','.join(exported) or 'NONE'}",
    ]
    if opts.get("qos"):
        options.append(f"--qos={opts['qos']}")
    if reservation:
        options.append(f"--reservation={reservation}")
    return options, script


def submit(reports_dir: Path, opts: dict) -> dict:
    """Plan under the reports folder's lock (two sweeps at once see each other's jobs) and, with opts["submit"],
    start the run and submit its jobs. The sweep record (also RUN_DIR/sweep.json when submitted)."""
    names = opts.get("names") or {}
    hosts = {v: k for k, v in names.items()}
    config, parts = slurm.config(), slurm.partitions()
    submit_to = [opts["submit_partition"]] if opts["submit_partition"] else opts["partitions"]
    why = preemption_problem(config, parts, submit_to, opts.get("qos"))
    if why:
        raise InputError(why)
    reports_dir = Path(reports_dir).resolve()
    if opts.get("submit"):
        paths.make_dir(reports_dir)
    with paths.folder_lock(reports_dir) if reports_dir.is_dir() else contextlib.nullcontext():  # a plan makes nothing
        queued = slurm.queued(JOB_NAME)
        cleaned = retest.leftovers(reports_dir, queued, SWEEP_FILE) if opts.get("submit") else []
        shown = slurm.show_nodes()
        last, awaiting = {}, {}
        store_path = fleet_store.default_path(reports_dir)
        if store_path.exists():
            with fleet_store.Store(store_path) as store:
                last = {h: (store.node_runs(h) or [{}])[-1].get("started") for h in (hosts.get(n, n) for n in shown)}
                member = [n for n, v in shown.items() if set(v["partitions"]) & set(opts["partitions"])]
                awaiting = retest.candidates(shown, member, hosts, store, reports_dir, SWEEP_FILE)
        expiring = {h: c.get("valid_until") for h, c in certificates.latest(reports_dir).items()}
        planned = plan(
            shown, opts["partitions"], queued, parse_share(opts["max_share"]), last, hosts, awaiting, expiring
        )
        record = {
            "tier": opts["tier"],
            "submitted": None,
            "plan": planned,
            "left_over": cleaned,
            "jobs": [],
            "settings": {
                k: opts.get(k) for k in ("time_limit_min", "wait_min", "nice", "qos", "submit_partition", "max_share")
            },
        }
        taken = [*planned["chosen"], *planned["retest"]]
        opts["node_partition"] = {n: next(p for p in shown[n]["partitions"] if p in opts["partitions"]) for n in taken}
        if not opts.get("submit") or not taken:
            record["requests"] = {
                n: job_request(
                    Path("RUN_DIR"),
                    "RUN_ID",
                    n,
                    hosts.get(n, n),
                    opts,
                    retest.name(n) if n in planned["retest"] else None,
                )
                for n in taken
            }
            return record
        run = runs.start(str(reports_dir), opts.get("run_id"), playbook="sweep", hosts=[], tier=opts["tier"])
        run_dir = Path(run["run_dir"])
        paths.make_dir(run_dir / "sweep")
        # What each node's figures are held against, read by its job (node_stage): measured again there if past.
        # The store as it is (this folder's lock is held: no repair here; the report repairs it).
        with fleet_store.Store(store_path) if store_path.exists() else contextlib.nullcontext() as store:
            chosen = [hosts.get(n, n) for n in taken]
            base = references.choose_baseline(run_dir, store, None)
            references.write(run_dir, chosen, store, None if store else f"no store yet at {store_path}", base)
        record.update(run_id=run["run_id"], run_dir=str(run_dir), submitted=schema.utc_now())
        for node in taken:
            host = hosts.get(node, node)
            job = {"node": node, "host": host}
            record["jobs"].append(job)
            try:
                if node in planned["retest"]:
                    job["retest"] = retest.open_for_job(node, slurm.bare_reason(shown[node]["reason"]))
                    keep(run_dir, record)  # what to drain it with again, should this sweep stop before its end
                options, script = job_request(
                    run_dir, run["run_id"], node, host, opts, (job.get("retest") or {}).get("reservation")
                )
                job["sbatch"] = options
                job["job_id"] = slurm.submit(options, script)
            except InputError as exc:
                job["error"] = str(exc)
                if job.get("retest"):
                    retest.close(node, job["retest"])
        keep(run_dir, record)
    return record


def keep(run_dir: Path, record: dict) -> None:
    paths.write_atomic(Path(run_dir) / SWEEP_FILE, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")


def wait(record: dict, limit_s: float) -> None:
    """Until slurmctld holds none of the run's jobs, asked every POLL_S; those still there after limit_s are cancelled
    (named in the record) and given two minutes more to end."""
    ids = {j["job_id"] for j in record["jobs"] if j.get("job_id")}
    deadline, cancelled = time.monotonic() + limit_s, False
    while ids:
        left = {q["job_id"] for q in slurm.queued(JOB_NAME)} & ids
        if not left:
            return
        if time.monotonic() > deadline:
            if cancelled:
                return  # their ends are read back as Slurm has them
            for job_id in sorted(left):
                slurm.cancel(job_id)
            record["cancelled_by_sweep"], cancelled = sorted(left), True
            deadline = time.monotonic() + 120
        time.sleep(POLL_S)


def collect(run_dir: Path) -> dict:
    """Each job's end read back from Slurm; the documents of jobs that left no verdict moved aside (sweep/not-judged),
    an `error` `sweep.sweep_job` for a job that failed. The record, with "judged": the hosts the report covers."""
    record = read_json(Path(run_dir) / SWEEP_FILE)
    if not isinstance(record, dict) or not isinstance(record.get("jobs"), list):
        raise InputError(
            f"{Path(run_dir) / SWEEP_FILE}: no sweep record; expected the run folder of `gpufleet slurm sweep --submit`"
        )
    judged, shown = [], {}
    for job in record["jobs"]:
        doc_path = Path(run_dir) / "hosts" / f"{job['host']}.json"
        end = slurm.job(job["job_id"]) if job.get("job_id") else None
        if (end or {}).get("state") in RUNNING:
            raise InputError(
                f"sweep job {job['job_id']} on {job['node']} is {end['state']}: judge the sweep once its jobs "
                "have ended (they end by their time limit at the latest)"
            )
        job.update(end or {}, state=(end or {}).get("state") or ("NOT_SUBMITTED" if job.get("error") else "UNKNOWN"))
        if job.get("retest"):
            retest.close(job["node"], job["retest"])  # drained again before anything reads its verdict
            keep(run_dir, record)
        doc = read_json(doc_path)
        if not _gpus(doc) and not shown:
            shown = slurm.show_nodes()  # the node's GPUs as Slurm counts them (Gres), for a job without a document
        job["gpus"] = _gpus(doc) or (shown.get(job["node"]) or {}).get("gpus")
        job["gpu_seconds"] = float((job.get("elapsed_s") or 0) * (job["gpus"] or 0))
        job["gpu_hours"] = round(job["gpu_seconds"] / 3600, 4)  # for people; sums are made of the seconds
        held = (
            next(
                (
                    r
                    for r in (doc or {}).get("results") or []
                    if r.get("check") == "node_lock" and r.get("status") == "error"
                ),
                None,
            )
            if isinstance(doc, dict)
            else None
        )
        if job["state"] in NO_VERDICT or job["state"] in ("UNKNOWN", "NOT_SUBMITTED") or held:
            job["judged"] = False
            job["note"] = f"{held['reason']}: no verdict for the node" if held else _note(job)
            if doc_path.exists():
                aside = paths.make_dir(Path(run_dir) / "sweep" / "not-judged") / doc_path.name
                os.replace(doc_path, aside)
                job["note"] += f"; what it measured is kept in sweep/not-judged/{doc_path.name}"
            continue
        job["judged"] = True
        judged.append(job["host"])
        if job["state"] != "COMPLETED" or not isinstance(doc, dict):
            _job_error(Path(run_dir), job, doc)
    record["judged"] = judged
    keep(run_dir, record)
    return record


def _gpus(doc) -> int | None:
    for r in (doc or {}).get("results") or [] if isinstance(doc, dict) else []:
        if r.get("check") == "gpu_count" and isinstance(r.get("value"), int):
            return r["value"]
    return None


def _note(job: dict) -> str:
    return {
        "PREEMPTED": "preempted by real work: no verdict for the node; the next sweep takes it again",
        "CANCELLED": "cancelled before it ended: no verdict for the node",
        "DEADLINE": "could not start before its deadline (the node was taken): no verdict",
        "NOT_SUBMITTED": f"not submitted: {job.get('error')}",
    }.get(job["state"], f"ended {job['state']}: no verdict for the node")


def _job_error(run_dir: Path, job: dict, doc) -> None:
    """The job ran but did not end well (its time limit, a failure, its node lost): an `error` in its document."""
    out = run_dir / "sweep" / f"{job['host']}.out"
    tail = (paths.read_bytes(out)[0] or b"")[-2000:].decode("utf-8", "replace")
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


def judge(run_dir: Path, *, names: dict | None = None) -> dict | None:
    """The report over the jobs' documents (None when no job left a verdict); the run marked finished."""
    record = collect(run_dir)
    if not record["judged"]:
        return None
    summary = report.build(Path(run_dir), expected_hosts=record["judged"], slurm_names=names)
    runs.finish(Path(run_dir), summary["verdict"])
    return summary
