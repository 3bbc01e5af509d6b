"""Aggregate per-host result documents into one fleet report.

    RUN_DIR/hosts/<host>.json   one host document per host (engine.check_host(),
                                or the playbook's minimal document for a host
                                that could not be checked)

build() reads them all and writes, beside hosts/:

    report.json   every result of every host, unchanged, with a verdict per node
    report.md     node table (failures first), the fleet view and drain lines, then each node's findings
    report.html   the same, self-contained (inline CSS, no scripts, no external assets)
    junit.xml     one testsuite per node, one testcase per check
    fleet.json    the fleet layer's results per node (group fleet), its metrics and medians
    prometheus/<host>.prom, drain.txt   (gpufleet.fleet.export)

The fleet layer (gpufleet.fleet) adds results of group `fleet` to every node whose document could be read,
and they count in its verdict; the run is indexed into the store (gpufleet.db beside the run folder).

A node is named by its file name (the inventory name the playbook writes), so
`--expect-host` matches even when the node reports a different hostname.
A file that cannot be read, or an expected host without a file, becomes a node
with one `error` result: it never passes and never vanishes.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

from gpufleet import __version__, failure_class, paths, schema
from gpufleet.errors import InputError

REPORT_FILES = {"json": "report.json", "md": "report.md", "html": "report.html", "junit": "junit.xml"}
FLEET_FILE, DRAIN_FILE, PROMETHEUS_DIR = "fleet.json", "drain.txt", "prometheus"

# Worst first: the column order of count tables and the order findings are listed in.
STATUS_ORDER = sorted(schema.STATUSES, key=schema.severity, reverse=True)

NEVER_REPORTED = "no results: the host never reported (unreachable or the play was interrupted)"
_DOC_PROFILE = "_document_profile"  # a node's host document profile (name, thresholds), kept off report.json
REPORT_GROUP = "report"  # group of the error results the report itself makes


# ---------------------------------------------------------------- reading


def _report_error(check: str, reason: str, remedy: str, detail: dict) -> dict:
    return dict(schema.result(check, schema.ERROR, reason, group=REPORT_GROUP, remedy=remedy, detail=detail))


def _unreadable(rel: str, why: str, detail: dict | None = None) -> dict:
    return _report_error(
        "results_file",
        f"results file {rel} is unreadable: {why}",
        f"look at {rel} on the controller; re-run validate.yml --limit for this host to write it again",
        {"file": rel, **(detail or {})},
    )


def _result_problem(res: Any) -> str | None:
    """Why one entry of `results` cannot be reported as it is, or None when it can."""
    if not isinstance(res, dict):
        return f"expected an object, got {type(res).__name__}"
    if not isinstance(res.get("check"), str) or not res["check"]:
        return "missing 'check' (a non-empty string)"
    if res.get("status") not in schema.STATUSES:
        return f"'status' is {res.get('status')!r}; expected one of {', '.join(schema.STATUSES)}"
    return None


def result_problem(res: Any) -> str | None:
    """Why one entry of `results` cannot be reported or indexed as it is, or None when it can."""
    return _result_problem(res)


def parse_host_doc(raw: bytes) -> tuple[dict | None, str | None]:
    """(host document, None) or (None, why it is unreadable), from a file's bytes."""
    return _parse_host_doc("", raw)


def _parse_host_doc(rel: str, raw: bytes) -> tuple[dict | None, str | None]:
    """(document, None) or (None, why it is unreadable)."""
    if not raw.strip():
        return None, "the file is empty (the write was probably interrupted)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start})"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    if not isinstance(doc, dict):
        return None, f"expected a JSON object (a host document), got {type(doc).__name__}"
    missing = [k for k in ("schema_version", "host", "results") if k not in doc]
    if missing:
        return None, f"missing required key(s) {', '.join(missing)}; expected a host document with schema_version, host and results"
    if doc["schema_version"] != schema.SCHEMA_VERSION:
        return None, f"schema_version is {doc['schema_version']!r}; this report reads version {schema.SCHEMA_VERSION}"
    if not isinstance(doc["host"], str) or not doc["host"]:
        return None, "'host' must be a non-empty string"
    if not isinstance(doc["results"], list):
        return None, f"'results' must be a list of results, got {type(doc['results']).__name__}"
    return doc, None


