"""The commands that keep the fleet in service, on the controller:

    gpufleet slurm sweep --tier smoke|acceptance --partition P [--submit] ...   idle nodes swept as Slurm jobs, judged
    gpufleet slurm sweep --collect RUN_DIR ...                                  judge a sweep whose waiting was cut short
    gpufleet ladder RUN_DIR [--act STEP ...] [--command STEP=CMD ...]          the remediation ladder of a judged run
    gpufleet ladder --clear NODE --by NAME --note TEXT                          a person clears a node's ladder (RMA done)
    gpufleet evidence NODE [--gpu UUID|SERIAL] [--runs RUN ...] [--out FILE]   the archive for a vendor's RMA ticket

Each proposes unless told to act: a sweep without --submit prints its plan, the ladder without --act its steps.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from gpufleet.base import registry, slurm
from gpufleet.base.errors import InputError
from gpufleet.base.paths import DEFAULT_REPORTS_DIR
from gpufleet.certify import signing
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet.store import Store, default_path, errors_said
from gpufleet.service import commands, evidence, ladder, outputs, policy, retest, sweep, sweep_end

SWEEP_COMMAND = "slurm-sweep"


def _print(doc, as_json: bool, text: str) -> None:
    print(json.dumps(doc, sort_keys=True, default=str) if as_json else text)


def plan_text(record: dict) -> str:
    p = record["plan"]
    lines = [
        f"sweep plan, tier {record['tier']}, partition(s) {', '.join(p['partitions'])}: {len(p['idle'])} idle node(s), at most "
        f"{p['allowed']} at once ({p['share']}), {p['held']} sweep job(s) already queued"
    ]
    for node, (options, _) in (record.get("requests") or {}).items():
        lines.append(f"  would submit on {node}: sbatch {' '.join(options)}")
    lines += [
        f"  {'re-test' if j.get('retest') else 'take'} {j['node']}: job "
        f"{j.get('job_id') or 'not submitted: ' + str(j.get('error'))}"
        for j in record["jobs"]
    ]
    lines += [
        f"  re-test {n} in reservation {retest.name(n)}: drained by gpufleet, {why}" for n, why in p["retest"].items()
    ]
    lines += [
        f"  cleaned up {c['reservation']}: {c['node']} drained again ({c['drained']})"
        for c in record.get("left_over") or []
    ]
    lines += [f"  skip {n}: {why}" for n, why in p["skipped"].items()]
    lines += [f"  defer {n}: {why}" for n, why in p["deferred"].items()]
    if not record["jobs"]:
        lines.append(
            "nothing submitted"
            + ("" if not (p["chosen"] or p["retest"]) else ": add --submit (gpufleet_sweep_submit: true) to submit")
        )
    return "\n".join(lines)


def _store_path(args) -> Path:
    """The store a command of the fleet in service uses (--db, else beside the run folder or in --reports-dir)."""
    if getattr(args, "db", None):
        return Path(args.db)
    run_dir = getattr(args, "run_dir", None) or getattr(args, "collect", None)
    return default_path(Path(run_dir).resolve().parent if run_dir else args.reports_dir)


@errors_said(_store_path)
def cmd_sweep(args) -> int:
    names = slurm.names_arg(args.slurm_name)
    act = policy.parse_act(args.act)
    site = commands.parse(args.site_command, policy.ACTABLE)
    fleet_slurm.parse_action(args.action)
    fleet_slurm.parse_max_drain(args.max_drain)
    limit_min = args.time_limit_min or sweep.TIME_LIMIT_MIN[args.tier]
    signer = None  # the certificates the sweep renews, when the site signs them (refused before anything is submitted)
    if args.certify_key or args.certify_command:
        signer = signing.signer_of(args.certify_key, args.certify_command, args.certify_pubkey, [args.reports_dir])
    judging = {"names": names, "action": args.action, "max_drain": args.max_drain, "act": act, "site": site}
    judging.update(signer=signer)
    earlier = []
    if args.collect:
        run_dir = Path(args.collect)
    else:
        if not args.partition:
            raise InputError("--partition (gpufleet_sweep_partitions): name the partition(s) whose idle nodes to sweep")
        try:  # what each job's node stage will run, looked up once here, before any job: the jobs trust it
            registry.stage_plan(args.tier, args.benchmarks, args.depth, ("--tier", "--benchmarks", "--depth"))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        opts = {
            "tier": args.tier,
            "partitions": args.partition,
            "submit_partition": args.sweep_partition,
            "qos": args.qos,
            "nice": args.nice,
            "max_share": args.max_share,
            "time_limit_min": limit_min,
            "wait_min": args.wait_min,
            "python": args.python,
            "lock_path": args.lock_path,
            "thresholds": args.thresholds,
            "profile": args.profile,
            "benchmarks": args.benchmarks,
            "depth": args.depth,
            "node_args": args.node_arg,
            "names": names,
            "submit": args.submit,
            "run_id": args.run_id,
        }
        sweep.parse_share(args.max_share)
        # A sweep that lost slurmctld left its run for later: finished first, its verdicts counted before the plan.
        earlier = [_finish(args, d, judging) for d in sweep_end.unfinished(Path(args.reports_dir)) if args.submit]
        for e in earlier if not args.json else []:
            print("\n".join(e["lines"]), flush=True)
        record = sweep.submit(Path(args.reports_dir), opts)
        if not record["jobs"]:
            _print(dict(record, earlier=[_doc(e) for e in earlier]), args.json, plan_text(record))
            return 0 if all(e["ok"] for e in earlier) else 1
        print(plan_text(record), flush=True) if not args.json else None
        run_dir = Path(record["run_dir"])
        try:
            sweep_end.watch(run_dir, record, None if args.json else lambda line: print(line, flush=True))
        except slurm.Unreachable as exc:
            sweep_end.left_for_later(run_dir, str(exc))
            raise InputError(f"{exc}. Finish it once Slurm answers: {_collect_command(args, run_dir)}") from None
    done = _finish(args, run_dir, judging)
    _print(dict(_doc(done), earlier=[_doc(e) for e in earlier]), args.json, "\n".join(done["lines"]))
    return 0 if all(e["ok"] for e in [*earlier, done]) else 1


def _finish(args, run_dir: Path, judging: dict) -> dict:
    """The run judged and acted on (sweep_end.finish); a lost slurmctld said with the command that finishes it."""
    try:
        return sweep_end.finish(run_dir, judging)
    except slurm.Unreachable as exc:
        raise InputError(
            f"{exc}. Nothing was drained for it; finish it once Slurm answers: {_collect_command(args, run_dir)} "
            "(the next sweep does it too)"
        ) from None


def _doc(done: dict) -> dict:
    return {k: v for k, v in done.items() if k != "lines"}


def _collect_command(args, run_dir: Path) -> str:
    """The command that finishes RUN_DIR with this sweep's judging options."""
    argv = ["gpufleet", "slurm", "sweep", "--collect", str(run_dir)]
    if args.action != "none":
        argv += ["--action", args.action]
    if args.max_drain != fleet_slurm.DEFAULT_MAX_DRAIN:
        argv += ["--max-drain", str(args.max_drain)]
    argv += [f"--act={a}" for a in args.act or []]
    argv += [f"--command={c}" for c in args.site_command or []]
    argv += [f"--slurm-name={n}" for n in args.slurm_name or []]
    argv += [f"--certify-{k}={v}" for k, v in (("key", args.certify_key), ("pubkey", args.certify_pubkey)) if v]
    # The site's signing command may carry a token: named, never printed.
    return shlex.join(argv) + (" --certify-command 'YOUR SIGNING COMMAND'" if args.certify_command else "")


