"""gpufleet command line: the same engine the Ansible modules run.

The commands, grouped as `gpufleet --help` lists them, are COMMAND_GROUPS below; each command's --help says the
rest. The playbooks' and modules' own commands (INTERNAL) run as any other but are left out of that list.

Exit codes: errors.EXIT_CODES, at the end of every command's --help.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import textwrap
from pathlib import Path

from gpufleet import (
    __version__,
    collect,
    guard,
    host_documents,
    lock,
    node_stage,
    profiles,
    report,
    runs,
    schema,
    slurm,
    views,
)
from gpufleet.checks import GROUPS, slurm_health
from gpufleet.collect import counters
from gpufleet.command_line import Parser, add_document_arguments, json_arg, print_doc, results_exit
from gpufleet.errors import InputError
from gpufleet.finetune import cli as finetune_cli
from gpufleet.fleet import cli as fleet_cli
from gpufleet.fleet.store import Store
from gpufleet.runner import cli as runner_cli
from gpufleet.service import cli as service_cli
from gpufleet.lock import DEFAULT_PATH as DEFAULT_LOCK_PATH


def cmd_collect(args) -> int:
    text = json.dumps(collect.read_all(args.root), indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def cmd_check(args) -> int:
    readings = collect.load_recording(args.readings) if args.readings else collect.read_all(args.root)
    doc = host_documents.check_host(
        readings,
        slurm_health.GROUPS if args.slurm_health else args.group or None,
        host=args.host,
        profile_name=args.profile,
        overrides=json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
    )
    if args.slurm_health:
        return _slurm_health(doc, args)
    print_doc(doc, args.json)
    return results_exit(doc["results"], args.exit_zero)


def _slurm_health(doc: dict, args) -> int:
    """Silent and 0 on a healthy node; on a hard fault, drain this node (its Slurm name: --slurm-node, else
    SLURMD_NODENAME, which slurmd sets for its health check, prolog and epilog, else the short host name) and exit 1."""
    faults = slurm_health.hard_faults(doc["results"], args.slurm_health)
    if not faults:
        unread = slurm_health.not_read(doc["results"])
        if unread:  # slurmd keeps the program's stderr in its log; the node stays in service
            print(f"gpufleet health check could not read the GPUs, node left in service: {unread}", file=sys.stderr)
        return 0
    name = args.slurm_node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    why = slurm.reason(slurm_health.reason_text(faults, doc["results"]))
    if args.dry_run:
        print(f"would drain {name}: {why}")
        return 1
    slurm.drain(name, why)
    print(f"drained {name}: {why}", file=sys.stderr)
    return 1


def cmd_bench(args) -> int:
    nccl_options = {
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "master_addr": args.master_addr,
        "master_port": args.master_port,
        "timeout_s": args.timeout_s,
        "rdzv_timeout_s": args.rdzv_timeout_s,
    }
    doc = host_documents.bench_host(
        args.benchmark,
        tier=args.tier,
        host=args.host,
        profile_name=args.profile,
        overrides=json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
        nccl_options=nccl_options,
        train_reference=json_arg(args.train_reference, "--train-reference"),
        soak_options={"duration_s": args.duration_s},
    )
    print_doc(doc, args.json)
    return results_exit(doc["results"], args.exit_zero)


def cmd_counters(args) -> int:
    readings = collect.load_recording(args.readings) if args.readings else None
    doc = host_documents.counters_host(
        args.phase,
        readings,
        root=args.root,
        host=args.host,
        profile_name=args.profile,
        overrides=json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
    )
    print_doc(doc, args.json)
    return results_exit(doc["results"], args.exit_zero)


def cmd_report(args) -> int:
    summary = report.build(
        Path(args.run_dir),
        expected_hosts=args.expect_host or None,
        db=args.db,
        use_store=not args.no_store,
        baseline=args.baseline,
        slurm_names=slurm.names_arg(args.slurm_name),
        textfile_dir=args.textfile_dir,
        fleet_hosts=args.fleet_host,
    )
    if args.set_baseline:
        if not summary.get("store"):
            raise InputError(
                f"--set-baseline (gpufleet_baseline_set) needs the store, and there is none: {summary.get('store_note')}"
            )
        with Store(summary["store"]) as store:
            summary["baseline_set"] = store.set_baseline(summary["run_id"])
    runs.finish(Path(args.run_dir), summary["verdict"])  # the attempt reported: it is never taken for a killed run
    print(json.dumps(summary, sort_keys=True) if args.json else report.summary_text(summary))
    return 1 if summary["verdict"] == schema.FAIL else 0


def cmd_run_start(args) -> int:
    started = runs.start(
        args.reports_dir,
        args.run_id,
        playbook=args.playbook,
        hosts=args.host or [],
        tier=args.tier,
        resume=args.resume,
        limit=args.limit,
        stages=args.stage,
        dry_run=args.dry_run,
    )
    print(json.dumps(started, sort_keys=True))
    return 0


def cmd_run_alive(args) -> int:
    try:
        controller = json.loads(args.controller)
    except json.JSONDecodeError as exc:
        raise InputError(f"--controller is not JSON ({exc.msg}); expected the controller record of a lock") from None
    print(json.dumps({"alive": runs.controller_alive(controller)}))
    return 0


def cmd_run_locks_kept(args) -> int:
    kept = json_arg(args.kept, "--kept")
    runs.record_locks_kept(Path(args.run_dir), kept)
    print(json.dumps({"locks_not_given_back": kept}, sort_keys=True))
    return 0


def cmd_lock(args) -> int:
    if args.lock_command == "acquire":
        controller = json_arg(args.controller, "--controller")
        out = lock.acquire(
            args.path,
            args.run_id,
            args.holder,
            args.ttl_s,
            controller=controller,
            dead_runs=args.dead_run or [],
            wait_s=args.wait_s,
        )
    elif args.lock_command == "heartbeat":
        out = lock.heartbeat(args.path, args.run_id, args.holder)
    elif args.lock_command == "release":
        out = lock.release(args.path, args.run_id, args.holder)
    else:
        out = {"record": lock.read(args.path)}
    print(json.dumps(out, sort_keys=True))
    return 0


def cmd_profiles(args) -> int:
    """The profiles this engine knows, the site's first; what validate.yml checks on the controller before any node
    (gpufleet_profile_dir, gpufleet_checks_disabled)."""
    known = profiles.load_all(args.profile_dir, site_dir=args.site_dir)
    off = host_documents.checks_disabled(json.loads(args.checks_disabled) if args.checks_disabled else [])
    rows = [
        {
            "name": name,
            "site": bool(doc.get("site")),
            "path": doc["path"],
            "match": doc.get("match") or [],
            "uncalibrated": doc.get("uncalibrated"),
        }
        for name, doc in known.items()
    ]
    if args.json:
        print(json.dumps({"profiles": rows, "checks_disabled": off}, sort_keys=True))
        return 0
    for row in rows:
        note = f"; uncalibrated: {row['uncalibrated']}" if row["uncalibrated"] else ""
        print(
            f"{row['name']:<16} {'site' if row['site'] else 'shipped'}  {row['path']}  matches {row['match'] or 'none'}{note}"
        )
    if off:
        print(f"checks turned off: {', '.join(off)}")
    return 0


# The commands as `gpufleet --help` lists them: each group, then its commands in order. A new command is its name on
# one of these lines (and its parser where it lives); one in no group is listed under "more" and fails
# tests/test_cli_conventions.py.
COMMAND_GROUPS = {
    "the fleet, on the controller": (
        "fleet",
        "report",
        "history",
        "baseline",
        "store",
        "versions",
        "slurm",
        "profiles",
    ),
    "the fleet in service, on the controller": ("slurm-sweep", "ladder", "evidence"),
    "one node, on the node": ("check", "bench", "counters", "status", "hw", "collect", "finetune"),
}
# The playbooks' and modules' own steps: they run as any command but are left out of --help.
INTERNAL = ("run", "lock", "record", "node-stage")
HELP_COLUMNS = 100


class Commands:
    """The subcommands' action, keeping each command's one-line help for the grouped list of `gpufleet --help`
    instead of argparse's one flat list."""

    def __init__(self, action: argparse._SubParsersAction):
        self.action = action
        self.helps: dict[str, str] = {}

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        self.helps[name] = kwargs.pop("help", "")
        return self.action.add_parser(name, **kwargs)

    def unplaced(self) -> list[str]:
        """Commands in no group of COMMAND_GROUPS and not INTERNAL."""
        return sorted(set(self.helps) - set(INTERNAL) - {n for names in COMMAND_GROUPS.values() for n in names})

    def listing(self) -> str:
        groups = {**COMMAND_GROUPS, **({"more": tuple(self.unplaced())} if self.unplaced() else {})}
        width = max(len(n) for names in groups.values() for n in names)
        lines = []
        for group, names in groups.items():
            lines.append(f"{group}:")
            for name in (n for n in names if n in self.helps):
                lines += textwrap.wrap(
                    self.helps[name],
                    HELP_COLUMNS,
                    initial_indent=f"  {name:<{width}}  ",
                    subsequent_indent=" " * (width + 4),
                )
        return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="gpufleet", usage="gpufleet [-h] [--version] COMMAND ...")
    p.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    sub = Commands(
        p.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="gpufleet")
    )

    c = sub.add_parser("collect", help="record NVML and sysfs readings as JSON")
    c.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    c.add_argument("--out", help="write to this file instead of stdout")
    c.set_defaults(func=cmd_collect)

    k = sub.add_parser("check", help="run node checks and print a host document")
    k.add_argument("--group", action="append", choices=list(GROUPS), help="check group (repeatable; default all)")
    k.add_argument("--readings", help="replay a recording from `gpufleet collect` instead of reading this host")
    k.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    k.add_argument(
        "--slurm-health",
        nargs="?",
        const="health",
        choices=slurm_health.MODES,
        help="Slurm's health check (HealthCheckProgram, prolog; `epilog` also fails on processes left on a "
        "GPU): silent and exit 0 when healthy; on a hard fault (Xid, ECC, row remap, a GPU gone) drain this "
        "node with the reason and exit 1",
    )
    k.add_argument(
        "--slurm-node",
        help="with --slurm-health: this node's Slurm name (default: $SLURMD_NODENAME, else the short host name)",
    )
    k.add_argument("--dry-run", action="store_true", help="with --slurm-health: print the drain instead of doing it")
    add_document_arguments(k)
    k.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="run benchmarks and print a host document")
    b.add_argument("benchmark", nargs="+", choices=list(host_documents.BENCHMARKS))
    b.add_argument("--tier", default="quick", choices=list(host_documents.TIERS))
    # nccl and train_gpt2 run under torchrun: where, and for how long.
    b.add_argument("--nnodes", type=int, default=1, help="number of hosts in the run")
    b.add_argument("--node-rank", type=int, default=0, help="this host's rank (inventory order)")
    b.add_argument("--master-addr", default="127.0.0.1", help="address of the first host")
    b.add_argument("--master-port", type=int, default=29511, help="rendezvous port on the first host")
    b.add_argument("--timeout-s", type=float, default=900, help="kill a torchrun run after this many seconds")
    b.add_argument("--rdzv-timeout-s", type=int, default=120, help="how long torchrun waits for every node to join")
    b.add_argument(
        "--train-reference",
        help="across nodes: JSON of this node's single-node benchmark.train_gpt2 result "
        "(status, value, reason, world_size), for the scaling efficiency",
    )
    b.add_argument("--duration-s", type=float, default=600, help="soak: seconds of sustained load on every GPU")
    add_document_arguments(b)
    b.set_defaults(func=cmd_bench)

    f = sub.add_parser("finetune", help="LoRA fine-tune under torchrun (multi-node) and print a host document")
    finetune_cli.add_arguments(f)
    f.set_defaults(func=finetune_cli.command)

    views.add_parsers(sub)  # status, hw: the operator views of one node

    pr = sub.add_parser(
        "profiles", help="the threshold profiles this engine knows, a site's own first; refuses a bad one"
    )
    pr.add_argument("--site-dir", help="a site's own profiles, found before the shipped ones (gpufleet_profile_dir)")
    pr.add_argument("--profile-dir", help="directory of the shipped profile YAML files")
    pr.add_argument("--checks-disabled", help="JSON list of group.check to check as gpufleet_checks_disabled")
    pr.add_argument("--json", action="store_true", help="print them as JSON")
    pr.set_defaults(func=cmd_profiles)

    c = sub.add_parser(
        "counters",
        help="snapshot every GPU's error counters (ECC, row remapping, NVLink, PCIe replay, "
        "Xid), every InfiniBand port's counters and the PCIe AER counts of the GPUs, "
        "HCAs and bridges above them, before or after the benchmarks, as a host document",
    )
    c.add_argument(
        "--phase", required=True, choices=list(counters.PHASES), help="before or after the node's benchmarks"
    )
    c.add_argument("--readings", help="replay a recording from `gpufleet collect` instead of reading this host")
    c.add_argument(
        "--root",
        default="/",
        help="filesystem root of the kernel log, boot id, sysfs's InfiniBand and PCI trees (tests)",
    )
    add_document_arguments(c)
    c.set_defaults(func=cmd_counters)

    run = sub.add_parser("run", help="on the controller: start (or resume) a run, its folder and its record")
    run_sub = run.add_subparsers(dest="run_command", required=True)
    rs = run_sub.add_parser(
        "start", help="check the run id and host names, create REPORTS_DIR/RUN_ID, record the attempt"
    )
    rs.add_argument("reports_dir", help="absolute folder of the run folders (gpufleet_reports_dir)")
    rs.add_argument("run_id", nargs="?", help="the run's name (gpufleet_run_id; default: the UTC time, minted here)")
    rs.add_argument("--playbook", default="validate", help="the playbook the attempt runs")
    rs.add_argument("--host", action="append", help="a node the attempt covers (repeatable)")
    rs.add_argument("--tier", help="the attempt's tier (gpufleet_tier)")
    rs.add_argument("--limit", help="the attempt's --limit, as given")
    rs.add_argument("--stage", action="append", help="a stage the attempt runs (repeatable; default: all)")
    rs.add_argument("--resume", action="store_true", help="add an attempt to an existing run instead of refusing it")
    rs.add_argument(
        "--dry-run", action="store_true", help="check as for a run, create and record nothing (validate.yml --check)"
    )
    rs.set_defaults(func=cmd_run_start)
    ra = run_sub.add_parser("alive", help="whether a run's controller process (a lock's `controller`) still runs here")
    ra.add_argument(
        "--controller", required=True, help="the controller record, JSON: host, pid, started_ticks, boot_id"
    )
    ra.set_defaults(func=cmd_run_alive)
    rk = run_sub.add_parser("locks-kept", help="record in run.json the nodes whose lock the run could not give back")
    rk.add_argument("run_dir", help="the run folder")
    rk.add_argument("--kept", required=True, help="JSON {host: why the lock could not be given back}")
    rk.set_defaults(func=cmd_run_locks_kept)

    lk = sub.add_parser("lock", help="on a node: the lock that keeps two runs from measuring it at once")
    lk_sub = lk.add_subparsers(dest="lock_command", required=True)
    for name, what in (
        ("acquire", "take the lock for a run (or join it, for the same run)"),
        ("heartbeat", "the controller still waits on this holder's jobs"),
        ("release", "give the lock back"),
        ("show", "print the lock record"),
    ):
        one = lk_sub.add_parser(name, help=what)
        one.add_argument("--path", default=DEFAULT_LOCK_PATH, help="the lock file (gpufleet_lock_path)")
        if name != "show":
            one.add_argument("--run-id", required=True)
            one.add_argument("--holder", required=True, help="the inventory host taking it")
        if name == "acquire":
            one.add_argument("--ttl-s", type=float, required=True, help="seconds the lease lasts unless given back")
            one.add_argument("--controller", help="JSON of the controller that runs the run (gpufleet run start)")
            one.add_argument("--dead-run", action="append", help="a run the controller knows was killed (repeatable)")
            one.add_argument(
                "--wait-s",
                type=float,
                default=0,
                help="seconds to wait while another run holds the node (gpufleet_lock_wait_s; default 0)",
            )
        one.set_defaults(func=cmd_lock)

    r = sub.add_parser("report", help="aggregate RUN_DIR/hosts/*.json into report.{json,md,html} and junit.xml")
    r.add_argument("run_dir")
    r.add_argument(
        "--expect-host", action="append", help="a host that must appear (missing ones are reported as errors)"
    )
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument("--db", help="the store to index the run into and compare with (default: RUN_DIR/../gpufleet.db)")
    r.add_argument("--no-store", action="store_true", help="no store: history and baseline comparisons skip, saying so")
    r.add_argument("--baseline", help="compare with this run (default: run.json's baseline, else the store's)")
    r.add_argument(
        "--slurm-name", action="append", help="HOST=NAME: the Slurm node name of an inventory host for drain.txt"
    )
    r.add_argument("--set-baseline", action="store_true", help="make this run the fleet's baseline once reported")
    r.add_argument(
        "--textfile-dir",
        help="also write gpufleet_<node>.prom into this node_exporter textfile-collector "
        "folder (gpufleet_prometheus_textfile_dir), each replaced whole",
    )
    r.add_argument(
        "--fleet-host",
        action="append",
        help="with --textfile-dir: a node of the inventory (repeatable); the "
        "gpufleet_*.prom there of a node not among them is removed",
    )
    r.set_defaults(func=cmd_report)
    fleet_cli.add_parsers(sub)  # record, history, baseline, store, versions: the fleet's memory
    runner_cli.add_parsers(sub)  # fleet run|accept|resume|locate: the playbooks through ansible-runner
    service_cli.add_parsers(sub)  # slurm sweep, ladder, evidence: the fleet kept in service
    node_stage.add_parser(sub)  # node-stage: what a sweep job runs on its node
    summary = __doc__.split("\n\n")[0]
    p.description = f"{summary}\n\n{sub.listing()}\n\nEach command's --help says more."
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(service_cli.route(sys.argv[1:] if argv is None else argv))
    try:
        guard.start_from_env()  # stop what this command starts should the run that asked for it be gone
        return args.func(args)
    except InputError as exc:
        print(f"gpufleet {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