def _node(name: str, source: str | None, results: list[dict], doc: dict | None = None) -> dict:
    doc = doc or {}
    profile = doc.get("profile")
    node = {
        "host": name,
        "verdict": schema.verdict(results),
        "counts": {s: sum(1 for r in results if r["status"] == s) for s in STATUS_ORDER},
        "profile": profile.get("name") if isinstance(profile, dict) else profile,
        "versions": doc.get("versions") if isinstance(doc.get("versions"), dict) else {},
        "engine_version": doc.get("engine_version"),
        "started": doc.get("started"),
        "seconds": doc.get("seconds"),
        "source": source,
        "results": results,
    }
    if doc.get("host") and doc["host"] != name:
        node["reported_host"] = doc["host"]  # the node's own hostname differs from its inventory name
    if doc:
        node[_DOC_PROFILE] = profile  # for the fleet layer's thresholds; not written to report.json
    return node


def _refresh(node: dict) -> dict:
    """Verdict and counts again, after results were added (the fleet layer's); the class of each result that did
    not pass and the trust of each benchmark figure, beside the results (which stay as they came)."""
    node["verdict"] = schema.verdict(node["results"])
    node["counts"] = {s: sum(1 for r in node["results"] if r["status"] == s) for s in STATUS_ORDER}
    node["not_passing"] = [{"check": check_id(r), "status": r["status"], "class": class_text(r)}
                           for r in node["results"] if class_text(r)]
    node["figures"] = [{"check": check_id(r), "value": r.get("value"), "unit": r.get("unit"), "trust": trust_text(r)}
                       for r in node["results"] if trust_text(r)]
    return node


def read_host_file(path: Path, run_dir: Path) -> dict:
    """One node from one hosts/*.json file; never raises for bad content."""
    rel = str(path.relative_to(run_dir))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return _node(path.stem, rel, [_unreadable(rel, exc.strerror or str(exc))])
    doc, why = _parse_host_doc(rel, raw)
    if doc is None:
        # The first bytes show at a glance whether it was cut short or is something else entirely.
        return _node(path.stem, rel, [_unreadable(rel, why, {"head": raw[:400].decode("utf-8", "replace")})])
    results = []
    for i, res in enumerate(doc["results"]):
        problem = _result_problem(res)
        if problem is None:
            results.append(res)  # unchanged: nothing measured is lost or rewritten
        else:
            # Keep the entry as it was, inside the error that explains it.
            results.append(
                _report_error(
                    "malformed_result",
                    f"results file {rel}: result #{i} cannot be read: {problem}",
                    "fix the check or module that wrote it; the entry is kept as it was in detail.raw",
                    {"file": rel, "index": i, "problem": problem, "raw": res},
                )
            )
    if not results:
        results.append(
            _report_error(
                "results_file",
                f"results file {rel} holds no results",
                "re-run validate.yml --limit for this host",
                {"file": rel},
            )
        )
    return _node(path.stem, rel, results, doc)


def _natural_key(name: str) -> list:
    """node2 before node10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _node_order(node: dict) -> tuple:
    return (-schema.severity(node["verdict"]), _natural_key(node["host"]))


def load_nodes(run_dir: Path, expected_hosts: list[str] | None = None) -> list[dict]:
    """Every node of the run, worst verdict first. Raises InputError for an unusable RUN_DIR."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError(f"run directory {run_dir} does not exist; expected a directory holding hosts/<host>.json")
    if not run_dir.is_dir():
        raise InputError(f"run directory {run_dir} is not a directory; expected a directory holding hosts/<host>.json")
    hosts_dir = run_dir / "hosts"
    if not hosts_dir.is_dir():
        raise InputError(f"run directory {run_dir} has no hosts/ folder; expected {hosts_dir}/<host>.json per checked host")
    try:
        # Dot files are partial writes (temporary files of an atomic copy).
        host_files = sorted(p for p in hosts_dir.glob("*.json") if not p.name.startswith("."))
    except OSError as exc:
        raise InputError(f"{hosts_dir} cannot be listed: {exc.strerror}") from None
    nodes = {p.stem: read_host_file(p, run_dir) for p in host_files}
    for host in expected_hosts or []:
        if host not in nodes:
            nodes[host] = _node(
                host,
                None,
                [
                    _report_error(
                        "reported",
                        NEVER_REPORTED,
                        "check that the host is reachable (ssh, inventory address) and re-run validate.yml --limit for it",
                        {"expected_file": f"hosts/{host}.json"},
                    )
                ],
            )
    if not nodes:
        raise InputError(
            f"{hosts_dir} holds no <host>.json files and no host is expected (--expect-host); "
            "expected one host document per checked host"
        )
    return sorted(nodes.values(), key=_node_order)