@errors_said(_store_path)
def cmd_ladder(args) -> int:
    names = slurm.names_arg(args.slurm_name)
    if args.clear:
        if not (args.by and args.note):
            raise InputError("--clear NODE needs --by (who cleared it) and --note (the repair, the ticket)")
        record = ladder.clear(Path(args.reports_dir), args.clear, args.by, args.note, names=names)
    elif args.run_dir:
        record = ladder.judge(
            Path(args.run_dir),
            act=policy.parse_act(args.act),
            site_commands=commands.parse(args.site_command, policy.ACTABLE),
            max_actions=args.max_drain,
            names=names,
            db=args.db,
        )
        outputs.write(Path(args.run_dir), args.db)
    else:
        raise InputError("give RUN_DIR (a reported run) or --clear NODE")
    _print(record, args.json, "\n".join(outputs.ladder_lines(record)))
    return 0 if record.get("ok", True) else 1


@errors_said(_store_path)
def cmd_evidence(args) -> int:
    with Store(_store_path(args), create=False) as store:
        done = evidence.build(
            store,
            args.node,
            gpu=args.gpu,
            run_ids=[r for v in args.runs or [] for r in v.split(",") if r],
            out=Path(args.out) if args.out else None,
            bug_report_command=args.bug_report_command,
            bug_report_file=args.bug_report,
            bug_report_timeout_s=args.bug_report_timeout_s,
            redact=args.redact,
        )
    _print(
        done,
        args.json,
        f"{done['path']}: {len(done['files'])} files, runs {', '.join(done['runs'])}, "
        f"{done['redactions']} secret(s) replaced"
        + (f" ({', '.join(f'{k} {n}' for k, n in done['removed'].items())})" if done["removed"] else "")
        + f"; nvidia-bug-report.log {done['bug_report']}",
    )
    return 0


