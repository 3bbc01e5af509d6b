"""`gpufleet report RUN_DIR`: the run's host documents judged together into the report files, the store and the
verdict. Its parser and how it runs; main.py loads this module only for it."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet import report
from gpufleet.base import runs, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet.store import Store


def cmd_report(args) -> int:
    if (Path(args.run_dir) / runs.RUN_FILE).exists():  # a damaged run record, named before anything is written
        runs.read_run(Path(args.run_dir))
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


def add_parsers(sub) -> None:
    """report on the engine's subcommands."""
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
