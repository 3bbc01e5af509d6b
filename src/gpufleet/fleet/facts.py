"""A node's stable facts: a warning about something the node already had when the baseline run accepted it (a
GPU's lifetime uncorrectable ECC count, say) is listed as information, not warned again in every run; a change in
it warns, saying what it was.

A result says which facts stand behind its warning in detail.facts ({key: value}, the keys stable from run to run:
the GPU's uuid, a library's path). settle() holds each such warning against the same check of the same node in
the baseline run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.base import paths, schema
from gpufleet.base.schema import INFO, WARN


def _check_id(res: dict) -> str:
    return f"{res.get('group')}.{res.get('check')}"


def _with_facts(results: list[dict]) -> list[dict]:
    return [
        r
        for r in results
        if r.get("status") == WARN and isinstance((r.get("detail") or {}).get("facts"), dict) and r["detail"]["facts"]
    ]


def baseline_facts(store: Any, base_id: str | None, nodes: dict[str, dict]) -> dict[str, dict]:
    """{host: {check id: facts}} of the baseline run's documents, for the nodes whose warnings carry facts, where
    the baseline accepted the node (pass or warn); {} without a baseline."""
    hosts = {h for h, n in nodes.items() if _with_facts(n.get("results") or [])}
    if store is None or not base_id or not hosts:
        return {}
    run_dir = (store.run(base_id) or {}).get("run_dir")
    out: dict[str, dict] = {}
    for row in store.documents(base_id):
        if (
            row["host"] not in hosts
            or row.get("verdict") not in (schema.PASS, schema.WARN)
            or not row.get("path")
            or not run_dir
        ):
            continue
        raw, _ = paths.read_bytes(Path(run_dir) / row["path"])
        doc, _ = schema.parse_host_doc(raw) if raw is not None else (None, None)
        if doc:
            out[row["host"]] = {
                _check_id(r): (r.get("detail") or {}).get("facts") or {}
                for r in doc["results"]
                if isinstance(r, dict) and isinstance(r.get("detail"), dict)
            }
    return out


def settle(results: list[dict], accepted: dict[str, dict], base_id: str | None) -> list[dict] | None:
    """The node's results with each warning whose facts the baseline run accepted as they are now turned into
    information, and those whose facts changed saying so; None when nothing changes."""
    if not accepted:
        return None
    out, changed = [], False
    for r in results:
        facts = (r.get("detail") or {}).get("facts") if r.get("status") == WARN else None
        before = accepted.get(_check_id(r)) if facts else None
        if not facts or before is None:
            out.append(r)
            continue
        moved = {k: (before.get(k), v) for k, v in facts.items() if before.get(k) != v}
        r = schema.as_result(r)
        if not moved:
            out.append(
                r.replace(
                    status=INFO,
                    detail={**r["detail"], "accepted_in_baseline": base_id},
                    reason=f"{r['reason']} (as in baseline run {base_id}, which accepted it: listed, not warned again)",
                )
            )
        else:
            text = "; ".join(f"{k} was {'absent' if a is None else a}, now {b}" for k, (a, b) in moved.items())
            out.append(
                r.replace(
                    reason=f"{r['reason']}; changed since baseline run {base_id}: {text}",
                    detail={
                        **r["detail"],
                        "changed_since_baseline": {k: {"was": a, "now": b} for k, (a, b) in moved.items()},
                    },
                )
            )
        changed = True
    return out if changed else None
