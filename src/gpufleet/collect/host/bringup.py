"""The record bringup.yml leaves on the node (/etc/gpufleet/bringup.json) and what it says to expect."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gpufleet.collect.host.files import read_text

# Written by bringup.yml (module gpufleet.cluster.bringup_record): role -> the
# settings it applied and how to tell they still hold.
BRINGUP_RECORD = "etc/gpufleet/bringup.json"


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _sha256(path: Path) -> tuple[str | None, str | None]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest(), None
    except FileNotFoundError:
        return None, f"{path}: not present"
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def bringup_expectation(root: Path, item: Any) -> dict:
    """What one expectation of the record finds on the node now.

    An expectation names a file (`path`) or a set of files (`glob`) and what
    bringup left there: `sha256` of the content, the stripped text `value`, or
    whether it `exists`. `found` is the same kind of thing read now; whether it
    still holds is the check's business.
    """
    if not isinstance(item, dict):
        return {"what": str(item), "found": None, "found_reason": "expectation is not a mapping"}
    out = {k: item[k] for k in ("what", "path", "glob", "sha256", "value", "exists") if k in item}
    out.setdefault("what", item.get("path") or item.get("glob") or "?")
    where = item.get("glob") or item.get("path")
    if not isinstance(where, str) or not where.startswith("/"):
        return out | {"found": None, "found_reason": f"expectation has no absolute 'path' or 'glob': {where!r}"}
    if "glob" in item:
        values: dict[str, int] = {}
        matched = sorted(glob.glob(str(_under(root, where))))
        for name in matched:
            text, reason = read_text(Path(name))
            key = text if text is not None else f"unreadable ({reason})"
            values[key] = values.get(key, 0) + 1
        return out | {"found": values, "found_reason": None if matched else f"no file matches {_under(root, where)}"}
    path = _under(root, where)
    if "sha256" in item:
        current, reason = _sha256(path)
    elif "exists" in item:
        current, reason = os.path.lexists(path), None  # an enabled unit is a symlink to an absolute path
    elif "value" in item:
        current, reason = read_text(path)
    else:
        current, reason = None, "expectation has none of sha256, value, exists"
    return out | {"found": current, "found_reason": reason}


def read_bringup(root: Path) -> dict:
    path = root / BRINGUP_RECORD
    out: dict[str, Any] = {"path": str(path), "present": False, "readable": False, "reason": None, "roles": {}}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out | {"reason": f"{path}: not present"}
    except OSError as exc:
        return out | {"present": True, "reason": f"{path}: {exc.strerror or exc}"}
    out["present"] = True
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return out | {"reason": f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}"}
    if not isinstance(doc, dict) or not isinstance(doc.get("roles"), dict):
        return out | {"reason": f"{path}: expected an object with a 'roles' mapping"}
    roles = {}
    for role, entry in sorted(doc["roles"].items()):
        entry = entry if isinstance(entry, dict) else {}
        expect = entry.get("expect") if isinstance(entry.get("expect"), list) else []
        roles[role] = {
            "applied_at": entry.get("applied_at"),
            "settings": entry.get("settings") or {},
            "expect": [bringup_expectation(root, item) for item in expect],
        }
    return out | {"readable": True, "schema_version": doc.get("schema_version"), "roles": roles}
