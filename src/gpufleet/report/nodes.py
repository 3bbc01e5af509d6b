"""The run's nodes, read from RUN_DIR/hosts/*.json (and the peers from peers/*.json), worst verdict first.

A node is named by its file name (the inventory name the playbook writes), so `--expect-host` matches even when
the node reports a different hostname. A file that cannot be read (schema.parse_host_doc), a result that cannot
be reported (schema.result_problem), or an expected host without a file, becomes an `error` result of group
`report`: nothing measured is lost, and a node never passes for want of a document.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpufleet.base import paths, schema
from gpufleet.base.errors import InputError
from gpufleet.report.formatting import STATUS_ORDER

NEVER_REPORTED = "no results: the host never reported (unreachable or the play was interrupted)"
DOC_PROFILE = "_document_profile"  # a node's host document profile (name, thresholds), kept off report.json
# The file as read and parsed, for the store's indexing to take instead of reading it again; kept off report.json:
# {"raw": bytes, "doc": the document or None, "why": why it could not be parsed, "valid": its readable results}
DOC_READ = "_document_read"


def _report_error(check: str, reason: str, remedy: str, detail: dict) -> dict:
    return dict(schema.result(check, schema.ERROR, reason, group=schema.REPORT_GROUP, remedy=remedy, detail=detail))


def _unreadable(rel: str, why: str, detail: dict | None = None) -> dict:
    return _report_error(
        "results_file",
        f"results file {rel} is unreadable: {why}",
        f"look at {rel} on the controller; re-run validate.yml --limit for this host to write it again",
        {"file": rel, **(detail or {})},
    )


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
        node[DOC_PROFILE] = profile  # for the fleet layer's thresholds; not written to report.json
    return node


def read_host_file(path: Path, run_dir: Path) -> dict:
    """One node from one hosts/*.json file; never raises for bad content."""
    rel = str(path.relative_to(run_dir))
    raw, why = paths.read_bytes(path)
    if raw is None:
        return _node(path.stem, rel, [_unreadable(rel, why)])
    doc, why = schema.parse_host_doc(raw)
    if doc is None:
        # The first bytes show at a glance whether it was cut short or is something else entirely.
        node = _node(path.stem, rel, [_unreadable(rel, why, {"head": raw[:400].decode("utf-8", "replace")})])
        node[DOC_READ] = {"raw": raw, "doc": None, "why": why, "valid": []}
        return node
    results, valid = [], []
    for i, res in enumerate(doc["results"]):
        problem = schema.result_problem(res)
        if problem is None:
            results.append(res)  # unchanged: nothing measured is lost or rewritten
            valid.append(res)
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
    node = _node(path.stem, rel, results, doc)
    node[DOC_READ] = {"raw": raw, "doc": doc, "why": why, "valid": valid}
    return node


def _natural_key(name: str) -> list:
    """node2 before node10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def node_order(node: dict) -> tuple:
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
        raise InputError(
            f"run directory {run_dir} has no hosts/ folder; expected {hosts_dir}/<host>.json per checked host"
        )
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
    return sorted(nodes.values(), key=node_order)


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
