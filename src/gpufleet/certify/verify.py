"""`gpufleet verify CERT --pubkey PUB`: whether a certificate holds, and if not why, in one line.

    the signature   securesystemslib's Envelope.verify with the public key (a wrong key, a changed payload or
                    signature: not valid)
    its form        an in-toto Statement (v1) of gpufleet's predicate; each subject's digest that of its annotations
    its time        not valid from valid_until on (--at: at another time than now)
    --report FILE   report.json is the one certified (its SHA-256)
    --document DOC  the hardware of a host document (hosts/<host>.json) is the certified one
    --live          this machine's hardware now, read by the node's engine in a process of its own (`python -m
                    gpufleet collect --identity`: NVML and the DMI tables), is the certified one
    a fleet's       its signature and time, and every node certificate it lists: beside it, unchanged, valid

Exit 0 valid; 1 not valid (the reason: signature, form, digest, expired, hardware); 2 bad input or could not check:
a file that cannot be read, a public key that is none, hardware that cannot be read now (no NVIDIA driver, a serial
only root may read), --document or --live with a fleet certificate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gpufleet
from gpufleet.base import certificates, paths
from gpufleet.certify import signing, statement

VALID, NOT_VALID, BAD_INPUT = 0, 1, 2
LIVE_TIMEOUT_S = 120
GIVE_CERTIFICATE = (
    "give the certificate file itself, readable to this user (RUN_DIR/certificates/nodes/<host>.intoto.json or "
    "fleet.intoto.json, which `gpufleet certify` writes)"
)
GIVE_REPORT = "give the run's report.json itself, readable to this user"


def _out(exit_code: int, kind: str | None, reasons: list[str], **fields) -> dict:
    text = "; ".join(reasons) if reasons else "valid"
    return {"valid": exit_code == VALID, "exit": exit_code, "kind": kind, "reason": text, **fields}


def cannot_check(why: str, cert) -> dict:
    """The verdict when the hardware to hold the certificate against cannot be had: exit 2."""
    return _out(BAD_INPUT, "input", [why], certificate=str(cert))


def live_identity(python: str | None = None) -> tuple[dict | None, str | None]:
    """This machine's hardware now from the node's engine (`python -m gpufleet collect --identity`), or (None, why)."""
    argv = [python or sys.executable, "-m", "gpufleet", "collect", "--identity"]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(gpufleet.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LIVE_TIMEOUT_S, env=env)
        reading = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return None, f"`{' '.join(argv)}` could not read this machine: {exc}"
    if not isinstance(reading, dict):
        return None, f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[-300:] or 'no output'}"
    if not reading.get("nvml", {}).get("available"):
        return None, f"cannot read this machine's GPUs: {reading.get('nvml', {}).get('error') or 'NVML unavailable'}"
    return reading, None


def compare(subjects: list[dict], now: dict) -> tuple[list[str], list[str]]:
    """(how the hardware now differs from the certified, what of it cannot be told now)."""
    differs, unknown = [], []
    certified = [s.get("annotations") or {} for s in subjects if str(s.get("name", "")).startswith("gpu:")]
    present = {g.get("uuid"): g for g in now.get("gpus") or []}
    by_serial = {g.get("serial"): g for g in now.get("gpus") or []}
    for g in certified:
        seen = present.get(g.get("uuid"))
        if seen is None:
            moved = by_serial.get(g.get("serial"))
            differs.append(
                f"GPU {g.get('uuid')} (serial {g.get('serial')}) is missing"
                + (f"; its serial is now on {moved.get('uuid')}" if moved else "")
            )
        elif seen.get("serial") != g.get("serial"):
            differs.append(f"GPU {g.get('uuid')}: serial {seen.get('serial')}, certified {g.get('serial')} (swapped)")
    known = {g.get("uuid") for g in certified}
    differs += [
        f"GPU {g.get('uuid')} (serial {g.get('serial')}) was not certified"
        for g in now.get("gpus") or []
        if g.get("uuid") not in known
    ]
    board = next((s.get("annotations") or {} for s in subjects if str(s.get("name", "")).startswith("board:")), {})
    board_now = now.get("board") or {}
    for key in statement.BOARD_KEYS:
        if board.get(key) is None:
            continue  # not readable when certified: nothing bound
        if board_now.get(key) is None:
            why = (board_now.get("unreadable") or {}).get(key) or "not in the hardware given"
            unknown.append(f"the board's {key} cannot be read now ({why})")
        elif board_now[key] != board[key]:
            differs.append(f"the board changed: {key} {board_now[key]}, certified {board[key]}")
    return differs, unknown


def _digests(subjects: list[dict]) -> list[str]:
    bad = []
    for s in subjects:
        name, notes = str(s.get("name", "")), s.get("annotations") or {}
        if name.startswith("gpu:"):
            want = statement.sha256(statement.canonical(statement.gpu_key(notes)))
        elif name.startswith("board:"):
            want = statement.sha256(statement.canonical(statement.board_key(notes)))
        else:
            continue
        if (s.get("digest") or {}).get("sha256") != want:
            bad.append(f"subject {name}: its digest is not that of its serials")
    return bad


def verify(
    cert: Path | str,
    key,
    *,
    hardware: dict | None = None,
    report: Path | str | None = None,
    at: float | None = None,
) -> dict:
    """The verdict on one certificate (the module docstring): {"valid", "exit", "kind", "reason", ...}."""
    cert = Path(cert)
    raw, why = paths.read_bytes(cert, follow=True)  # the operator's own file: a link followed, a FIFO not waited on
    if raw is None:
        return _out(BAD_INPUT, "input", [f"{cert} {why}; {GIVE_CERTIFICATE}"], certificate=str(cert))
    envelope, why = paths.json_of(raw)
    if why is not None:
        return _out(NOT_VALID, "form", [f"{cert} is no DSSE envelope: it {why}"], certificate=str(cert))
    payload, why = signing.verified(envelope, key)
    if why is not None:
        return _out(NOT_VALID, "signature", [why], certificate=str(cert))
    stmt = certificates.statement_of(envelope)
    kinds = (certificates.PREDICATE_TYPE, certificates.FLEET_PREDICATE_TYPE)
    predicate = (stmt or {}).get("predicate")
    if stmt is None or stmt.get("predicateType") not in kinds or not isinstance(predicate, dict):
        return _out(NOT_VALID, "form", [f"the signed payload is no gpufleet certificate ({' or '.join(kinds)})"])
    fleet = stmt["predicateType"] == certificates.FLEET_PREDICATE_TYPE
    fields = {
        "certificate": str(cert),
        "keyid": key.keyid,
        "fleet": fleet,
        "node": predicate.get("node"),
        "run_id": (predicate.get("run") or {}).get("id"),
        "tier": (predicate.get("run") or {}).get("tier"),
        "valid_until": predicate.get("valid_until"),
    }
    if fleet and hardware is not None:
        return _out(BAD_INPUT, "input", ["--document and --live check one node's certificate, not a fleet's"], **fields)
    failing: list[tuple[str, str]] = [("digest", why) for why in _digests(stmt.get("subject") or [])]
    until = certificates.epoch(predicate.get("valid_until"))
    moment = time.time() if at is None else at
    if until is None:
        failing.append(("form", f"valid_until {predicate.get('valid_until')!r} is no UTC time"))
    elif moment >= until:
        failing.append(("expired", f"expired on {predicate['valid_until']} ({(moment - until) / 86400:.1f} days ago)"))
    if report is not None:
        raw, why = paths.read_bytes(report, follow=True)
        if raw is None:
            return _out(BAD_INPUT, "input", [f"--report {report} {why}; {GIVE_REPORT}"], **fields)
        if statement.sha256(raw) != (predicate.get("report") or {}).get("sha256"):
            failing.append(("digest", f"{report} is not the report.json certified (its SHA-256 differs)"))
    unknown: list[str] = []
    if hardware is not None:
        differs, unknown = compare(stmt.get("subject") or [], hardware)
        failing += [("hardware", d) for d in differs]
    if fleet:
        for s in stmt.get("subject") or []:
            member = cert.parent / str(s.get("name"))
            raw, _ = paths.read_bytes(member)  # a file beside it: never a link, a FIFO never waited on
            if raw is None or statement.sha256(raw) != (s.get("digest") or {}).get("sha256"):
                failing.append(("digest", f"{s.get('name')} is missing or not the file certified"))
                continue
            inner = verify(member, key, at=at)
            if not inner["valid"]:
                failing.append((inner["kind"], f"{s.get('name')}: {inner['reason']}"))
    if failing:
        return _out(NOT_VALID, failing[0][0], [why for _, why in failing], **fields)
    if unknown:
        return _out(BAD_INPUT, "hardware", unknown, **fields)
    return _out(VALID, None, [], **fields)


def text(result: dict) -> str:
    """The one line the command prints."""
    if not result["valid"]:
        return f"{'not valid' if result['exit'] == NOT_VALID else 'cannot verify'}: {result['reason']}"
    what = "fleet certificate" if result.get("fleet") else f"certificate of {result.get('node')}"
    return f"valid: {what}, run {result.get('run_id')} ({result.get('tier')}), until {result.get('valid_until')}"
