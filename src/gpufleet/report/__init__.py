"""Aggregate per-host result documents into one fleet report.

    RUN_DIR/hosts/<host>.json   one host document per host (engine.check_host(),
                                or the playbook's minimal document for a host
                                that could not be checked)

build() reads them all and writes, beside hosts/:

    report.json   every result of every host, unchanged, with a verdict per node
    report.md     node table (failures first), then each node's findings
    report.html   the same, self-contained (inline CSS, no scripts, no external assets)
    junit.xml     one testsuite per node, one testcase per check

A node is named by its file name (the inventory name the playbook writes), so
`--expect-host` matches even when the node reports a different hostname.
A file that cannot be read, or an expected host without a file, becomes a node
with one `error` result: it never passes and never vanishes.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from gpufleet import __version__, schema
from gpufleet.errors import InputError

REPORT_FILES = {"json": "report.json", "md": "report.md", "html": "report.html", "junit": "junit.xml"}

# Worst first: the column order of count tables and the order findings are listed in.
STATUS_ORDER = sorted(schema.STATUSES, key=schema.severity, reverse=True)

NEVER_REPORTED = "no results: the host never reported (unreachable or the play was interrupted)"
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
        paths = sorted(p for p in hosts_dir.glob("*.json") if not p.name.startswith("."))
    except OSError as exc:
        raise InputError(f"{hosts_dir} cannot be listed: {exc.strerror}") from None
    nodes = {p.stem: read_host_file(p, run_dir) for p in paths}
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


# ---------------------------------------------------------------- formatting shared by the renderers


def check_id(res: dict) -> str:
    """`<group>.<check>`, the name a check goes by in every report."""
    return f"{res['group']}.{res['check']}" if res.get("group") else res["check"]


def ordered_results(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(not passing, worst first; passing), each in the order the checks ran."""
    bad = sorted((r for r in results if r["status"] != schema.PASS), key=lambda r: -schema.severity(r["status"]))
    return bad, [r for r in results if r["status"] == schema.PASS]


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
    # Write beside and rename, so a reader never sees half a report.
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}; expected a writable run directory") from None


def summarize(report: dict, files: dict) -> dict:
    nodes = {}
    for host, node in report["nodes"].items():
        nodes[host] = {
            "verdict": node["verdict"],
            "counts": node["counts"],
            "failed_checks": [check_id(r) for r in node["results"] if r["status"] in (schema.FAIL, schema.ERROR)],
            "warned_checks": [check_id(r) for r in node["results"] if r["status"] == schema.WARN],
        }
    return {
        "run_dir": report["run_dir"],
        "run_id": report["run_id"],
        "verdict": report["verdict"],
        "nodes": nodes,
        "files": files,
    }


def build(run_dir: Path, expected_hosts: list[str] | None = None) -> dict:
    """Read RUN_DIR/hosts/*.json, write the four reports, return the summary.

    Raises InputError when RUN_DIR is missing, not a directory, has no hosts/
    folder (or an empty one with no expected hosts), or cannot be written.
    """
    from gpufleet.report import render_html, render_junit, render_md  # they use the helpers above

    run_dir = Path(run_dir)
    report = assemble(run_dir, load_nodes(run_dir, expected_hosts))
    files = {kind: str(run_dir / name) for kind, name in REPORT_FILES.items()}
    # Results are written as they came; NaN/inf from a benchmark stay as Python writes them.
    _write(Path(files["json"]), json.dumps(report, indent=1, default=str) + "\n")
    _write(Path(files["md"]), render_md.render(report))
    _write(Path(files["html"]), render_html.render(report))
    _write(Path(files["junit"]), render_junit.render(report))
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
    return "\n".join(lines)
