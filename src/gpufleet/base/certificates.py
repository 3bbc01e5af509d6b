"""Where a run keeps its acceptance certificates, and what each claims of its node's expiry, read without verifying
its signature: what the report, `gpufleet status` and the sweeps' order need. certify/ makes and verifies them
(docs/certificates.md).

    RUN_DIR/certificates/nodes/<host>.intoto.json   a node's certificate: an in-toto Statement in a DSSE envelope
    RUN_DIR/certificates/fleet.intoto.json          the fleet certificate over the run's node certificates
    RUN_DIR/certificates/certify.json               what was certified, and each node not certified with why
    RUN_DIR/certificates/expiry.prom                gpufleet_certificate_valid_until_seconds of each node's latest
    REPORTS_DIR/certificates.json                   the index: each node's latest certificate, {host: claim}; the run
                                                    folders are its source, and a missing or damaged index is read
                                                    from them again

A claim is what a certificate says, not what its signature proves: {"host", "run_id", "tier", "certified",
"valid_until", "path"}. Whoever relies on one verifies it (`gpufleet verify`).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import time
from pathlib import Path

from gpufleet.base import paths

FOLDER = "certificates"
NODES = "nodes"
SUFFIX = ".intoto.json"
FLEET_FILE = "fleet" + SUFFIX
RECORD_FILE = "certify.json"
PROM_FILE = "expiry.prom"
INDEX_FILE = "certificates.json"
# in-toto's media type of a Statement in a DSSE envelope (in-toto/attestation, spec/v1/envelope.md)
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# gpufleet's own predicates, versioned in the path: a change a verifier must know of is a new version
PREDICATE_TYPE = "https://gpufleet.dev/acceptance/v1"
FLEET_PREDICATE_TYPE = "https://gpufleet.dev/acceptance-fleet/v1"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
CLAIM_KEYS = ("host", "run_id", "tier", "certified", "valid_until")


def node_path(run_dir: Path | str, host: str) -> Path:
    return Path(run_dir) / FOLDER / NODES / f"{paths.safe_name(host, 'the host name')}{SUFFIX}"


def epoch(text) -> float | None:
    """Unix time of a certificate's UTC time (2026-12-19T10:00:00Z), None for anything else."""
    try:
        return float(calendar.timegm(time.strptime(str(text), TIME_FORMAT)))
    except ValueError:
        return None


def utc(seconds: float) -> str:
    return time.strftime(TIME_FORMAT, time.gmtime(seconds))


def statement_of(envelope) -> dict | None:
    """The Statement a DSSE envelope carries, decoded but NOT verified; None when it carries none."""
    if not isinstance(envelope, dict) or envelope.get("payloadType") != PAYLOAD_TYPE:
        return None
    try:
        doc = json.loads(base64.b64decode(str(envelope.get("payload") or ""), validate=True).decode("utf-8"))
    except (binascii.Error, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("_type") == STATEMENT_TYPE else None


def claim(path: Path | str) -> dict | None:
    """What a node certificate file of a run folder says of its node's expiry (CLAIM_KEYS and its path), unverified;
    None when the file is no node certificate."""
    return claim_of(paths.read_json(path)[0], path)


def claim_of(envelope, path: Path | str) -> dict | None:
    """What the envelope read from the certificate file at path claims (claim()); None when it is no node's."""
    statement = statement_of(envelope)
    if statement is None or statement.get("predicateType") != PREDICATE_TYPE:
        return None
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict) or epoch(predicate.get("valid_until")) is None:
        return None
    run = predicate.get("run") if isinstance(predicate.get("run"), dict) else {}
    return {
        "host": predicate.get("node"),
        "run_id": run.get("id"),
        "tier": run.get("tier"),
        "certified": predicate.get("certified"),
        "valid_until": predicate["valid_until"],
        "path": str(path),
    }


def _newer(a: dict | None, b: dict) -> bool:
    """Whether claim b replaces a: certified later (the same second: the later expiry)."""
    return a is None or (epoch(b["certified"]) or 0, epoch(b["valid_until"]) or 0) >= (
        epoch(a.get("certified")) or 0,
        epoch(a.get("valid_until")) or 0,
    )


def scan(reports_dir: Path | str) -> dict[str, dict]:
    """Each node's latest certificate, read from every run folder of the reports folder."""
    out: dict[str, dict] = {}
    for path in sorted(Path(reports_dir).glob(f"*/{FOLDER}/{NODES}/*{SUFFIX}")):
        c = claim(path)
        if c and isinstance(c["host"], str) and _newer(out.get(c["host"]), c):
            out[c["host"]] = c
    return out


def latest(reports_dir: Path | str) -> dict[str, dict]:
    """{host: claim} of each node's latest certificate: the index, or the run folders where it is missing or damaged."""
    doc, why = paths.read_json(Path(reports_dir) / INDEX_FILE)
    if why is None and isinstance(doc, dict) and all(isinstance(c, dict) for c in doc.values()):
        return doc
    return scan(reports_dir)


def record(reports_dir: Path | str, claims: list[dict]) -> dict[str, dict]:
    """The index with these claims, each where it is newer than the node's, written whole under the folder's lock."""
    reports_dir = Path(reports_dir)
    with paths.folder_lock(reports_dir):
        index = latest(reports_dir)
        for c in claims:
            if _newer(index.get(c["host"]), c):
                index[c["host"]] = c
        paths.write_atomic(reports_dir / INDEX_FILE, json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def state(c: dict | None, now: float | None = None) -> dict:
    """{"certified": bool, "expired": bool, "valid_until", "run_id", "text"}: what the report and `gpufleet status` say
    of a node's latest certificate."""
    if not c:
        return {"certified": False, "expired": False, "valid_until": None, "run_id": None, "text": "no certificate"}
    until = epoch(c.get("valid_until")) or 0
    expired = (time.time() if now is None else now) >= until
    word = "expired on" if expired else "valid until"
    return {
        "certified": True,
        "expired": expired,
        "valid_until": c.get("valid_until"),
        "run_id": c.get("run_id"),
        "text": f"certificate of run {c.get('run_id')} {word} {c.get('valid_until')} (not verified here)",
    }
