"""A node's certificate as an in-toto Statement (v1), made from its run's report.json and its host document: its
subjects the hardware (the board and every GPU), its predicate what was judged (docs/certificates.md, field by field).

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "board:<host>", "digest": {"sha256": ...}, "annotations": {board_serial, ...}},
                 {"name": "gpu:<uuid>", "digest": {"sha256": ...}, "annotations": {uuid, serial, index, ...}}, ...],
     "predicateType": "https://gpufleet.dev/acceptance/v1",
     "predicate": {"node", "verdict", "run": {id, tier, started, reported}, "certified", "valid_until", "validity",
                   "figures", "results", "warnings", "profile", "versions", "gpufleet", "report", "host_document"}}

A subject's digest is the SHA-256 of the canonical JSON (keys sorted, no spaces, UTF-8) of what identifies it: a
GPU's {"serial", "uuid"}; the board's four serials (BOARD_KEYS), null where unreadable. The profile's and the
calibration's digests are the same over the host document's profile.thresholds and profile.calibration, as judged.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from gpufleet import __version__
from gpufleet.base import certificates, registry, schema
from gpufleet.base.errors import InputError
from gpufleet.version import ROOT

BOARD_KEYS = ("board_serial", "chassis_serial", "product_serial", "product_uuid")
GPU_KEYS = ("uuid", "serial")
ACCEPTED = (schema.PASS, schema.WARN)
COMMIT_ENV = "GPUFLEET_COMMIT"  # the commit of an engine copied without its .git (a node's, a device's)
VERSION_KEYS = ("driver", "cuda_driver", "nvml", "nccl", "torch", "torch_cuda", "vbios", "inforom_image", "engine")


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def identity(doc: dict) -> tuple[dict | None, str | None]:
    """(the hardware a host document's gpu_inventory.gpu_count saw: {"board", "gpus"}, None) or (None, why)."""
    found = next((r for r in doc.get("results") or [] if isinstance(r, dict) and r.get("check") == "gpu_count"), None)
    inventory = ((found or {}).get("detail") or {}).get("inventory") if isinstance(found, dict) else None
    if not isinstance(inventory, dict):
        return None, "its document holds no gpu_inventory.gpu_count inventory (the GPUs' UUIDs and serials)"
    gpus = [g for g in inventory.get("gpus") or [] if isinstance(g, dict)]
    missing = [str(g.get("index")) for g in gpus if not (g.get("uuid") and g.get("serial"))]
    if not gpus:
        return None, "its document lists no GPU"
    if missing:
        return None, f"GPU(s) {', '.join(missing)} have no readable UUID or serial: nothing to bind"
    return {"board": inventory.get("board"), "gpus": gpus}, None


def board_key(board: dict | None) -> dict:
    return {k: (board or {}).get(k) for k in BOARD_KEYS}


def gpu_key(gpu: dict) -> dict:
    return {k: gpu.get(k) for k in GPU_KEYS}


def subjects(host: str, ident: dict) -> list[dict]:
    board = ident.get("board") or {}
    out = [
        {
            "name": f"board:{host}",
            "digest": {"sha256": sha256(canonical(board_key(board)))},
            "annotations": board_key(board)
            | {k: board.get(k) for k in ("board_vendor", "board_name", "sys_vendor", "product_name")}
            | {"unreadable": board.get("unreadable") or ({} if board else {"dmi": "not in the host document"})},
        }
    ]
    for g in sorted(ident["gpus"], key=lambda g: (g.get("index") is None, g.get("index"))):
        out.append(
            {
                "name": f"gpu:{g['uuid']}",
                "digest": {"sha256": sha256(canonical(gpu_key(g)))},
                "annotations": {k: g.get(k) for k in ("uuid", "serial", "index", "pci_bus_id", "name")},
            }
        )
    return out


def commit() -> str | None:
    """The engine's commit: GPUFLEET_COMMIT, else its checkout's HEAD, else None (an installed package)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def figures(results: list) -> list[dict]:
    """Every judged figure: a result with a number for its value and a limit or a trust, with them."""
    out = []
    for r in results:
        value = r.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (r.get("threshold") or r.get("trust")):
            continue
        out.append(
            {
                "check": f"{r.get('group')}.{r['check']}" if r.get("group") else r["check"],
                "status": r.get("status"),
                "value": value,
                "unit": r.get("unit"),
                "limit": r.get("threshold"),
                "trust": r.get("trust"),
            }
        )
    return out


def validity(doc: dict, tier: str) -> dict:
    """{"days", "key", "source"}: the node's profile's validity for the tier; InputError when it holds none."""
    key = registry.CERTIFICATE_VALIDITY.get(tier)
    entry = ((doc.get("profile") or {}).get("thresholds") or {}).get(key or "")
    if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)) or entry["value"] < 0:
        raise InputError(
            f"the profile of {doc.get('host')} holds no {key or 'certificate_valid_days_<tier>'} for tier {tier!r}: "
            "its document was made before certificates; run the node again"
        )
    return {"days": entry["value"], "key": key, "source": entry.get("source")}


def node_statement(host: str, node: dict, doc: dict, ident: dict, run: dict, digests: dict, now: float) -> dict:
    """The Statement of one accepted node (the module docstring). `run`: {id, tier, started, reported}; `digests`:
    {"report": sha256, "host_document": sha256}."""
    valid = validity(doc, run["tier"])
    reported = certificates.epoch(run["reported"]) or now
    profile = doc.get("profile") or {}
    calibration = profile.get("calibration")
    versions = doc.get("versions") or {}
    results = node.get("results") or []
    return {
        "_type": certificates.STATEMENT_TYPE,
        "subject": subjects(host, ident),
        "predicateType": certificates.PREDICATE_TYPE,
        "predicate": {
            "node": host,
            "verdict": node["verdict"],
            "run": run,
            "certified": certificates.utc(now),
            "valid_until": certificates.utc(reported + valid["days"] * 86400),
            "validity": valid,
            "figures": figures(results),
            "results": {s: sum(1 for r in results if r.get("status") == s) for s in schema.STATUSES},
            "warnings": [f"{r.get('group')}.{r['check']}" for r in results if r.get("status") == schema.WARN],
            "profile": {
                "name": profile.get("name"),
                "sha256": sha256(canonical(profile.get("thresholds"))),
                "calibrated": bool((calibration or {}).get("calibrated")),
                "calibration_sha256": sha256(canonical(calibration)),
            },
            "versions": {k: versions.get(k) for k in VERSION_KEYS},
            "gpufleet": {"version": __version__, "commit": commit()},
            "report": {"file": "report.json", "sha256": digests["report"]},
            "host_document": {"file": f"hosts/{host}.json", "sha256": digests["host_document"]},
        },
    }


def fleet_statement(run: dict, nodes: dict[str, dict], not_certified: dict, report_sha: str, now: float) -> dict:
    """The fleet certificate: each node certificate file a subject (its SHA-256), the run's nodes in the predicate.
    `nodes`: {host: {"file", "sha256", "valid_until", "verdict", "gpus"}}."""
    return {
        "_type": certificates.STATEMENT_TYPE,
        "subject": [
            {"name": info["file"], "digest": {"sha256": info["sha256"]}} for host, info in sorted(nodes.items())
        ],
        "predicateType": certificates.FLEET_PREDICATE_TYPE,
        "predicate": {
            "run": run,
            "certified": certificates.utc(now),
            "valid_until": min(info["valid_until"] for info in nodes.values()),
            "nodes": {h: {k: v for k, v in info.items() if k != "sha256"} for h, info in sorted(nodes.items())},
            "not_certified": dict(sorted(not_certified.items())),
            "report": {"file": "report.json", "sha256": report_sha},
            "gpufleet": {"version": __version__, "commit": commit()},
        },
    }
