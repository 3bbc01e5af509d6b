"""`gpufleet certify RUN_DIR`: a signed certificate for each node the run's report accepted, none for a node it did
not (said why), the fleet certificate over them, each node's expiry for Prometheus, and the reports folder's index
(base/certificates.py names the files). Read: report.json and hosts/<host>.json, which it never changes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpufleet.base import certificates, paths, registry, runs
from gpufleet.base.errors import InputError
from gpufleet.certify import signing, statement

TEXTFILE_NAME = "gpufleet-certificates.prom"  # not gpufleet_<node>.prom: the report's clean-up of old nodes keeps it
TEXTFILE_MODE = 0o644  # node_exporter runs as a user of its own and must read it


def _run(run_dir: Path, report: dict) -> dict:
    """{id, tier, started, reported}: the run as its record has it (the tier a sweep or a playbook started it with)."""
    try:
        info = runs.read_run(run_dir)
    except InputError as exc:
        if os.path.lexists(run_dir / runs.RUN_FILE):  # damaged: its tier (a certificate's life) unknown
            raise InputError(f"{exc}; certify takes the run's tier from it") from None
        info = {}  # a run folder made without one: the default tier
    attempts = info.get("attempts") or [{}]
    tier = (attempts[-1] if isinstance(attempts[-1], dict) else {}).get("tier") or info.get("tier")
    return {
        "id": report.get("run_id") or runs.run_id_of(run_dir),
        "tier": tier or registry.DEFAULT_RUN_TIER,
        "started": info.get("started"),
        "reported": report.get("generated"),
    }


def _not_accepted(node: dict) -> str:
    failing = [
        f"{r.get('group')}.{r['check']}" for r in node.get("results") or [] if r.get("status") in ("fail", "error")
    ]
    shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
    return f"not accepted (verdict {node.get('verdict')}" + (f": {shown} failed" if failing else "") + ")"


def prometheus_text(index: dict, hosts=None) -> str:
    """gpufleet_certificate_valid_until_seconds{node,run_id,tier} of each node's latest certificate."""
    lines = [
        "# HELP gpufleet_certificate_valid_until_seconds When the node's latest acceptance certificate expires "
        "(Unix time; gpufleet certify, docs/certificates.md)",
        "# TYPE gpufleet_certificate_valid_until_seconds gauge",
    ]
    for host, c in sorted(index.items()):
        if hosts is not None and host not in hosts:
            continue
        # node and run_id are plain names (paths.safe_name), the tier a registry name: nothing to escape
        text = f'node="{host}",run_id="{c.get("run_id") or ""}",tier="{c.get("tier") or ""}"'
        lines.append(f"gpufleet_certificate_valid_until_seconds{{{text}}} {certificates.epoch(c['valid_until']):.0f}")
    return "\n".join(lines) + "\n"


def certify(
    run_dir: Path | str, signer, *, textfile_dir: Path | str | None = None, fleet_hosts=None, now: float | None = None
) -> dict:
    """Sign the run's accepted nodes (the module docstring); the record certify.json holds, with its path."""
    run_dir = Path(run_dir)
    report_path = run_dir / "report.json"
    report_raw, why = paths.read_bytes(report_path)
    report, why = (None, why) if report_raw is None else paths.json_of(report_raw)
    if why is not None or not isinstance(report, dict) or not isinstance(report.get("nodes"), dict):
        raise InputError(
            f"{report_path} {why or 'is not a report'}; expected the report of a run, which certify signs: run "
            f"`gpufleet report {run_dir}` to make it again (what is there moved aside first)"
        )
    if textfile_dir is not None and not Path(textfile_dir).is_dir():
        raise InputError(f"--textfile-dir (gpufleet_prometheus_textfile_dir) {textfile_dir} is not a folder")
    now = time.time() if now is None else now
    report_sha = statement.sha256(report_raw)
    run = _run(run_dir, report)
    folder = paths.make_dir(run_dir / certificates.FOLDER)
    paths.make_dir(folder / certificates.NODES)
    made, not_certified, claims = {}, {}, []
    for host, node in report["nodes"].items():
        path = certificates.node_path(run_dir, host)
        doc_path = run_dir / "hosts" / f"{host}.json"
        doc_raw, doc_why = paths.read_bytes(doc_path)
        doc, doc_why = (None, doc_why) if doc_raw is None else paths.json_of(doc_raw)
        if node.get("verdict") not in statement.ACCEPTED:
            why = _not_accepted(node)
        elif doc_why is not None or not isinstance(doc, dict):
            why = f"its host document {doc_path} {doc_why or 'is not a host document'}"
        else:
            ident, why = statement.identity(doc)
        if why is None:
            digests = {"report": report_sha, "host_document": statement.sha256(doc_raw)}
            stmt = statement.node_statement(host, node, doc, ident, run, digests, now)
            envelope = signing.sign(statement.canonical(stmt), signer)
            text = json.dumps(envelope, indent=1, sort_keys=True) + "\n"
            paths.write_atomic(path, text, mode=TEXTFILE_MODE)
            made[host] = {
                "file": f"{certificates.NODES}/{path.name}",
                "sha256": statement.sha256(text.encode("utf-8")),
                "valid_until": stmt["predicate"]["valid_until"],
                "verdict": node["verdict"],
                "gpus": len(ident["gpus"]),
            }
            claims.append(certificates.claim(path))
        else:
            not_certified[host] = why
            path.unlink(missing_ok=True)  # certified by an earlier certify of this run, not now
    fleet_path = folder / certificates.FLEET_FILE
    if made:
        fleet = statement.fleet_statement(run, made, not_certified, report_sha, now)
        envelope = signing.sign(statement.canonical(fleet), signer)
        paths.write_atomic(fleet_path, json.dumps(envelope, indent=1, sort_keys=True) + "\n", mode=TEXTFILE_MODE)
    else:
        fleet_path.unlink(missing_ok=True)
    index = certificates.record(run_dir.resolve().parent, claims) if claims else certificates.latest(run_dir.parent)
    hosts = set(fleet_hosts) if fleet_hosts is not None else None
    prom = prometheus_text(index, hosts)
    paths.write_atomic(folder / certificates.PROM_FILE, prom)
    if textfile_dir is not None:
        paths.write_atomic(Path(textfile_dir) / TEXTFILE_NAME, prom, mode=TEXTFILE_MODE, durable=False)
    record = {
        "run_id": run["id"],
        "tier": run["tier"],
        "certified": {h: {k: v for k, v in info.items() if k != "sha256"} for h, info in made.items()},
        "not_certified": not_certified,
        "fleet": str(fleet_path) if made else None,
        "keyid": signer.public_key.keyid,
        "report_sha256": report_sha,
        "path": str(folder / certificates.RECORD_FILE),
    }
    paths.write_atomic(folder / certificates.RECORD_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def summary_text(record: dict) -> str:
    lines = [f"run {record['run_id']} (tier {record['tier']}), signed by key {record['keyid'][:16]}…"]
    lines += [
        f"  {host}: certified until {info['valid_until']} ({info['gpus']} GPUs): {info['file']}"
        for host, info in record["certified"].items()
    ]
    lines += [f"  {host}: no certificate: {why}" for host, why in record["not_certified"].items()]
    lines.append(
        f"fleet certificate: {record['fleet']}" if record["fleet"] else "no node certified: no fleet certificate"
    )
    return "\n".join(lines)