def load_peers(run_dir: Path) -> dict:
    """peers/<host>.json: known-good nodes that joined the run across nodes without their node stage. Shown beside
    the nodes of the run, never judged: {host: {"source": "peers/<host>.json", "results": [...]}}; an unreadable
    file is one `error` result naming it."""
    folder = Path(run_dir) / "peers"
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(p for p in folder.glob("*.json") if not p.name.startswith(".")):
        node = read_host_file(path, Path(run_dir))
        out[node["host"]] = {"source": node["source"], "results": node["results"]}
    return out


# ---------------------------------------------------------------- formatting shared by the renderers


def check_id(res: dict) -> str:
    """`<group>.<check>`, the name a check goes by in every report."""
    return f"{res['group']}.{res['check']}" if res.get("group") else res["check"]


def ordered_results(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(not passing, worst first; passing), each in the order the checks ran."""
    bad = sorted((r for r in results if r["status"] != schema.PASS), key=lambda r: -schema.severity(r["status"]))
    return bad, [r for r in results if r["status"] == schema.PASS]


TRUST_NOT_RECORDED = "not recorded"  # a benchmark figure of a document made before results carried `trust`


def trust_text(res: dict) -> str:
    """How far a result's performance figure can be trusted (clean, confirmed, disturbed, inconclusive), "not
    recorded" for a benchmark figure without `trust` (older documents), "" for a result that is no such figure."""
    if res.get("trust") is not None:
        return str(res["trust"])
    figure = _finite(res.get("value")) and str(res.get("group") or "").startswith("benchmark")
    return TRUST_NOT_RECORDED if figure else ""


def class_text(res: dict) -> str:
    """The failure class of a result that did not pass (failure_class.of: its own, else its check's default), or ""."""
    return failure_class.of(res) or ""


def kept_locks(report: dict) -> list[str]:
    """The nodes whose locks the run could not give back, each with why (run.json's last attempt)."""
    kept = report.get("locks_not_given_back")
    if isinstance(kept, dict):
        return [f"{host} ({why})" if why else str(host) for host, why in kept.items()]
    return [str(kept)] if kept else []


def fmt_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0 or abs(v) >= 1:
            return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e15 else f"{v:.4g}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(fmt_scalar(x) for x in v)
    return json.dumps(v, sort_keys=True, default=str)


def value_text(res: dict) -> str:
    """The measured value with its unit, or "" when the check measured none."""
    v = res.get("value")
    if v is None:
        return ""
    unit = res.get("unit")
    return f"{fmt_scalar(v)} {unit}" if unit else fmt_scalar(v)


def threshold_text(threshold: Any) -> tuple[str, str]:
    """(what the value is held against, where that number comes from).

    A threshold is {"key", "value", "source", ...}. A benchmark's bound is
    {"key", "value", "min" or "max", "source"} and reads "key: min 700";
    any other field is shown by its own name, so new benchmarks need no
    change here.
    """
    if threshold in (None, {}, ""):
        return "", ""
    if not isinstance(threshold, dict):
        return fmt_scalar(threshold), ""
    extra = {k: v for k, v in threshold.items() if k not in ("key", "value", "source")}
    bounds = [k for k in ("min", "max") if k in extra and extra[k] == threshold.get("value")]
    parts = []
    if bounds:
        # The bound is the key's value: say it once, by what it is ("none set" when the profile has no figure).
        said = []
        for b in bounds:
            v = extra.pop(b)
            said.append("none set" if v is None else f"{b} {fmt_scalar(v)}")
        said = "; ".join(said)
        parts.append(f"{threshold['key']}: {said}" if "key" in threshold else said)
    elif "key" in threshold:
        parts.append(f"{threshold['key']} = {fmt_scalar(threshold.get('value'))}")
    elif "value" in threshold:
        parts.append(fmt_scalar(threshold["value"]))
    sources = [str(threshold.get("source") or "")]
    for k, v in extra.items():
        if isinstance(v, dict) and "value" in v:  # a second threshold inside the first: "key = value", its source too
            parts.append(f"{v.get('key', k)} = {fmt_scalar(v['value'])}")
            sources.append(str(v.get("source") or ""))
        else:
            parts.append(f"{k} {fmt_scalar(v)}")
    return "; ".join(parts), "; ".join(s for s in sources if s)


def busbw_series(results: list[dict]) -> list[dict]:
    """NCCL bus bandwidth curves of one node, one chart each run (group, world size).

    A result counts when its detail has "rows" with size_bytes and busbw_gbps
    (gpufleet.checks.benchmarks.nccl). Returns [{"title", "group", "world_size",
    "nnodes", "backend", "lines": [{"label", "status", "points": [(size_bytes, busbw_gbps), ...]}]}].
    """
    charts: dict = {}
    for res in results:
        detail = res.get("detail")
        rows = detail.get("rows") if isinstance(detail, dict) else None
        if not isinstance(rows, list):
            continue
        points = sorted(
            (r["size_bytes"], float(r["busbw_gbps"]))
            for r in rows
            if isinstance(r, dict) and _finite(r.get("size_bytes")) and r["size_bytes"] > 0 and _finite(r.get("busbw_gbps"))
        )
        if not points:
            continue
        world, nnodes = detail.get("world_size"), detail.get("nnodes")
        key = (res.get("group"), world, nnodes)
        if key not in charts:
            where = f"{world} ranks" if world else "ranks unknown"
            where += f" over {nnodes} nodes" if isinstance(nnodes, int) and nnodes > 1 else " in one node"
            backend = detail.get("backend")
            charts[key] = {
                "title": f"{res.get('group') or 'nccl'}: bus bandwidth, {where}" + (f" ({backend})" if backend else ""),
                "group": res.get("group"),
                "world_size": world,
                "nnodes": nnodes,
                "backend": backend,
                "lines": [],
            }
        label = res["check"][len("nccl_"):] if res["check"].startswith("nccl_") else res["check"]
        charts[key]["lines"].append({"label": label, "status": res["status"], "points": points})
    return list(charts.values())


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fleet_columns(report: dict) -> list[tuple[str, str, str | None]]:
    """(column, title, unit) of the fleet view that at least one node has a figure for."""
    from gpufleet.fleet.compare import VIEW_COLUMNS

    rows = (report.get("fleet") or {}).get("view") or []
    out = []
    for col, title, _ in VIEW_COLUMNS:
        cells = [r["columns"].get(col) for r in rows if r["columns"].get(col)]
        if cells:
            out.append((col, title, cells[0]["unit"]))
    return out


def fleet_cell_parts(cell: dict) -> list[str]:
    """A view cell's figure, then against the fleet median and the baseline: ["791.6", "fleet -2.1% (808.5)", ...]."""
    from gpufleet.fleet import num

    parts = [num(cell["value"])]
    if cell.get("vs_fleet_pct") is not None:
        parts.append(f"fleet {cell['vs_fleet_pct']:+.1f}% ({num(cell['fleet_median'])}, {cell['fleet_n']} nodes)")
    if cell.get("vs_baseline_pct") is not None:
        parts.append(f"baseline {cell['vs_baseline_pct']:+.1f}% ({num(cell['baseline'])})")
    elif cell.get("baseline_fleet_median"):
        pct = (cell["value"] - cell["baseline_fleet_median"]) / cell["baseline_fleet_median"] * 100
        parts.append(f"baseline fleet {pct:+.1f}% ({num(cell['baseline_fleet_median'])})")
    for g in cell.get("gpu_outliers") or []:
        parts.append(f"GPU {g['index'] if g['index'] is not None else '?'} {g['deviation_pct']:+.1f}% vs its node")
    return parts


def fleet_note(report: dict) -> str:
    """One sentence under the fleet view: what the figures are held against."""
    fleet = report.get("fleet") or {}
    base = fleet.get("baseline") or {}
    if base.get("run_id") and not base.get("note"):
        against = f"baseline run {base['run_id']} ({base.get('source')})"
    else:
        against = f"no baseline ({base.get('note') or 'none set'})"
    store = f"store {fleet['store']}" if fleet.get("store") else (fleet.get("store_note") or "no store")
    cpu = any(r.get("cpu") for r in fleet.get("view") or [])
    return (f"Each node's figure (slowest GPU where it is per GPU) against this run's fleet median and {against}; "
            f"{store}. WARN and FAIL mark outliers, which the node's fleet.* results explain."
            + (" CPU run: a logic check, not a performance figure." if cpu else "")
            + "".join(f" Store problem during this run: {p}." for p in fleet.get("store_problems") or []))


def node_versions_text(node: dict) -> str:
    v = node.get("versions") or {}
    names = (("driver", "driver"), ("cuda_driver", "CUDA"), ("kernel", "kernel"), ("os", "OS"), ("engine", "engine"))
    return ", ".join(f"{label} {v[k]}" for k, label in names if v.get(k))


def fleet_line(report: dict) -> str:
    by = report["nodes_by_verdict"]
    n = sum(by.values())
    parts = ", ".join(f"{by[s]} {s}" for s in (schema.FAIL, schema.WARN, schema.PASS) if by.get(s))
    if report["verdict"] == schema.FAIL:
        return f"{by[schema.FAIL]} of {n} node(s) failed acceptance ({parts})"
    return f"all {n} node(s) accepted ({parts})"


# ---------------------------------------------------------------- assembling and writing


def assemble(run_dir: Path, nodes: list[dict]) -> dict:
    """The report.json document."""
    verdict = schema.worst((n["verdict"] for n in nodes), default=schema.PASS)
    counts = {s: sum(n["counts"][s] for n in nodes) for s in STATUS_ORDER}
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": Path(run_dir).resolve().name,
        "run_dir": str(run_dir),
        "generated": schema.utc_now(),
        "report_engine_version": __version__,
        "verdict": verdict,
        "nodes_by_verdict": {s: sum(1 for n in nodes if n["verdict"] == s) for s in (schema.FAIL, schema.WARN, schema.PASS)},
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
        }
    fleet = report.get("fleet") or {}
    return {
        "run_dir": report["run_dir"],
        "run_id": report["run_id"],
        "verdict": report["verdict"],
        "nodes": nodes,
        "files": files,
        "store": fleet.get("store"),
        "store_note": fleet.get("store_note"),
        "store_problems": fleet.get("store_problems") or [],
        "baseline": (fleet.get("baseline") or {}).get("run_id"),
        "drain": fleet.get("drain") or [],
        "prometheus": fleet.get("prometheus") or {},
        "prometheus_note": fleet.get("prometheus_note"),
    }


