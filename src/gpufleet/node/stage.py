"""A node's stage, written once: the node lock for the run, the check groups, the counters, the run tier's
benchmarks, the counters again, the lock given back. Whoever runs it runs it in parts, each part one process on the
node:

    gpufleet node-stage --part checks      the lock (taken for the run), the check groups, the counters before; and,
                                           when the tier runs no benchmark, the counters after (and --release)
    gpufleet node-stage --part benchmarks  the tier's benchmarks, the counters after, the lock given back (--release)
    gpufleet node-stage --part whole       both, the document written to RUN_DIR/hosts/HOST.json after each part, the
                                           lock given back (a sweep's Slurm job: `srun ... gpufleet node-stage`)
    gpufleet node-stage --part plan        who holds the lock, gpu_inventory, what a real run would run (check mode)

validate.yml's node stage (plugins/action/node_validate.py) runs checks, then benchmarks, each one module run on the
node, so that a node lost during the benchmarks keeps what the checks measured; it writes the document on the
controller. Each part prints its document (JSON) with what the next part needs: the lock's answer, the benchmarks
the tier runs and at which depth.

Each step is an engine process of its own (`gpufleet check --group G`, `gpufleet counters`, `gpufleet bench`, under
--python: supervised.py), killed with everything it started at its timeout: a step that hangs, crashes or is killed
is an `error` result of its group, and the others keep what they measured. The tier comes checked (the controller's
run_inputs, or the sweep, before any node): the stage looks up what it runs (registry.stage_plan), and a tier, benchmark
or depth typed by hand that the registry refuses is said in the same words, naming the option. Nothing here judges the
fleet: the controller does.
A part stopped by a signal stops its step; the whole stage gives the lock back first (guard.at_stop).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.base import guard, lock, paths, registry, schema, slurm
from gpufleet.node import supervised
from gpufleet.base.command_line import json_arg
from gpufleet.comparisons import node as node_references
from gpufleet.base.errors import InputError

PARTS = ("checks", "benchmarks", "whole", "plan")
REMEDY_SWEEP = "the next sweep measures the node once that run gave it back"
REMEDY_RERUN = supervised.REMEDY_RERUN
OPTIONS = ("--tier", "--benchmarks", "--depth")  # registry.STAGE_INPUTS as this command names them
ENGINE = registry.ENGINE_CHECK.name  # the check of the `error` of a check group or counter step that gave no document


@dataclass
class Stage:
    """One node's stage as it was asked for (the command line of `gpufleet node-stage`)."""

    host: str
    tier: str | None = None
    chosen: list[str] | None = None  # gpufleet_benchmarks
    depth: str | None = None  # gpufleet_benchmark_depth
    python: str = sys.executable  # the interpreter of its steps
    check_timeout_s: float = 120
    benchmark_timeout_s: float = 900
    soak_duration_s: float | None = None
    references: dict | None = None
    readings: str | None = None  # a recording replayed by the checks and counters
    node_args: list[str] = field(default_factory=list)  # --profile, --profile-dir, --thresholds of every step
    lock: dict | None = None  # path, run_id, holder, ttl_s, controller, dead_runs, wait_s
    release: bool = False
    results: list = field(default_factory=list)
    docs: list = field(default_factory=list)

    def benchmarks(self) -> tuple[list[str], str]:
        """What the tier runs, at which depth: the registry's lookup; InputError naming the option."""
        try:
            names, depth = registry.stage_plan(self.tier, self.chosen, self.depth, OPTIONS)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return list(names), depth


# ------------------------------------------------------------------------------------------------- its steps


def _keep(stage: Stage, doc: dict | None, results: list) -> None:
    stage.docs += [doc] if doc else []
    stage.results += results


def _node_args(stage: Stage, *, readings: bool = False) -> list[str]:
    return ["--json", "--host", stage.host, *stage.node_args] + (
        ["--readings", stage.readings] if readings and stage.readings else []
    )


def checks(stage: Stage) -> None:
    """The check groups, then the counters before the benchmarks."""
    for group in registry.group_names():
        check_group(stage, group)
    counters(stage, "before")


def check_group(stage: Stage, group: str) -> None:
    what, more = ["check", "--group", group], _node_args(stage, readings=True)
    _keep(stage, *supervised.run(stage.python, what, more, stage.check_timeout_s, [ENGINE], group, REMEDY_RERUN))


def counters(stage: Stage, phase: str) -> None:
    what, more = ["counters", "--phase", phase], _node_args(stage, readings=True)
    _keep(stage, *supervised.run(stage.python, what, more, stage.check_timeout_s, [ENGINE], "counters", REMEDY_RERUN))


