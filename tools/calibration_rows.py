"""The calibration node-runs as tools/calibration_table.py reads them: the JSON-lines files tools/gpu_calibrate.py
appended, each row's GPU model, machine and condition."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

from calibration_from_runs import inventory_of

FORMAT = "gpufleet-calibration/1"


def data_files(paths: list[Path]) -> list[Path]:
    """The files named, a folder's *.jsonl and *.jsonl.gz in name order."""
    out = []
    for path in paths:
        out += sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")]) if path.is_dir() else [path]
    return out


def read_rows(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Every node-run of the files (gzip where the name ends .gz), in file order; and what could not be read, line
    by line."""
    rows, problems = [], []
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                problems.append(f"{path}:{n}: not JSON ({exc})")
                continue
            if not isinstance(row, dict) or row.get("format") != FORMAT or not isinstance(row.get("document"), dict):
                problems.append(f"{path}:{n}: not a {FORMAT} node-run with a document")
                continue
            row["_file"] = str(path)
            rows.append(row)
    return rows, problems


def model_of(row: dict) -> str:
    return (row.get("machine") or {}).get("gpu_model") or "unknown"


def machine_of(row: dict) -> str:
    m = row.get("machine") or {}
    return f"{m.get('host')}|{m.get('gpu_model')}|{m.get('gpus_on_machine')}"


def machines(rows: list[dict]) -> list[int]:
    """Each row's machine (a number), told apart by its GPUs: lent machines share the host name `vm`, and
    calibration_from_runs names the machine of a run folder itself, so the same GPUs under two names are one machine.
    A round's GPUs are one machine's; rounds that share a GPU are the same machine."""
    by_round: dict = defaultdict(set)
    for r in rows:
        uuids = {g.get("uuid") for g in (inventory_of(r.get("document") or {}).get("gpus") or [])} - {None}
        by_round[(r.get("round"), machine_of(r))] |= uuids or {machine_of(r)}
    groups: list[set] = []
    for found in by_round.values():
        for g in [g for g in groups if g & found]:
            groups.remove(g)
            found |= g
        groups.append(found)
    where = {key: next(n for n, g in enumerate(groups) if found <= g) for key, found in by_round.items()}
    return [where[(r.get("round"), machine_of(r))] for r in rows]


def condition(row: dict) -> str:
    """clean; disturbed (this node's GPUs); beside (another node's GPUs disturbed in the same round)."""
    if row.get("condition") == "clean":
        return "clean"
    return "disturbed" if row.get("node_affected") else "beside"
