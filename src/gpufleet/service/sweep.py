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
    the run     RUN_DIR/run.json (playbook sweep), sweep.json (the plan, each job and what became of it); each
                job followed to its end within its bound, what it wrote judged (sweep_end.py); then `gpufleet slurm`'s
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
import socket
import time
from pathlib import Path

from gpufleet.base import certificates, paths, profiles, registry, runs, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet import references, store as fleet_store
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
        f"--deadline=now+{round((opts['wait_min'] + limit_min) * 60)}",
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
    try:
        config, parts = slurm.config(), slurm.partitions()
    except slurm.Unreachable as exc:
        raise slurm.Unreachable(f"{exc}: nothing was submitted; the next sweep tries again") from None
    submit_to = [opts["submit_partition"]] if opts["submit_partition"] else opts["partitions"]
    why = preemption_problem(config, parts, submit_to, opts.get("qos"))
    if why:
        raise InputError(why)
    reports_dir = Path(reports_dir).resolve()
    if opts.get("submit"):
        paths.make_dir(reports_dir)
    with (
        paths.folder_lock(reports_dir) if reports_dir.is_dir() else contextlib.nullcontext(),  # a plan makes nothing
        _nothing_submitted(),
    ):
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
            # Who follows the jobs (a later sweep finishes a run whose sweep is gone), and for how long each.
            "sweep": {"host": socket.gethostname(), "pid": os.getpid()},
            "end_grace_s": end_grace_s(config),
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
            job = {"node": node, "host": host, "bound": bound(opts, record["end_grace_s"])}
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


@contextlib.contextmanager
def _nothing_submitted():
    """slurmctld lost while the sweep plans: said so."""
    try:
        yield
    except slurm.Unreachable as exc:
        raise slurm.Unreachable(f"{exc}: nothing was submitted; the next sweep tries again") from None


def end_grace_s(config: dict) -> float:
    """Seconds Slurm may take to end a job past its time limit and say so: KillWait (SIGTERM to SIGKILL), two
    MessageTimeouts (the kill, the end reported back), two polls of the sweep."""
    number = lambda key, default: float(re.match(r"\d*", config.get(key, "")).group() or default)  # noqa: E731
    return number("KillWait", 30) + 2 * number("MessageTimeout", 10) + 2 * POLL_S


def bound(opts: dict, grace_s: float) -> str:
    """When a job is past its bound, as UTC: its wait to start, its time limit, and Slurm's time to end it."""
    at = time.time() + (opts["wait_min"] + opts["time_limit_min"]) * 60 + grace_s
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def keep(run_dir: Path, record: dict) -> None:
    paths.write_atomic(Path(run_dir) / SWEEP_FILE, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