def _open_store(run_dir: Path, db: Path | str | None, use_store: bool):
    """(Store or None, why there is none). The default store (<run_dir>/../gpufleet.db) is created when it can be;
    when it cannot, the report goes on without history. A store named with --db must open."""
    from gpufleet.fleet import store as fleet_store

    if not use_store:
        return None, "no store: the report was made with --no-store, so there is no history or baseline to compare with"
    if db is not None:
        return fleet_store.open_for_run(Path(db), run_dir), None
    path = fleet_store.default_path(run_dir.resolve().parent)
    try:
        return fleet_store.open_for_run(path, run_dir), None
    except InputError as exc:
        return None, f"no store: {exc}"


def _choose_baseline(run_dir: Path, store, explicit: str | None) -> dict | None:
    """The baseline this run is compared with: --baseline, else run.json's "baseline", else the store's."""
    from gpufleet.fleet import store as fleet_store

    if explicit:
        if store is not None and not store.run(explicit):
            raise InputError(f"--baseline {explicit!r}: no such run in the store {store.path}; expected a run it holds "
                             "(gpufleet history, or gpufleet store rebuild when its folder exists)")
        return {"run_id": explicit, "source": "--baseline"}
    info = fleet_store.read_run_info(run_dir)
    if isinstance(info.get("baseline"), str) and info["baseline"]:
        return {"run_id": info["baseline"], "source": "run.json"}
    current = store.baseline() if store is not None else None
    if current:
        return {"run_id": current["run_id"], "source": f"the store's baseline (set {current['set_at']})"}
    return None