def _ladder_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--act",
        action="append",
        help=f"take this step of the ladder where it is due (repeatable, or comma-separated: "
        f"{', '.join(policy.ACTABLE)}, or all; gpufleet_ladder_act); default: propose only",
    )
    p.add_argument(
        "--command",
        action="append",
        dest="site_command",  # not `command`: the subcommand's own name is args.command
        metavar="STEP=COMMAND",
        help="the site's command of a step, with {host}, "
        "{slurm_node}, {gpu_index}, {gpu_uuid}, {gpu_serial}, {run_id}, {reason} (default reset_gpu: "
        f"`{ladder.DEFAULT_COMMANDS['reset_gpu']}`, reboot: `{ladder.DEFAULT_COMMANDS['reboot']}`)",
    )
    p.add_argument(
        "--max-drain",
        default=fleet_slurm.DEFAULT_MAX_DRAIN,
        help="gpufleet_slurm_max_drain: the breaker, which "
        "counts the nodes the ladder and the run's drains take out (default %(default)s)",
    )
    p.add_argument("--slurm-name", action="append", help="HOST=NAME: the Slurm node name of an inventory host")
    p.add_argument("--json", action="store_true", help="print JSON")


def add_parsers(sub) -> None:
    s = sub.add_parser(
        SWEEP_COMMAND,
        prog="gpufleet slurm sweep",
        help="`gpufleet slurm sweep`: a tier's node stage as "
        "preemptible Slurm jobs on idle nodes, then judged as a run",
    )
    s.add_argument(
        "--tier",
        default=sweep.TIERS[0],
        choices=list(sweep.TIERS),
        help="the run tier of each node's stage (default %(default)s, the shortest)",
    )
    s.add_argument(
        "--partition",
        action="append",
        help="a partition whose idle nodes to sweep (repeatable; gpufleet_sweep_partitions)",
    )
    s.add_argument("--submit", action="store_true", help="submit the jobs (default: print the plan, submit nothing)")
    s.add_argument(
        "--sweep-partition",
        help="the partition the jobs go to, one real work preempts (default: the node's own, "
        "with --qos doing the preempting)",
    )
    s.add_argument("--qos", help="the QOS of the jobs, one real work preempts (gpufleet_sweep_qos)")
    s.add_argument("--nice", type=int, default=sweep.DEFAULT_NICE, help="sbatch --nice (default %(default)s)")
    s.add_argument(
        "--max-share",
        default=sweep.DEFAULT_SHARE,
        help="at most this many idle nodes (N) or percent of them (N%%) "
        "held by sweep jobs at once (default %(default)s, at least one node)",
    )
    s.add_argument(
        "--time-limit-min",
        type=int,
        help="each job's time limit in minutes (default: "
        + ", ".join(f"{tier} {minutes}" for tier, minutes in sweep.TIME_LIMIT_MIN.items())
        + ")",
    )
    s.add_argument(
        "--wait-min",
        type=float,
        default=sweep.DEFAULT_WAIT_MIN,
        help="minutes a job may wait to start before Slurm removes it (--deadline; a fraction allowed; "
        "default %(default)s)",
    )
    s.add_argument(
        "--python", default="/opt/gpufleet/venv/bin/python", help="gpufleet_python on the nodes (default %(default)s)"
    )
    s.add_argument("--lock-path", default="/run/lock/gpufleet-node.lock", help="gpufleet_lock_path on the nodes")
    s.add_argument("--thresholds", help="gpufleet_thresholds, a JSON object")
    s.add_argument("--profile", help="gpufleet_profile")
    s.add_argument("--benchmarks", nargs="*", help="gpufleet_benchmarks: which of the tier's benchmarks run")
    s.add_argument("--depth", choices=registry.chosen_depths(), help="gpufleet_benchmark_depth (default: the tier's)")
    s.add_argument(
        "--node-arg",
        action="append",
        help="one more argument of `gpufleet node-stage` on the node; {node} and {host} are replaced (repeatable)",
    )
    s.add_argument(
        "--reports-dir",
        default=DEFAULT_REPORTS_DIR,
        help="the shared reports folder, the same path on the controller and the nodes (default ./%(default)s)",
    )
    s.add_argument("--run-id", help="the run's name (default: the UTC time)")
    s.add_argument(
        "--collect", metavar="RUN_DIR", help="judge the sweep of RUN_DIR, whose jobs have ended, instead of a new one"
    )
    s.add_argument(
        "--action",
        default="none",
        help=f"gpufleet_slurm_action after the report: {', '.join(fleet_slurm.ACTIONS)} (default none)",
    )
    s.add_argument(
        "--certify-key",
        metavar="KEY",
        help="renew the certificate of each node the sweep accepts, signed with this private key "
        "(gpufleet_certify_key; docs/certificates.md)",
    )
    s.add_argument("--certify-command", metavar="CMD", help="instead of --certify-key, the site's signing command")
    s.add_argument("--certify-pubkey", metavar="PUB", help="with --certify-command, the public key it signs for")
    _ladder_options(s)
    s.set_defaults(func=cmd_sweep)

    lad = sub.add_parser(
        "ladder",
        help="the remediation ladder of a reported run: each node not accepted gets its next step "
        "(proposed unless --act), each accepted one its ladder cleared",
    )
    lad.add_argument("run_dir", nargs="?", help="the run's folder, holding report.json")
    lad.add_argument(
        "--clear",
        metavar="NODE",
        help="a person clears NODE's ladder (repair done, RMA closed); it stays drained "
        "until `gpufleet fleet accept NODE --slurm` accepts it",
    )
    lad.add_argument("--by", help="with --clear: who clears it")
    lad.add_argument("--note", help="with --clear: what was done (the repair, the ticket)")
    lad.add_argument(
        "--reports-dir", default=DEFAULT_REPORTS_DIR, help="with --clear: the reports folder (default ./%(default)s)"
    )
    lad.add_argument("--db", help="the store (default: RUN_DIR/../gpufleet.db)")
    _ladder_options(lad)
    lad.set_defaults(func=cmd_ladder)

    e = sub.add_parser(
        "evidence", help="one archive of a node's (or GPU's) failing runs for a vendor's RMA ticket, secrets removed"
    )
    e.add_argument("node", help="the inventory host name")
    e.add_argument("--gpu", help="a GPU UUID (GPU-...) or serial: its figures, counters and the runs that flagged it")
    e.add_argument(
        "--runs",
        action="append",
        help="these runs' documents (repeatable or comma-separated; default: the "
        f"latest {evidence.MAX_RUNS} runs that failed it)",
    )
    e.add_argument("--out", help="the archive (default ./gpufleet-evidence-NODE-TIME.tar.gz)")
    e.add_argument(
        "--bug-report-command",
        help="the site's command that prints the node's nvidia-bug-report.log (gz or text) "
        "on stdout, with {host}; e.g. `ssh {host} sudo nvidia-bug-report.sh --output-file /dev/stdout`; "
        "without it, on the node itself, its nvidia-bug-report.sh where installed",
    )
    e.add_argument("--bug-report", help="a nvidia-bug-report.log(.gz) fetched already")
    e.add_argument(
        "--bug-report-timeout-s",
        type=float,
        default=commands.TIMEOUT_S,
        help="seconds the bug report may take, by the site's command or, on the node itself, its "
        f"{evidence.BUG_REPORT_SCRIPT} (default %(default)s)",
    )
    e.add_argument(
        "--redact",
        action="append",
        help="a secret to keep out of the archive (repeatable); secret environment "
        "variables and key=value secrets are removed without it",
    )
    e.add_argument(
        "--reports-dir",
        default=DEFAULT_REPORTS_DIR,
        help="the reports folder holding gpufleet.db (default ./%(default)s)",
    )
    e.add_argument("--db", help="the store (default: REPORTS_DIR/gpufleet.db)")
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=cmd_evidence)