def benchmarks(stage: Stage, names: list[str], depth: str) -> None:
    """The benchmarks, each engine run a step with its own timeout (supervised.benchmarks), then the counters."""
    more = ["--depth", depth, *_node_args(stage)]
    if stage.soak_duration_s:
        more += ["--duration-s", str(stage.soak_duration_s)]
    if stage.references:
        more += ["--references", json.dumps(stage.references, sort_keys=True)]
    docs, results = supervised.benchmarks(
        stage.python, names, stage.benchmark_timeout_s, more, soak_duration_s=stage.soak_duration_s
    )
    stage.docs += docs
    stage.results += results
    counters(stage, "after")


# ------------------------------------------------------------------------------------------------- the lock


def take(stage: Stage, remedy: str) -> dict:
    """The node lock for the run (lock.acquire), its result first in the stage's; while it is held every step
    carries it (lock.ENV), so that a step of a run that lost the node stops."""
    spec, asked = stage.lock, schema.utc_now()
    ttl_s = spec["ttl_s"]
    if spec.get("plus_benchmarks"):  # the lease also covers the tier's benchmarks, each at its timeout, twice
        names, _ = stage.benchmarks()
        ttl_s += 2 * (stage.benchmark_timeout_s + 60) * len(names) + 2 * (stage.soak_duration_s or 0)
    got = lock.acquire(
        spec["path"],
        spec["run_id"],
        spec["holder"],
        ttl_s,
        controller=spec.get("controller") or {},
        dead_runs=spec.get("dead_runs") or [],
        wait_s=spec.get("wait_s") or 0,
    )
    stage.results.append(lock.result(got, spec["path"], spec["run_id"], asked, remedy.format(**spec)))
    if got["acquired"]:
        os.environ[lock.ENV] = json.dumps(
            {"path": spec["path"], "run_id": spec["run_id"], "holder": spec["holder"], "heartbeat_timeout_s": None},
            sort_keys=True,
        )
    return got


def give_back(stage: Stage) -> bool:
    """The lock given back; whether it was (a run that no longer held it is said on stderr)."""
    spec = stage.lock
    out = lock.release(spec["path"], spec["run_id"], spec["holder"])
    os.environ.pop(lock.ENV, None)
    if not out["released"]:
        print(f"gpufleet node-stage: the node lock was not given back: {out['reason']}", file=sys.stderr)
    return out["released"]


# ------------------------------------------------------------------------------------------------- the parts


def document(stage: Stage, started: str, t0: float) -> dict:
    return supervised.document(stage.host, stage.docs, stage.results, started, t0)


def part(stage: Stage, which: str) -> dict:
    """One part as validate.yml's node stage runs it: its document, with `lock` (checks, plan), `benchmarks` and
    `depth` (what the benchmarks part runs), `done` (nothing is left for it) and `released` beside the results."""
    started, t0 = schema.utc_now(), time.monotonic()
    names, depth = stage.benchmarks()
    extra: dict = {"benchmarks": names, "depth": depth}
    if which == "plan":  # check mode: nothing taken, nothing measured beyond gpu_inventory
        extra["lock"] = {"record": lock.read(stage.lock["path"]) if stage.lock else None}
        check_group(stage, "gpu_inventory")
    elif which == "checks":
        got = take(stage, lock.REMEDY_HELD) if stage.lock else {"acquired": True}
        extra["lock"] = got
        if got["acquired"]:
            checks(stage)
            extra["done"] = not names
            if not names:
                counters(stage, "after")
    else:
        benchmarks(stage, names, depth)
        extra["done"] = True
    if extra.get("done") and stage.release and stage.lock:
        extra["released"] = give_back(stage)
    return dict(document(stage, started, t0), **extra)


def whole(stage: Stage, run_dir: Path) -> dict:
    """A sweep job's node stage: the parts in turn, the document written to RUN_DIR/hosts/HOST.json after each (a
    job stopped during the benchmarks keeps what it measured first), the lock given back, also on a signal. The
    document of the stage that ran to its end says when (`finished`): what the sweep judges, whatever Slurm
    remembers of the job."""
    path = paths.inside(
        Path(run_dir) / "hosts",
        f"{paths.safe_name(stage.host, 'the host name')}.json",
        what=f"the host document of {stage.host}",
    )
    if not path.parent.is_dir():
        raise InputError(
            f"{path.parent} does not exist; expected the run's hosts folder in the shared reports folder "
            "(the sweep makes it on the controller before it submits)"
        )
    started, t0 = schema.utc_now(), time.monotonic()
    print(f"{slurm.STAGE_STARTED} on {stage.host} at {started}", file=sys.stderr, flush=True)
    names, depth = stage.benchmarks()
    got = take(stage, REMEDY_SWEEP)
    if got["acquired"]:
        guard.at_stop(lambda: lock.release(stage.lock["path"], stage.lock["run_id"], stage.lock["holder"]))
        try:
            checks(stage)
            paths.write_atomic(path, json.dumps(document(stage, started, t0), indent=1, sort_keys=True) + "\n")
            if names:
                stage.references = node_references.read(run_dir, stage.host)
                benchmarks(stage, names, depth)
            else:
                counters(stage, "after")
        finally:
            give_back(stage)
    doc = dict(document(stage, started, t0), finished=schema.utc_now())
    paths.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    return doc


