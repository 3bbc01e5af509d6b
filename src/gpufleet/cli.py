"""gpufleet command line: the same engine the Ansible modules run.

    gpufleet collect [--out FILE]                 record NVML + sysfs readings as JSON
    gpufleet check [--group G ...] [--json]       run checks, print a host document
    gpufleet bench matmul|memory|nccl [--tier T]   run benchmarks, print a host document
    gpufleet finetune --config FILE [--nnodes N]  LoRA fine-tune under torchrun, print a host document
    gpufleet report RUN_DIR [--expect-host H ...] aggregate hosts/*.json into reports

Exit codes: 0 ok (check: ran; report: every node accepted), 1 report found a
node that failed acceptance, 2 bad input (the message names what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpufleet import collect, engine, schema
from gpufleet.checks import GROUPS
from gpufleet.errors import InputError
from gpufleet.finetune import cli as finetune_cli


def _json_arg(text: str | None, what: str) -> dict:
    if not text:
        return {}
    try:
        val = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not valid JSON ({exc.msg} at char {exc.pos}); expected a JSON object") from None
    if val is None:
        return {}
    if not isinstance(val, dict):
        raise InputError(f"{what} must be a JSON object of threshold -> value, got {type(val).__name__}")
    return val


def _load_readings(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"readings file {path} cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"readings file {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict) or "nvml" not in doc or "host" not in doc:
        raise InputError(f"readings file {path}: expected an object with 'nvml' and 'host' (from `gpufleet collect`)")
    return doc


def cmd_collect(args) -> int:
    text = json.dumps(collect.read_all(args.root), indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def cmd_check(args) -> int:
    readings = _load_readings(args.readings) if args.readings else collect.read_all(args.root)
    doc = engine.check_host(
        readings,
        args.group or None,
        host=args.host,
        profile_name=args.profile,
        overrides=_json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
    )
    _print_doc(doc, args.json)
    return 0


def cmd_bench(args) -> int:
    nccl_options = {
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "master_addr": args.master_addr,
        "master_port": args.master_port,
        "timeout_s": args.timeout_s,
        "rdzv_timeout_s": args.rdzv_timeout_s,
    }
    doc = engine.bench_host(
        args.benchmark,
        tier=args.tier,
        host=args.host,
        profile_name=args.profile,
        overrides=_json_arg(args.thresholds, "--thresholds"),
        profile_dir=args.profile_dir,
        nccl_options=nccl_options,
        train_reference=_json_arg(args.train_reference, "--train-reference"),
    )
    _print_doc(doc, args.json)
    return 0


def _print_doc(doc: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc, sort_keys=True))
        return
    for r in doc["results"]:
        print(f"{r['status']:5}  {r['check']:24} {r['reason']}")
    print(f"verdict: {schema.verdict(doc['results'])}")


def cmd_report(args) -> int:
    from gpufleet import report  # the node side does not need the renderers

    summary = report.build(Path(args.run_dir), expected_hosts=args.expect_host or None)
    print(json.dumps(summary, sort_keys=True) if args.json else report.summary_text(summary))
    return 1 if summary["verdict"] == schema.FAIL else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("collect", help="record NVML and sysfs readings as JSON")
    c.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    c.add_argument("--out", help="write to this file instead of stdout")
    c.set_defaults(func=cmd_collect)

    k = sub.add_parser("check", help="run node checks and print a host document")
    k.add_argument("--group", action="append", choices=list(GROUPS), help="check group (repeatable; default all)")
    k.add_argument("--readings", help="replay a recording from `gpufleet collect` instead of reading this host")
    k.add_argument("--root", default="/", help="filesystem root to read sysfs/procfs under (tests)")
    k.add_argument("--host", help="host name to record (default: this host's name)")
    k.add_argument("--profile", help="force a profile by name instead of matching the GPU name")
    k.add_argument("--profile-dir", help="directory of profile YAML files")
    k.add_argument("--thresholds", help="JSON object of threshold overrides (gpufleet_thresholds)")
    k.add_argument("--json", action="store_true", help="print the host document as JSON")
    k.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="run benchmarks and print a host document")
    b.add_argument("benchmark", nargs="+", choices=list(engine.BENCHMARKS))
    b.add_argument("--tier", default="quick", choices=["quick", "thorough"])
    b.add_argument("--host", help="host name to record (default: this host's name)")
    b.add_argument("--profile", help="force a profile by name instead of matching the GPU name")
    b.add_argument("--profile-dir", help="directory of profile YAML files")
    b.add_argument("--thresholds", help="JSON object of threshold overrides (gpufleet_thresholds)")
    # nccl and train_gpt2 run under torchrun: where, and for how long.
    b.add_argument("--nnodes", type=int, default=1, help="number of hosts in the run")
    b.add_argument("--node-rank", type=int, default=0, help="this host's rank (inventory order)")
    b.add_argument("--master-addr", default="127.0.0.1", help="address of the first host")
    b.add_argument("--master-port", type=int, default=29511, help="rendezvous port on the first host")
    b.add_argument("--timeout-s", type=float, default=900, help="kill a torchrun run after this many seconds")
    b.add_argument("--rdzv-timeout-s", type=int, default=120, help="how long torchrun waits for every node to join")
    b.add_argument("--train-reference", help="across nodes: JSON of this node's single-node benchmark.train_gpt2 result "
                   "(status, value, reason, world_size), for the scaling efficiency")
    b.add_argument("--json", action="store_true", help="print the host document as JSON")
    b.set_defaults(func=cmd_bench)

    f = sub.add_parser("finetune", help="LoRA fine-tune under torchrun (multi-node) and print a host document")
    finetune_cli.add_arguments(f)
    f.set_defaults(func=finetune_cli.command)

    r = sub.add_parser("report", help="aggregate RUN_DIR/hosts/*.json into report.{json,md,html} and junit.xml")
    r.add_argument("run_dir")
    r.add_argument("--expect-host", action="append", help="a host that must appear (missing ones are reported as errors)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"gpufleet {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