def _fleet_document(report: dict, fleet: dict, drain: list[str]) -> dict:
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": report["run_id"],
        "generated": report["generated"],
        "store": report["fleet"]["store"],
        "store_note": report["fleet"]["store_note"],
        "store_problems": report["fleet"]["store_problems"],
        "baseline": fleet["baseline"],
        "nodes": {
            host: {"verdict": report["nodes"][host]["verdict"], "results": results,
                   **{k: fleet["metrics"][host][k] for k in ("gpus", "metrics", "spreads", "cpu")}}
            for host, results in fleet["results"].items()
        },
        "fleet_medians": fleet["fleet_medians"],
        "baseline_medians": fleet["baseline_medians"],
        "view": fleet["view"],
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
) -> dict:
    """Read RUN_DIR/hosts/*.json, add the fleet layer, write the reports, return the summary.

    The fleet layer: the run's documents are indexed into the store (`db`, default <run_dir>/../gpufleet.db,
    none with use_store False), each node gets the results of group `fleet` (gpufleet.fleet.compare: against
    its GPUs' median, the fleet, the baseline, its counters' growth, GPUs that failed before), which count in its
    verdict; fleet.json, prometheus/<host>.prom and drain.txt are written beside the reports, and the verdicts
    are recorded in the store. `slurm_names` maps inventory names to Slurm node names (default: the same;
    run.json's "slurm_node_names" when it has them).

    Raises InputError when RUN_DIR is missing, not a directory, has no hosts/
    folder (or an empty one with no expected hosts), or cannot be written,
    and for a store named by `db` or a baseline that cannot be used.
    """
    from gpufleet.fleet import compare, export, store as fleet_store
    from gpufleet.report import render_html, render_junit, render_md  # they use the helpers above

    run_dir = Path(run_dir)
    nodes = load_nodes(run_dir, expected_hosts)
    run_id = run_dir.resolve().name
    store, store_note = _open_store(run_dir, db, use_store)
    try:
        if store is not None:
            try:
                store.index_run(run_dir, expected_hosts=expected_hosts)
            except (InputError, sqlite3.Error) as exc:  # locked past its timeout, a full disk: the report still comes
                store.close()
                store, store_note = None, f"no store: {store.path} could not be written ({exc}); history and baseline comparisons skip"
        # What happened to the store since the run started (moved aside, rebuilt): the report says so.
        store_problems = [r["note"] for r in store.repairs_since(fleet_store.read_run_info(run_dir).get("started"))] if store else []
        chosen = _choose_baseline(run_dir, store, baseline)
        readable = {n["host"]: {"results": n["results"], "profile": n[_DOC_PROFILE]} for n in nodes if _DOC_PROFILE in n}
        fleet = compare.evaluate(run_id, readable, store=store, store_note=store_note, baseline=chosen)
        for node in nodes:
            node.pop(_DOC_PROFILE, None)
            node["results"] = node["results"] + fleet["results"].get(node["host"], [])
            _refresh(node)
        report = assemble(run_dir, sorted(nodes, key=_node_order))
        info = fleet_store.read_run_info(run_dir)
        names = slurm_names if slurm_names is not None else info.get("slurm_node_names")
        drain = export.drain_lines(report, names if isinstance(names, dict) else None)
        report["fleet"] = {
            "store": str(store.path) if store is not None else None,
            "store_note": store_note,
            "store_problems": store_problems,
            "baseline": fleet["baseline"],
            "fleet_medians": fleet["fleet_medians"],
            "baseline_medians": fleet["baseline_medians"],
            "view": fleet["view"],
            "drain": drain,
        }
        # The peers' own figures of the run across nodes, beside the new node's (not part of any verdict).
        report["peers"] = load_peers(run_dir)
        attempts = info.get("attempts")
        last = attempts[-1] if isinstance(attempts, list) and attempts and isinstance(attempts[-1], dict) else {}
        if last.get("locks_not_given_back"):
            report["locks_not_given_back"] = last["locks_not_given_back"]
        files = {kind: str(run_dir / name) for kind, name in REPORT_FILES.items()}
        files.update(fleet=str(run_dir / FLEET_FILE), drain=str(run_dir / DRAIN_FILE))
        # Results are written as they came; NaN/inf from a benchmark stay as Python writes them. No indent: that
        # would take json's pure-Python encoder, several times slower on a fleet's tens of megabytes.
        _write(Path(files["fleet"]), json.dumps(_fleet_document(report, fleet, drain), default=str) + "\n")
        try:
            report["fleet"]["prometheus"] = export.write_prometheus(run_dir, report, fleet)
        except ImportError:  # a controller installed without the controller extra: the acceptance report comes first
            report["fleet"]["prometheus_note"] = ("no Prometheus files: prometheus_client is not installed in the controller's "
                                                  "Python (pip install 'gpufleet[controller]')")
        export.write_drain(run_dir, drain, run_id)
        _write(Path(files["json"]), json.dumps(report, default=str) + "\n")
        _write(Path(files["md"]), render_md.render(report))
        _write(Path(files["html"]), render_html.render(report))
        _write(Path(files["junit"]), render_junit.render(report))
        if store is not None:
            try:
                store.record_fleet(run_id, fleet["results"])
                store.record_verdicts(run_id, report["verdict"], {h: n["verdict"] for h, n in report["nodes"].items()}, report["generated"])
            except (InputError, sqlite3.Error) as exc:
                report["fleet"]["store_note"] = (f"the verdicts could not be recorded in {store.path} ({exc}); "
                                                 "`gpufleet store rebuild` records them from the run folders")
    finally:
        if store is not None:
            store.close()
    return summarize(report, files)