# ------------------------------------------------------------------------------------------------- the command


def stage_of(args) -> Stage:
    lock_spec = None
    if args.run_id:
        lock_spec = {
            "path": args.lock_path,
            "run_id": args.run_id,
            "holder": args.host,
            "ttl_s": args.lock_ttl_s,
            "plus_benchmarks": args.lock_ttl_plus_benchmarks,
            "controller": json_arg(args.controller, "--controller"),
            "dead_runs": args.dead_run or [],
            "wait_s": args.lock_wait_s,
        }
    node_args = [a for flag, value in (("--profile", args.profile), ("--profile-dir", args.profile_dir)) if value
                 for a in (flag, value)]  # fmt: skip
    if args.thresholds:
        json_arg(args.thresholds, "--thresholds")  # refused here, in one line, not once a step
        node_args += ["--thresholds", args.thresholds]
    return Stage(
        host=args.host,
        tier=args.tier,
        chosen=args.benchmarks,
        depth=args.depth,
        python=args.python or sys.executable,
        check_timeout_s=args.check_timeout_s,
        benchmark_timeout_s=args.benchmark_timeout_s,
        soak_duration_s=args.soak_duration_s,
        references=json_arg(args.references, "--references") or None,
        readings=args.readings,
        node_args=node_args,
        lock=lock_spec,
        release=args.release,
    )


def command(args) -> int:
    stage = stage_of(args)
    stage.benchmarks()  # a tier, benchmark or depth the registry refuses: said before anything starts
    if args.part == "whole":
        if not args.run_dir or not stage.lock:
            raise InputError("--part whole needs --run-dir and --run-id (the run the document and the lock are for)")
        doc = whole(stage, Path(args.run_dir))
        print(
            json.dumps({"host": doc["host"], "verdict": schema.verdict(doc["results"]), "results": len(doc["results"])})
        )
        return 0
    if args.part == "checks" and not stage.lock:
        raise InputError("--part checks needs --run-id: the node is measured for a run, under its lock")
    print(json.dumps(part(stage, args.part), sort_keys=True, default=str))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "node-stage",
        help="on a node: its stage for a run (the lock, the checks, the counters, the tier's benchmarks), in parts",
    )
    p.add_argument("--part", choices=PARTS, default="whole", help="which part (default: whole, a sweep job's)")
    p.add_argument("--host", required=True, help="the node's inventory name (RUN_DIR/hosts/HOST.json)")
    p.add_argument(
        "--tier",
        help=f"gpufleet_tier, checked on the controller: one of {', '.join(registry.run_tier_names())} "
        f"(default {registry.DEFAULT_RUN_TIER})",
    )
    p.add_argument("--benchmarks", nargs="*", help="gpufleet_benchmarks: which of the tier's benchmarks run")
    p.add_argument(
        "--depth", choices=registry.DEPTHS, help="gpufleet_benchmark_depth, where the tier has none of its own"
    )
    p.add_argument("--python", help="the interpreter of each step (default: this one)")
    p.add_argument("--check-timeout-s", type=float, default=120, help="gpufleet_check_timeout_s, for each check group")
    p.add_argument("--benchmark-timeout-s", type=float, default=900, help="gpufleet_benchmark_timeout_s, each")
    p.add_argument("--soak-duration-s", type=float, help="gpufleet_soak_duration_s")
    p.add_argument("--references", help="JSON of what the node's figures are held against (gpufleet references)")
    p.add_argument("--run-dir", help="--part whole: the run's folder in the shared reports folder")
    p.add_argument("--run-id", help="the run the node lock is taken for")
    p.add_argument("--lock-path", default=lock.DEFAULT_PATH, help="gpufleet_lock_path")
    p.add_argument(
        "--lock-ttl-s", type=float, default=3600, help="seconds the lock lasts should it never be given back"
    )
    p.add_argument("--lock-ttl-plus-benchmarks", action="store_true", help="add twice the tier's benchmarks' timeouts")
    p.add_argument("--controller", help="JSON of the controller that runs the run (gpufleet run start)")
    p.add_argument("--dead-run", action="append", help="a run the controller knows was killed (repeatable)")
    p.add_argument("--lock-wait-s", type=float, default=0, help="gpufleet_lock_wait_s")
    p.add_argument("--release", action="store_true", help="give the lock back once the stage is done")
    p.add_argument("--readings", help="replay a recording from `gpufleet collect` for the checks and counters")
    p.add_argument("--profile", help="gpufleet_profile: force a profile by name instead of matching the GPU name")
    p.add_argument("--profile-dir", help="directory of profile YAML files")
    p.add_argument("--thresholds", help="JSON object of threshold overrides (gpufleet_thresholds)")
    p.set_defaults(func=command)
