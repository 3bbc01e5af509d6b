"""The report's build: the run's nodes, the fleet layer's results added, each output of registry.OUTPUTS written
(fleet.json, prometheus/<host>.prom, drain.txt, report.json, report.md, report.html, junit.xml), the run indexed
into the store."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import operator
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from gpufleet import __version__
from gpufleet.base import causes, certificates, paths, registry, runs, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import compare, store as fleet_store
from gpufleet.comparisons import metrics
from gpufleet.fleet.references import choose_baseline
from gpufleet.fleet.repair import open_for_run, use_for_run
from gpufleet.fleet.run_files import read_run_info
from gpufleet.report.drain import review as drain_review_of
from gpufleet.report.chart_data import BAR_METRICS
from gpufleet.report.formatting import STATUS_ORDER, check_id, class_text, trust_text
from gpufleet.report.nodes import DOC_PROFILE, DOC_READ, load_nodes, load_peers, node_order

# Each output the report writes (registry.report_outputs()): its file (or folder) under the run folder.
REPORT_FILES = {o.name: o.file for o in registry.report_outputs()}
OWN_LINE = ("html", "fleet", "prometheus", "drain")  # summary_text's outputs on lines of their own
# A node's verdict in words: "fail" is also what results are counted by, and a node fails for errors too.
VERDICT_WORDS = {schema.FAIL: "not accepted", schema.WARN: "accepted with warnings", schema.PASS: "accepted"}


def _refresh(node: dict) -> dict:
    """Verdict and counts again, after results were added (the fleet layer's); the class of each result that did
    not pass and the trust of each benchmark figure, beside the results (which stay as they came)."""
    node["verdict"] = schema.verdict(node["results"])
    node["counts"] = {s: sum(1 for r in node["results"] if r["status"] == s) for s in STATUS_ORDER}
    node["not_passing"] = [
        {"check": check_id(r), "status": r["status"], "class": class_text(r)} for r in node["results"] if class_text(r)
    ]
    node["figures"] = [
        {"check": check_id(r), "value": r.get("value"), "unit": r.get("unit"), "trust": trust_text(r)}
        for r in node["results"]
        if trust_text(r)
    ]
    node["causes"] = causes.grouped(node["results"])
    return node


def assemble(run_dir: Path, nodes: list[dict]) -> dict:
    """The report.json document."""
    verdict = schema.worst((n["verdict"] for n in nodes), default=schema.PASS)
    counts = {s: sum(n["counts"][s] for n in nodes) for s in STATUS_ORDER}
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": runs.run_id_of(run_dir),
        "run_dir": str(run_dir),
        "generated": schema.utc_now(),
        "report_engine_version": __version__,
        "verdict": verdict,
        "nodes_by_verdict": {
            s: sum(1 for n in nodes if n["verdict"] == s) for s in (schema.FAIL, schema.WARN, schema.PASS)
        },
        "counts": counts,
        "nodes": {n["host"]: n for n in nodes},  # insertion order: worst verdict first
    }


def _write(path: Path, text: str) -> None:
    # Write beside and rename, so a reader never sees half a report; mode 0640 like every controller file.
    paths.write_atomic(path, text)


def summarize(report: dict, files: dict) -> dict:
    nodes = {}
    for host, node in report["nodes"].items():
        nodes[host] = {
            "verdict": node["verdict"],
            "counts": node["counts"],
            "failed_checks": [check_id(r) for r in node["results"] if r["status"] in (schema.FAIL, schema.ERROR)],
            "warned_checks": [check_id(r) for r in node["results"] if r["status"] == schema.WARN],
            "causes": [causes.line(g) for g in node["causes"]],
        }
        if (node.get("certificate") or {}).get("certified"):
            nodes[host]["certificate"] = node["certificate"]["text"]
    fleet = report.get("fleet") or {}
    return {
        "run_dir": report["run_dir"],
        "run_id": report["run_id"],
        "verdict": report["verdict"],
        "nodes": nodes,
        "not_accepted": not_accepted_text(nodes),
        "files": files,
        "store": fleet.get("store"),
        "store_note": fleet.get("store_note"),
        "store_problems": fleet.get("store_problems") or [],
        "baseline": (fleet.get("baseline") or {}).get("run_id"),
        "drain": fleet.get("drain") or [],
        "prometheus": fleet.get("prometheus") or {},
        "prometheus_note": fleet.get("prometheus_note"),
        "peers_unreadable": [
            r["reason"]
            for p in (report.get("peers") or {}).values()
            for r in p["results"]
            if r["check"] == "results_file"
        ],
    }


def not_accepted_text(nodes: dict, max_causes: int = 3) -> str:
    """The nodes not accepted and why, each cause once (causes.line): `n1, n2: cause (N checks: ...); cause | n3:
    ...`, the nodes that failed for the same causes named together; what the playbook's failure message says."""
    by_why: dict[str, list[str]] = {}
    for host, node in nodes.items():
        if node["verdict"] == schema.FAIL:
            why = node["causes"][:max_causes]
            more = len(node["causes"]) - len(why)
            text = "; ".join(why) + (f"; and {more} more cause(s)" if more > 0 else "") if why else "no failing check"
            by_why.setdefault(text, []).append(host)
    return " | ".join(f"{', '.join(hosts)}: {why}" for why, hosts in by_why.items())


def _open_store(run_dir: Path, db: Path | str | None, use_store: bool):
    """(Store or None, why there is none). The default store (<run_dir>/../gpufleet.db) is created when it can be;
    when it cannot, the report goes on without history. A store named with --db must open."""
    if not use_store:
        return None, "no store: the report was made with --no-store, so there is no history or baseline to compare with"
    if db is not None:
        return open_for_run(Path(db), run_dir, check=True), None
    path = fleet_store.default_path(run_dir.resolve().parent)
    try:
        return open_for_run(path, run_dir, check=True), None
    except InputError as exc:
        return None, f"no store: {exc}"


def _index_left_out(store, run_dir: Path, run_id: str) -> list[str]:
    """Earlier runs of the reports folder the store missed (their indexing failed: a full disk), indexed now; what
    the report says of them."""
    try:
        caught_up = store.index_left_out(run_dir.resolve().parent, but=run_id)
    except (InputError, sqlite3.Error) as exc:
        return [f"the runs of {run_dir.resolve().parent} the store lacks could not be indexed: {exc}"]
    return [f"run {r} was not in the store {store.path} (its indexing had failed): indexed now" for r in caught_up]


@dataclass
class Made:
    """What an output that writes itself is given (registry.Output.write): the run folder, the finished report, the
    fleet layer's results, and where node_exporter reads its files and the inventory's nodes (write_prometheus)."""

    run_dir: Path
    report: dict
    fleet: dict
    textfile_dir: Path | str | None = None
    fleet_hosts: list[str] | None = None

    def path(self, name: str) -> Path:
        """The file (or folder) of the output `name`, as registry.OUTPUTS declares it."""
        return self.run_dir / REPORT_FILES[name]


def write_fleet(made: Made) -> None:
    """fleet.json (_fleet_document). No indent: that would take json's pure-Python encoder, several times slower on
    a fleet's tens of megabytes; NaN and infinity from a benchmark stay as Python writes them."""
    doc = _fleet_document(made.report, made.fleet, made.report["fleet"]["drain"])
    _write(made.path("fleet"), json.dumps(doc, default=str) + "\n")


def _fleet_document(report: dict, fleet: dict, drain: list[str]) -> dict:
    """The fleet layer's inputs (each node's metrics, GPUs and sample spreads; the fleet's and the baseline's
    medians; the view, the versions) and each node's fleet checks by status. The fleet results themselves are in
    report.json, with the node's other results (group fleet): a fleet's worth of evidence is written once."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": report["run_id"],
        "generated": report["generated"],
        "store": report["fleet"]["store"],
        "store_note": report["fleet"]["store_note"],
        "store_problems": report["fleet"]["store_problems"],
        "baseline": fleet["baseline"],
        "nodes": {
            host: {
                "verdict": report["nodes"][host]["verdict"],
                "fleet_checks": {r["check"]: r["status"] for r in results},
                **{k: fleet["metrics"][host][k] for k in ("gpus", "metrics", "spreads", "cpu")},
            }
            for host, results in fleet["results"].items()
        },
        "fleet_medians": fleet["fleet_medians"],
        "baseline_medians": fleet["baseline_medians"],
        "view": fleet["view"],
        "versions": fleet["versions"],
        "drain": drain,
    }


def build(
    run_dir: Path,
    expected_hosts: list[str] | None = None,
    *,
    db: Path | str | None = None,
    use_store: bool = True,
    baseline: str | None = None,
    slurm_names: dict | None = None,
    textfile_dir: Path | str | None = None,
    fleet_hosts: list[str] | None = None,
) -> dict:
    """Read RUN_DIR/hosts/*.json, add the fleet layer, write the reports, return the summary.

    The fleet layer: the run's documents are indexed into the store (`db`, default <run_dir>/../gpufleet.db,
    none with use_store False), each node gets the results of group `fleet` (gpufleet.fleet.compare: against
    its GPUs' median, the fleet, the baseline, its counters' growth, GPUs that failed before), which count in its
    verdict; fleet.json, prometheus/<host>.prom and drain.txt are written beside the reports, and the verdicts
    are recorded in the store. `slurm_names` maps inventory names to Slurm node names (default: the same;
    run.json's "slurm_node_names" when it has them). `textfile_dir` and `fleet_hosts`: the Prometheus files also
    where node_exporter reads them (export.write_prometheus).

    Raises InputError when RUN_DIR is missing, not a directory, has no hosts/
    folder (or an empty one with no expected hosts), or cannot be written,
    and for a store named by `db` or a baseline that cannot be used.
    """
    # A fleet's documents are millions of small objects without cycles: the cyclic garbage collector went through
    # them again and again (about a tenth of the report of 1024 nodes) and had nothing to free.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(Path(run_dir), expected_hosts, db, use_store, baseline, slurm_names, textfile_dir, fleet_hosts)
    finally:
        if collecting:
            gc.enable()


def _build(
    run_dir: Path,
    expected_hosts: list[str] | None,
    db: Path | str | None,
    use_store: bool,
    baseline: str | None,
    slurm_names: dict | None,
    textfile_dir: Path | str | None = None,
    fleet_hosts: list[str] | None = None,
) -> dict:
    run_dir = Path(run_dir)
    if textfile_dir is not None and not Path(textfile_dir).is_dir():  # said before anything is written
        raise InputError(
            f"gpufleet_prometheus_textfile_dir {textfile_dir} is not a folder; expected node_exporter's "
            "--collector.textfile.directory on the controller"
        )
    nodes = load_nodes(run_dir, expected_hosts)
    run_id = runs.run_id_of(run_dir)
    # Each document is read, parsed and its metrics extracted once: the store's indexing and the fleet judgement
    # take them from here. The judgement reads a node's results, the store its readable ones: the same list
    # unless a result was malformed.
    read = {n["source"]: n.pop(DOC_READ) for n in nodes if DOC_READ in n}
    extracted = {}
    for node in nodes:
        known = read.get(node["source"])
        if known is not None and known["doc"] is not None:
            known["metrics"] = metrics.extract(known["valid"])
            if len(known["valid"]) == len(node["results"]) and all(map(operator.is_, known["valid"], node["results"])):
                extracted[node["host"]] = known["metrics"]
    store, store_note = _open_store(run_dir, db, use_store)
    index = functools.partial(fleet_store.Store.index_run, run_dir=run_dir, expected_hosts=expected_hosts, read=read)
    indexed: dict = {}
    try:
        if store is not None:
            try:  # a store found damaged here is repaired, and this run indexed into the new one
                store, indexed = use_for_run(store, run_dir, index)
            except (InputError, sqlite3.Error) as exc:  # locked past its timeout, a full disk: the report still comes
                store.close()
                store, store_note = (
                    None,
                    f"no store: {store.path} could not be written ({exc}); history and baseline comparisons skip",
                )
        # What happened to the store since the run started (moved aside, rebuilt): the report says so.
        store_problems = (
            [r["note"] for r in store.repairs_since(read_run_info(run_dir).get("started"))] if store else []
        )
        if store is not None:
            store_problems += _index_left_out(store, run_dir, run_id)
        store_problems += [  # an action record that could not be read: named, what the store held of it kept
            f"{run_dir / u['file']} could not be indexed: {u['reason']}; the store keeps what it held of it: restore "
            f"the file, or move it aside"
            for u in indexed.get("unreadable") or []
            if "host" not in u
        ]
        chosen = choose_baseline(run_dir, store, baseline)
        readable = {
            n["host"]: {"results": n["results"], "profile": n[DOC_PROFILE], "versions": n["versions"]}
            for n in nodes
            if DOC_PROFILE in n
        }
        del read, index  # the raw documents, no longer needed
        with store.reading() if store is not None else contextlib.nullcontext():
            fleet = compare.evaluate(
                run_id, readable, store=store, store_note=store_note, baseline=chosen, extracted=extracted
            )
        for node in nodes:
            node.pop(DOC_PROFILE, None)
            node["results"] = fleet["node_results"].get(node["host"], node["results"]) + fleet["results"].get(
                node["host"], []
            )
            if node["host"] in fleet["metrics"]:  # the per-GPU bars' figures, extracted once (report/chart_data.py)
                node["per_gpu"] = [m for m in fleet["metrics"][node["host"]]["metrics"] if m["key"] in BAR_METRICS]
            _refresh(node)
        # Each node's latest certificate as the reports folder's index has it (unverified): one expired is said so.
        claims = certificates.latest(run_dir.resolve().parent)
        for node in nodes:
            node["certificate"] = certificates.state(claims.get(node["host"]))
        report = assemble(run_dir, sorted(nodes, key=node_order))
        info = read_run_info(run_dir)
        names = slurm_names if slurm_names is not None else info.get("slurm_node_names")
        # Only a node with a confirmed failure is proposed for draining; the others are named beside it.
        drain, drain_review = drain_review_of(report, names if isinstance(names, dict) else None)
        report["fleet"] = {
            "store": str(store.path) if store is not None else None,
            "store_note": store_note,
            "store_problems": store_problems,
            "baseline": fleet["baseline"],
            "fleet_medians": fleet["fleet_medians"],
            "baseline_medians": fleet["baseline_medians"],
            "view": fleet["view"],
            "versions": fleet["versions"],
            "drain": drain,
            "drain_review": drain_review,
        }
        # The peers' own figures of the run across nodes, beside the new node's (not part of any verdict).
        report["peers"] = load_peers(run_dir)
        attempts = info.get("attempts")
        last = attempts[-1] if isinstance(attempts, list) and attempts and isinstance(attempts[-1], dict) else {}
        if last.get("locks_not_given_back"):
            report["locks_not_given_back"] = last["locks_not_given_back"]
        files = {name: str(run_dir / file) for name, file in REPORT_FILES.items()}
        made = Made(run_dir, report, fleet, textfile_dir, fleet_hosts)
        for output in registry.report_outputs():
            if output.render:
                _write(made.path(output.name), registry.resolve(output.render)(report))
            else:
                registry.resolve(output.write)(made)
        if store is not None:
            try:
                store.record_fleet(run_id, fleet["results"])
                store.record_verdicts(
                    run_id,
                    report["verdict"],
                    {h: n["verdict"] for h, n in report["nodes"].items()},
                    report["generated"],
                )
            except (InputError, sqlite3.Error) as exc:
                report["fleet"]["store_note"] = (
                    f"the verdicts could not be recorded in {store.path} ({exc}); "
                    "`gpufleet store rebuild` records them from the run folders"
                )
    finally:
        if store is not None:
            store.close()
    return summarize(report, files)


def summary_text(summary: dict) -> str:
    """A few lines for the terminal: the fleet verdict, one line per node, where the reports are."""
    nodes = summary["nodes"]
    width = max((len(h) for h in nodes), default=4)
    by = {s: sum(1 for n in nodes.values() if n["verdict"] == s) for s in (schema.FAIL, schema.WARN, schema.PASS)}
    tally = ", ".join(f"{by[s]} {VERDICT_WORDS[s]}" for s in by if by[s])
    lines = [f"fleet verdict: {summary['verdict'].upper()} ({len(nodes)} node(s): {tally})"]
    for host, n in nodes.items():
        line = f"  {host:<{width}}  {n['verdict'].upper():<4}"
        if n.get("causes"):
            line += "  failing: " + "; ".join(n["causes"])
        if n.get("warned_checks"):
            line += ("; " if n.get("causes") else "  ") + "warning: " + ", ".join(n["warned_checks"])
        if " expired on " in (n.get("certificate") or ""):
            line += f"; its {n['certificate']}"
        lines.append(line.rstrip())
    files = summary["files"]
    lines.append(f"report: {files['html']}")
    lines.append("        " + ", ".join(path for name, path in files.items() if name not in OWN_LINE))
    if files.get("fleet"):
        prom = f", {files['prometheus']}/<node>.prom" if summary.get("prometheus") else ""
        lines.append(f"fleet:  {files['fleet']}{prom}")
    if summary.get("drain"):
        lines.append(f"drain:  {files['drain']} ({len(summary['drain'])} node(s) to drain in Slurm)")
    if summary.get("store"):
        base = f"; compared with baseline {summary['baseline']}" if summary.get("baseline") else "; no baseline set"
        lines.append(f"store:  {summary['store']}{base}")
    elif summary.get("store_note"):
        lines.append(summary["store_note"])
    lines += [f"store problem: {p}" for p in summary.get("store_problems") or []]
    lines += [f"peer not shown: {p}" for p in summary.get("peers_unreadable") or []]
    if summary.get("prometheus_note"):
        lines.append(summary["prometheus_note"])
    return "\n".join(lines)
