"""The fleet commands, on the controller:

    gpufleet record RUN_DIR HOST [--replace-group G ...] [--folder hosts|peers] [--db PATH | --no-store]   document on stdin
    gpufleet history NODE|GPU-UUID|SERIAL [--db PATH | --reports-dir DIR] [--json]
    gpufleet baseline set RUN_ID | show | clear [--db PATH | --reports-dir DIR] [--json]
    gpufleet store rebuild [--reports-dir DIR] [--db PATH]
    gpufleet versions RUN_DIR [--hosts H1,H2,...] [--peers P1,...] [--json]   the software and firmware table of the run's nodes
    gpufleet slurm RUN_DIR --action none|drain|drain_resume [--max-drain N|N%] [--check]   the verdict in Slurm
    gpufleet slurm RUN_DIR --take-over HOST ... [--check]   nodes under acceptance drained by gpufleet first
    gpufleet references RUN_DIR --host H ... [--db PATH] [--baseline RUN_ID]   what each node's figures are held against

Default store: <run_dir>/../gpufleet.db for record; <reports-dir>/gpufleet.db (reports-dir default ./reports)
for the others.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path

from gpufleet.base import paths, runs, schema, slurm
from gpufleet.base.command_line import json_arg
from gpufleet.base.errors import InputError
from gpufleet.fleet import references, versions
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet.document_writer import FOLDERS, record
from gpufleet.fleet.history_text import history_text
from gpufleet.fleet.repair import open_for_run, repair, use_for_run
from gpufleet.fleet.run_files import read_run_info
from gpufleet.fleet.store import DamagedStore, Store, default_path, errors_said
from gpufleet.fleet.store_tables import problem


def _store_path(args) -> Path:
    if getattr(args, "db", None):
        return Path(args.db)
    return default_path(getattr(args, "reports_dir", None) or paths.DEFAULT_REPORTS_DIR)


def _open(args, *, create: bool = False, check: bool = False):
    return Store(_store_path(args), create=create, check=check)


# A SQLite error met while a command uses the store: said for what it means, naming the store (exit 2).
_store_errors = errors_said(_store_path)


def _print(doc, as_json: bool, text: str) -> None:
    print(json.dumps(doc, sort_keys=True, default=str) if as_json else text)


# ---------------------------------------------------------------- record


def cmd_record(args) -> int:
    started, run_dir = schema.utc_now(), Path(args.run_dir)
    raw = sys.stdin.buffer.read()
    doc, why = schema.parse_host_doc(raw)
    if doc is None:
        raise InputError(f"stdin: the host document for {args.host} is unreadable: {why}")
    controller = json_arg(args.controller, "--controller") or None
    done = record(run_dir, args.host, doc, args.replace_group, args.folder, controller)
    done["store"] = done["store_error"] = None
    if not args.no_store:
        db = Path(args.db) if args.db else default_path(run_dir.resolve().parent)
        raw = Path(done["path"]).read_bytes()
        merged, why = schema.parse_host_doc(raw)

        def index(store: Store) -> None:
            store.upsert_run(done["run_id"], run_dir.resolve(), read_run_info(run_dir))
            if (
                args.folder == "hosts"
                or not store.conn.execute(
                    "SELECT 1 FROM documents WHERE run_id = ? AND host = ? AND role = 'node'",
                    (done["run_id"], args.host),
                ).fetchone()
            ):
                store.index_document(
                    done["run_id"],
                    args.host,
                    merged,
                    path=f"{args.folder}/{args.host}.json",
                    raw=raw,
                    problem=why,
                    role="node" if args.folder == "hosts" else "peer",
                )

        try:  # a store found damaged on opening or while indexing is repaired, and the document indexed into the new one
            store, _ = use_for_run(open_for_run(db, run_dir), run_dir, index)
            done["store_repairs"] = [r["note"] for r in store.repairs_since(started)]  # a store moved aside, named
            store.close()
            done["store"] = str(db)
        except (InputError, sqlite3.Error) as exc:
            # The host document is the record and it is written; the report indexes the whole run again.
            done["store_error"] = f"{done['path']} is written, but indexing it into {db} failed: {exc}"
            print(f"gpufleet record: {done['store_error']}", file=sys.stderr)
    print(json.dumps(done, sort_keys=True))
    return 0


# ---------------------------------------------------------------- history


@_store_errors
def cmd_history(args) -> int:
    with _open(args) as store:
        hist = store.history(args.key)
    _print(hist, args.json, history_text(hist))
    return 0


# ---------------------------------------------------------------- baseline and store


@_store_errors
def cmd_baseline(args) -> int:
    with _open(args, check=args.action != "show") as store:  # a writer checks every page first
        if args.action == "set":
            paths.safe_name(args.run_id, "RUN_ID")
            base = store.set_baseline(args.run_id)
            note = (
                ""
                if base.get("verdict") in ("pass", "warn")
                else (
                    f" (note: that run's verdict is {base.get('verdict') or 'not reported'}: its figures are the reference all the same)"
                )
            )
            _print(base, args.json, f"baseline: run {base['run_id']}, set {base['set_at']}{note}")
        elif args.action == "clear":
            was = store.clear_baseline()
            _print(
                {"cleared": was},
                args.json,
                f"baseline cleared (was run {was['run_id']})" if was else "no baseline was set",
            )
        else:
            base = store.baseline()
            if base:
                docs = store.documents(base["run_id"])
                nodes = ", ".join(f"{d['host']} {d['verdict'] or '?'}" for d in docs if d["role"] == "node")
                text = (
                    f"baseline: run {base['run_id']} (started {base.get('started') or '?'}, verdict {base.get('verdict') or '?'}), "
                    f"set {base['set_at']}\nnodes: {nodes or 'none'}\nstore: {store.path}"
                )
                base = dict(base, nodes={d["host"]: d["verdict"] for d in docs if d["role"] == "node"})
            else:
                text = f"no baseline set in {store.path}; set one with `gpufleet baseline set RUN_ID`"
            _print(base, args.json, text)
    return 0


@_store_errors
def cmd_store(args) -> int:
    reports_dir = Path(args.reports_dir or paths.DEFAULT_REPORTS_DIR)
    if not reports_dir.is_dir():
        raise InputError(
            f"reports directory {reports_dir} does not exist; expected the folder holding the run folders "
            f"(--reports-dir, default ./{paths.DEFAULT_REPORTS_DIR})"
        )
    path = _store_path(args)
    if not path.parent.is_dir():
        Store(path).close()  # names the missing folder
    with paths.folder_lock(path.parent):  # not while a run repairs it
        damage = None
        if os.path.lexists(path):
            try:
                Store(path, check=True).close()
            except DamagedStore as exc:
                damage = exc
        summary = repair(path, reports_dir, damage, by="gpufleet store rebuild")
    moved = (summary["repair"] or {}).get("moved_aside")
    text = [f"store {summary['store']} rebuilt from {summary['reports_dir']}: {len(summary['runs'])} run(s)"]
    if moved:
        text.append(
            f"  moved aside: {moved} ({f'not a gpufleet store: {damage.cause}' if damage else 'left of a removed store'})"
        )
    text += [
        f"  unreadable: run {u['run_id']}, {u.get('host') or u['file']}: {u['reason']}" for u in summary["unreadable"]
    ]
    text += [f"  missing: run {m['run_id']}, {m['host']}: no host document" for m in summary["missing"]]
    text.append(f"baseline: {summary['baseline'] or 'none'}")
    if summary["baseline_problem"]:  # the rebuild stands; the baseline it could not take is named
        print(f"gpufleet store: warning: {summary['baseline_problem']}", file=sys.stderr)
    _print(summary, args.json, "\n".join(text))
    return 0


# ---------------------------------------------------------------- versions


def run_versions(run_dir: Path, hosts: list[str] | None, peers: list[str] | None = None) -> dict:
    """The software and firmware table of RUN_DIR/hosts/*.json (those of `hosts` when given), and the nodes the NCCL
    run across nodes must leave out: {"table", "left_out": {host: {"ready": False, "why"}}, "unreadable": {host: why}}.
    A host without a readable document is named under unreadable and judged by nobody. The known-good `peers`
    that join the run count in the majority with their latest documents in the run's store (in a replacement's
    run, the one node of the run is held against them); they are never left out."""
    folder = run_dir / "hosts"
    if not folder.is_dir():
        raise InputError(f"{folder} does not exist; expected the run folder of a run whose node stage wrote documents")
    names = hosts if hosts is not None else sorted(p.stem for p in folder.glob("*.json"))
    by_host, unreadable = {}, {}
    for host in names:
        paths.safe_name(host, "a host name of --hosts")
        raw, why = paths.read_bytes(folder / f"{host}.json")
        doc, why = schema.parse_host_doc(raw) if raw is not None else (None, why)
        if doc is None or not isinstance(doc.get("versions"), dict):
            unreadable[host] = f"{folder / host}.json {why or 'has no versions'}"
        else:
            by_host[host] = doc["versions"]
    peer_by_host: dict[str, dict] = {}
    if peers:
        store_path = default_path(run_dir.parent)
        try:
            with Store(store_path, create=False) as store:
                peer_by_host, missing = versions.peer_versions(store, peers, runs.run_id_of(run_dir))
        except (InputError, sqlite3.Error) as exc:  # none there, or damaged
            why = problem(store_path, exc) if isinstance(exc, sqlite3.Error) else exc
            missing = {peer: f"its documents could not be looked up: {why}" for peer in peers}
        unreadable.update(missing)
    left_out = {
        host: {"ready": False, "why": f"its NCCL differs from the other nodes': {why}"}
        for host, why in versions.nccl_left_out(by_host, peer_by_host).items()
    }
    return {
        "run_dir": str(run_dir),
        "table": versions.table({**peer_by_host, **by_host}),
        "peers": sorted(peer_by_host),
        "left_out": left_out,
        "unreadable": unreadable,
    }


def versions_text(out: dict) -> str:
    lines = [f"software and firmware of {', '.join(out['table']['hosts']) or 'no node'} ({out['run_dir']})"]
    for row in out["table"]["rows"]:
        if row["differs"]:
            named = "; ".join(f"{d['host']} {d['value']}" for d in row["differs"])
            lines.append(f"  {row['label']}: {row['majority'] or 'no majority'}; differs: {named}")
        else:
            lines.append(f"  {row['label']}: {row['majority']}")
    lines += [f"left out of the NCCL run across nodes: {host}: {v['why']}" for host, v in out["left_out"].items()]
    lines += [f"not read: {host}: {why}" for host, why in out["unreadable"].items()]
    return "\n".join(lines)


def cmd_versions(args) -> int:
    hosts = [h for h in args.hosts.split(",") if h] if args.hosts is not None else None
    peers = [h for h in (args.peers or "").split(",") if h]
    out = run_versions(Path(args.run_dir), hosts, peers)
    _print(out, args.json, versions_text(out))
    return 0


# ---------------------------------------------------------------- parsers


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="the store (default: REPORTS_DIR/gpufleet.db)")
    p.add_argument("--reports-dir", help=f"the folder of the run folders (default: ./{paths.DEFAULT_REPORTS_DIR})")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_slurm(args) -> int:
    names = slurm.names_arg(args.slurm_name)
    store = default_path(Path(args.run_dir).resolve().parent)
    if store.exists() and not args.check:  # a writer checks every page first: a damaged store is said before acting
        Store(store, check=True).close()
    if args.take_over:
        record = fleet_slurm.take_over(
            Path(args.run_dir), runs.run_id_of(args.run_dir), args.take_over, names=names, check=args.check
        )
    else:
        record = fleet_slurm.act(Path(args.run_dir), args.action, args.max_drain, names=names, check=args.check)
    lines = fleet_slurm.summary_lines(record)
    if store.exists() and not args.check:  # what it did counts in the fleet's costs (fleet/service_log.py)
        try:
            with Store(store) as opened:
                opened.index_events(Path(args.run_dir))
        except (InputError, sqlite3.Error) as exc:  # slurm.json keeps it; the next report indexes it
            print(
                f"gpufleet slurm: {args.run_dir}/slurm.json is written, but indexing it into {store} failed: {exc}",
                file=sys.stderr,
            )
    _print({**record, "summary": lines}, args.json, "\n".join(lines))
    return 0 if record["ok"] else 1


# ---------------------------------------------------------------- references


def cmd_references(args) -> int:
    done = references.write_for_run(Path(args.run_dir), args.host, Path(args.db) if args.db else None, args.baseline)
    print(json.dumps(done, sort_keys=True))
    return 0


def add_parsers(sub) -> None:
    """Register record, history, baseline, store, versions, slurm and references on the engine's subcommands."""
    r = sub.add_parser(
        "record", help="on the controller: add a host document (stdin) to RUN_DIR/hosts/HOST.json and the store"
    )
    r.add_argument("run_dir", help="the run's folder (<reports_dir>/<run_id>)")
    r.add_argument("host", help="the inventory host name: the document is hosts/HOST.json")
    r.add_argument(
        "--replace-group",
        action="append",
        help="merge: replace this group's results in the existing document "
        "with the new ones, keep the rest (repeatable); without it the document is written whole",
    )
    r.add_argument(
        "--folder",
        default="hosts",
        choices=list(FOLDERS),
        help="hosts (the run's nodes) or peers (known-good nodes that only joined its run across nodes)",
    )
    r.add_argument("--db", help="the store (default: RUN_DIR/../gpufleet.db)")
    r.add_argument("--no-store", action="store_true", help="write the document only; do not index it")
    r.add_argument(
        "--controller",
        help="JSON of the run's controller (run start's): the document is refused when "
        "that ansible-playbook is gone, as it comes from what a stopped run left behind",
    )
    r.set_defaults(func=cmd_record)

    h = sub.add_parser(
        "history", help="a node's, a GPU's or a serial's figures and verdicts over the runs of the store"
    )
    h.add_argument("key", help="an inventory host name, a GPU UUID (GPU-...) or a GPU serial")
    _where(h)
    h.set_defaults(func=cmd_history)

    b = sub.add_parser("baseline", help="the run every later run is compared with: set RUN_ID, show, clear")
    bsub = b.add_subparsers(dest="action", required=True)
    bs = bsub.add_parser("set", help="make RUN_ID the fleet's baseline")
    bs.add_argument("run_id")
    _where(bs)
    for name, what in (("show", "the current baseline"), ("clear", "no baseline from now on")):
        _where(bsub.add_parser(name, help=what))
    b.set_defaults(func=cmd_baseline)

    s = sub.add_parser("store", help="the store of every run: rebuild it from the run folders")
    ssub = s.add_subparsers(dest="action", required=True)
    _where(
        ssub.add_parser("rebuild", help="recreate the store from REPORTS_DIR/<run>/ (run.json, hosts/, report.json)")
    )
    s.set_defaults(func=cmd_store)

    v = sub.add_parser(
        "versions",
        help="the software and firmware of a run's nodes (hosts/*.json), and which nodes "
        "differ in NCCL or its net plugin",
    )
    v.add_argument("run_dir", help="the run's folder (<reports_dir>/<run_id>)")
    v.add_argument("--hosts", help="comma-separated inventory host names (default: every document in RUN_DIR/hosts)")
    v.add_argument(
        "--peers",
        help="comma-separated known-good nodes that join the NCCL run across nodes: their latest "
        "documents in the store count in the majority",
    )
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(func=cmd_versions)

    sl = sub.add_parser(
        "slurm",
        help="act on RUN_DIR/report.json in Slurm: drain the nodes not accepted, resume those "
        "gpufleet drained that pass now (slurm.json in the run folder keeps what was done)",
    )
    sl.add_argument(
        "run_dir",
        help="the run's folder, holding report.json (`gpufleet slurm sweep --help`: idle nodes swept as Slurm jobs)",
    )
    sl.add_argument(
        "--action", default="none", help=f"gpufleet_slurm_action: {', '.join(fleet_slurm.ACTIONS)} (default none)"
    )
    sl.add_argument(
        "--max-drain",
        default=fleet_slurm.DEFAULT_MAX_DRAIN,
        help="gpufleet_slurm_max_drain: at most this "
        "many nodes (N) or percent of a partition (N%%) drained by one run (default %(default)s)",
    )
    sl.add_argument("--check", action="store_true", help="change nothing; say what would be done")
    sl.add_argument(
        "--take-over",
        action="append",
        metavar="HOST",
        help="before an acceptance run: drain this "
        "inventory host's Slurm node with a gpufleet reason whatever drained it before, so the action after the report resumes it "
        "when accepted (repeatable; gpufleet fleet accept --slurm)",
    )
    sl.add_argument(
        "--slurm-name",
        action="append",
        help="HOST=NAME: the Slurm node name of an inventory host (default: run.json's, else the inventory name)",
    )
    sl.add_argument("--json", action="store_true", help="print the record as JSON")
    sl.set_defaults(func=cmd_slurm)

    rf = sub.add_parser(
        "references",
        help="before the nodes' stage: RUN_DIR/references/HOST.json, what each node's figures are held against "
        "(its baseline figures, its GPUs' past, the baseline's fleet medians), so that it measures again one past them",
    )
    rf.add_argument("run_dir", help="the run's folder (<reports_dir>/<run_id>)")
    rf.add_argument("--host", action="append", required=True, help="a node of the run (repeatable)")
    rf.add_argument("--db", help="the store (default: RUN_DIR/../gpufleet.db)")
    rf.add_argument("--baseline", help="the baseline run (default: run.json's, else the store's)")
    rf.set_defaults(func=cmd_references)