def summary_text(summary: dict) -> str:
    """A few lines for the terminal: the fleet verdict, one line per node, where the reports are."""
    nodes = summary["nodes"]
    width = max((len(h) for h in nodes), default=4)
    by = {s: sum(1 for n in nodes.values() if n["verdict"] == s) for s in (schema.FAIL, schema.WARN, schema.PASS)}
    tally = ", ".join(f"{by[s]} {s}" for s in by if by[s])
    lines = [f"fleet verdict: {summary['verdict'].upper()} ({len(nodes)} node(s): {tally})"]
    for host, n in nodes.items():
        line = f"  {host:<{width}}  {n['verdict'].upper():<4}"
        if n["failed_checks"]:
            line += "  failing: " + ", ".join(n["failed_checks"])
        if n.get("warned_checks"):
            line += ("; " if n["failed_checks"] else "  ") + "warning: " + ", ".join(n["warned_checks"])
        lines.append(line.rstrip())
    files = summary["files"]
    lines.append(f"report: {files['html']}")
    lines.append(f"        {files['md']}, {files['json']}, {files['junit']}")
    if files.get("fleet"):
        prom = f", {Path(files['fleet']).parent / PROMETHEUS_DIR}/<node>.prom" if summary.get("prometheus") else ""
        lines.append(f"fleet:  {files['fleet']}{prom}")
    if summary.get("drain"):
        lines.append(f"drain:  {files['drain']} ({len(summary['drain'])} node(s) to drain in Slurm)")
    if summary.get("store"):
        base = f"; compared with baseline {summary['baseline']}" if summary.get("baseline") else "; no baseline set"
        lines.append(f"store:  {summary['store']}{base}")
    elif summary.get("store_note"):
        lines.append(summary["store_note"])
    lines += [f"store problem: {p}" for p in summary.get("store_problems") or []]
    if summary.get("prometheus_note"):
        lines.append(summary["prometheus_note"])
    return "\n".join(lines)
