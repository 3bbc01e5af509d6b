"""A tier's node stage on this node in one process, as validate.yml's node stage runs it: what a sweep job runs
inside its Slurm allocation (`srun ... gpufleet node-stage`), with nobody dialling in over SSH.

    gpufleet node-stage --tier smoke|acceptance --run-dir DIR --run-id RUN --host NAME

The node lock for the run (gpufleet_lock_path), the check groups, the counters before, the tier's benchmarks (as
roles/validate_node/vars/main.yml picks them), the counters after, the lock given back. The host document is
written to RUN_DIR/hosts/HOST.json in the shared reports folder after the checks and again after the benchmarks, so
a job stopped during the benchmarks keeps what it measured first. A job stopped by a signal (preempted, cancelled,
at its time limit) gives the lock back before it exits. Nothing here judges the fleet: the controller does, from
the documents.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpufleet import collect, guard, host_documents, lock, paths, registry, schema
from gpufleet.comparisons import node as node_references
from gpufleet.checks import GROUPS
from gpufleet.command_line import json_arg
from gpufleet.errors import InputError

# tier -> (benchmarks, benchmark tier), as the role's validate_node_benchmarks and validate_node_benchmark_tier pick
# them: smoke's at the smoke tier; acceptance's gpufleet_benchmarks default at gpufleet_benchmark_tier's (quick).
TIERS = {
    "smoke": (list(registry.tier_benchmarks("smoke")), "smoke"),
    "acceptance": (
        [b for b in registry.benchmark_names(default=True) if b in registry.tier_benchmarks("acceptance")],
        "quick",
    ),
}
GROUP_LOCK = "lock"


def lock_result(got: dict, lock_path: str, run_id: str, started: str) -> dict:
    """`lock.node_lock`, as the playbook's node stage records it: pass when this run holds the node, else the error
    naming the run that does (nothing is measured beside another run)."""
    detail = {
        "path": lock_path,
        "record": got.get("record"),
        "stale": got.get("stale"),
        "waited_s": got.get("waited_s") or 0,
    }
    if got["acquired"]:
        stale = got.get("stale")
        reason = f"held by this run ({run_id})" + (
            f"; took over the stale lock of run {(stale.get('previous') or {}).get('run_id', '?')}: {stale.get('reason')}"
            if stale
            else ""
        )
        return schema.result(
            "node_lock", schema.PASS, reason, group=GROUP_LOCK, detail=detail, started=started, seconds=0.0
        )
    return schema.result(
        "node_lock",
        schema.ERROR,
        f"not measured: {got['reason']}",
        group=GROUP_LOCK,
        detail=detail,
        remedy="the next sweep measures the node once that run gave it back",
        started=started,
        seconds=0.0,
    )


def run(
    tier: str,
    run_dir: Path,
    run_id: str,
    host: str,
    *,
    lock_path: str = lock.DEFAULT_PATH,
    ttl_s: float = 3600,
    benchmarks: list[str] | None = None,
    benchmark_tier: str | None = None,
    readings_file: str | None = None,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir=None,
) -> dict:
    """Measure this node for the run; the host document, as written to RUN_DIR/hosts/HOST.json."""
    if tier not in TIERS:
        raise InputError(f"--tier {tier!r}; expected one of {', '.join(TIERS)}")
    names, bench_tier = TIERS[tier]
    names = names if benchmarks is None else benchmarks
    path = paths.inside(
        Path(run_dir) / "hosts", f"{paths.safe_name(host, 'the host name')}.json", what=f"the host document of {host}"
    )
    if not path.parent.is_dir():
        raise InputError(
            f"{path.parent} does not exist; expected the run's hosts folder in the shared reports folder "
            "(the sweep makes it on the controller before it submits)"
        )
    asked = schema.utc_now()
    got = lock.acquire(lock_path, run_id, host, ttl_s)
    if got["acquired"]:
        guard.at_stop(lambda: lock.release(lock_path, run_id, host))
    doc = {
        "schema_version": schema.SCHEMA_VERSION,
        "host": host,
        "results": [lock_result(got, lock_path, run_id, asked)],
    }
    if not got["acquired"]:
        paths.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return doc
    try:
        t0 = time.monotonic()
        readings = collect.load_recording(readings_file) if readings_file else collect.read_all("/")
        profile = {"profile_name": profile_name, "overrides": overrides, "profile_dir": profile_dir}
        checks = host_documents.check_host(readings, list(GROUPS), host=host, **profile)
        before = host_documents.counters_host("before", readings if readings_file else None, host=host, **profile)
        doc = dict(checks, results=doc["results"] + checks["results"] + before["results"])
        paths.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
        if names:
            bench = host_documents.bench_host(
                names,
                tier=benchmark_tier or bench_tier,
                host=host,
                references=node_references.read(run_dir, host),
                **profile,
            )
            after = host_documents.counters_host("after", readings if readings_file else None, host=host, **profile)
            doc["results"] += bench["results"] + after["results"]
        doc["seconds"] = round(time.monotonic() - t0, 4)
        paths.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    finally:
        lock.release(lock_path, run_id, host)
    return doc


def command(args) -> int:
    doc = run(
        args.tier,
        Path(args.run_dir),
        args.run_id,
        args.host,
        lock_path=args.lock_path,
        ttl_s=args.lock_ttl_s,
        benchmarks=args.benchmarks,
        benchmark_tier=args.benchmark_tier,
        readings_file=args.readings,
        profile_name=args.profile,
        overrides=json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
    )
    print(json.dumps({"host": doc["host"], "verdict": schema.verdict(doc["results"]), "results": len(doc["results"])}))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "node-stage",
        help="on a node, inside a sweep's Slurm job: the tier's node stage, its host document "
        "written to RUN_DIR/hosts/HOST.json",
    )
    p.add_argument("--tier", required=True, choices=list(TIERS))
    p.add_argument("--run-dir", required=True, help="the run's folder in the shared reports folder")
    p.add_argument("--run-id", required=True, help="the run the node lock is taken for")
    p.add_argument("--benchmarks", nargs="*", help="gpufleet_benchmarks (default: the tier's)")
    p.add_argument(
        "--benchmark-tier", choices=list(host_documents.TIERS), help="gpufleet_benchmark_tier (default: the tier's)"
    )
    p.add_argument("--lock-path", default=lock.DEFAULT_PATH, help="gpufleet_lock_path")
    p.add_argument(
        "--lock-ttl-s",
        type=float,
        default=3600,
        help="seconds the lock lasts should the job never give it back (the job's time limit)",
    )
    p.add_argument("--host", required=True, help="the node's inventory name: the document is RUN_DIR/hosts/HOST.json")
    p.add_argument("--readings", help="replay a recording from `gpufleet collect` for the checks and counters")
    p.add_argument("--profile", help="gpufleet_profile: force a profile by name instead of matching the GPU name")
    p.add_argument("--profile-dir", help="directory of profile YAML files")
    p.add_argument("--thresholds", help="JSON object of threshold overrides (gpufleet_thresholds)")
    p.set_defaults(func=command)
