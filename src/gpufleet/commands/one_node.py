"""The commands of one node: `gpufleet collect | check | bench | counters`, and `gpufleet profiles`, which checks the
profiles the node's checks would use (validate.yml runs it once on the controller). Their parsers and how each runs;
main.py loads this module only for them."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from gpufleet import collect
from gpufleet.node import host_documents, supervised
from gpufleet.base import profiles, registry, schema, slurm
from gpufleet.checks import GROUPS, slurm_health
from gpufleet.collect import counters
from gpufleet.base.command_line import add_document_arguments, json_arg, print_doc, results_exit


def cmd_collect(args) -> int:
    reading = collect.identity(args.root) if args.identity else collect.read_all(args.root)
    text = json.dumps(reading, indent=None if args.json else 1, sort_keys=True)
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
    why = slurm.reason(slurm_health.reason_text(faults, doc["results"]), by="health check")
    if args.dry_run:
        print(f"would drain {name}: {why}")
        return 1
    slurm.drain(name, why)
    print(f"drained {name}: {why}", file=sys.stderr)
    return 1


def cmd_bench(args) -> int:
    if args.each_timeout_s:
        return _bench_each(args)
    torchrun = {
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "master_addr": args.master_addr,
        "master_port": args.master_port,
        "timeout_s": args.timeout_s,
        "rdzv_timeout_s": args.rdzv_timeout_s,
    }
    doc = host_documents.bench_host(
        args.benchmark,
        depth=args.depth,
        host=args.host,
        profile_name=args.profile,
        overrides=json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
        torchrun=torchrun,
        options={"soak": {"duration_s": args.duration_s}},
        earlier={"train_gpt2": json_arg(args.train_reference, "--train-reference")},
        references=json_arg(args.references, "--references") or None,
    )
    print_doc(doc, args.json)
    return results_exit(doc["results"], args.exit_zero)


def _bench_each(args) -> int:
    """`gpufleet bench NAMES --each-timeout-s T`: each engine run of NAMES in a process of its own with its own
    timeout (supervised.benchmarks), one document for all: a benchmark that hangs or crashes is an `error` and the
    others keep what they measured."""
    # What every run would refuse, refused once, before any starts: the names, the placement, the profile.
    host_documents.bench_problem(
        args.benchmark, args.depth, {"nnodes": args.nnodes}, {"soak": {"duration_s": args.duration_s}}
    )
    overrides = json_arg(args.thresholds, "--thresholds")
    profiles.resolve(None, profile_name=args.profile, overrides=overrides, profile_dir=args.profile_dir)
    started, t0 = schema.utc_now(), time.monotonic()
    more = ["--depth", args.depth, "--json"]
    for flag, value in (
        ("--host", args.host),
        ("--profile", args.profile),
        ("--profile-dir", args.profile_dir),
        ("--thresholds", args.thresholds),
        ("--train-reference", args.train_reference),
        ("--references", args.references),
    ):
        more += [flag, value] if value else []
    more += ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank), "--master-addr", args.master_addr]
    more += ["--master-port", str(args.master_port), "--rdzv-timeout-s", str(args.rdzv_timeout_s)]
    more += ["--duration-s", str(args.duration_s)]
    soak_s = args.duration_s if "soak" in args.benchmark else None
    docs, results = supervised.benchmarks(sys.executable, args.benchmark, args.each_timeout_s, more, soak_s)
    doc = supervised.document(args.host or socket.gethostname(), docs, results, started, t0)
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


def add_parsers(sub) -> None:
    """collect, check, bench, profiles and counters on the engine's subcommands."""
    c = sub.add_parser("collect", help="record NVML and sysfs readings as JSON")
    c.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    c.add_argument("--out", help="write to this file instead of stdout")
    c.add_argument(
        "--identity",
        action="store_true",
        help="only the hardware a certificate binds: the board's serials and every GPU's UUID and serial "
        "(what `gpufleet verify --live` reads)",
    )
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
    b.add_argument(
        "--depth", default=registry.DEFAULT_DEPTH, choices=list(registry.DEPTHS), help="how much it measures"
    )
    # nccl and train_gpt2 run under torchrun: where, and for how long.
    b.add_argument("--nnodes", type=int, default=1, help="number of hosts in the run")
    b.add_argument("--node-rank", type=int, default=0, help="this host's rank (inventory order)")
    b.add_argument("--master-addr", default="127.0.0.1", help="address of the first host")
    b.add_argument("--master-port", type=int, default=29511, help="rendezvous port on the first host")
    b.add_argument("--timeout-s", type=float, default=900, help="kill a torchrun run after this many seconds")
    b.add_argument(
        "--each-timeout-s",
        type=float,
        help="run each benchmark in a process of its own, killed after this many seconds (sdc with matmul: twice "
        "as long); one that hangs or crashes is an error, the others keep what they measured",
    )
    b.add_argument("--rdzv-timeout-s", type=int, default=120, help="how long torchrun waits for every node to join")
    b.add_argument(
        "--train-reference",
        help="across nodes: JSON of this node's single-node benchmark.train_gpt2 result "
        "(status, value, reason, world_size), for the scaling efficiency",
    )
    b.add_argument("--duration-s", type=float, default=600, help="soak: seconds of sustained load on every GPU")
    b.add_argument(
        "--references",
        help="JSON of what this node's figures are held against (its baseline run's figures, its GPUs' past, the "
        "baseline's fleet medians; the controller's fleet/references.py): a figure past one is measured again",
    )
    add_document_arguments(b)
    b.set_defaults(func=cmd_bench)

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
