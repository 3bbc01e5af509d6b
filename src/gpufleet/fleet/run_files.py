"""The files beside the store and in the run folders that it reads and writes: a run's run.json (with what
can be derived when it is missing or unreadable), the baseline file beside the store, and the sections that actions
after the report put into its report.md."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpufleet.base import paths, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import BASELINE_FILE


def read_md(path: Path) -> str | None:
    """A run's report.md, for a section to be put into it: None when there is none yet; InputError naming it when it
    cannot be read. The commands that add a section read it before they act, so nothing is done unrecorded."""
    if not os.path.lexists(path):
        return None
    text, why = paths.read_text(path)
    if text is None:
        raise InputError(
            f"{path} {why}: no section can be added to it; make it again with `gpufleet report {Path(path).parent}`"
        )
    return text


def put_md_section(path: Path, heading: str, lines: list[str]) -> None:
    """report.md with its section `heading` (a line "## ...") replaced by `lines` (which start with it), up to the
    next "## " heading; appended when it has none. Nothing when there is no report.md yet."""
    text = read_md(path)
    if text is None:
        return
    text = text.rstrip("\n")
    start = text.find(f"\n{heading}\n")
    if start < 0:
        head, tail = text, ""
    else:
        head = text[:start]
        nxt = text.find("\n## ", start + len(heading) + 2)
        tail = "\n" + text[nxt:] if nxt >= 0 else ""
    paths.write_atomic(path, head.rstrip("\n") + "\n\n" + "\n".join(lines).rstrip("\n") + tail + "\n")


def read_json(path: Path) -> Any:
    """The document, or None when the file cannot be read or is damaged."""
    return paths.read_json(path)[0]


def _report_shape(doc: Any) -> str | None:
    """What keeps a document from being a report an action can use: the run's id, and each node's verdict and
    results (each a check with its status)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("run_id"), str) or not isinstance(doc.get("nodes"), dict):
        return "is not a report (a JSON object with the run's run_id and its nodes)"
    for host, node in doc["nodes"].items():
        node = node if isinstance(node, dict) else {}
        results = node.get("results")
        if (
            node.get("verdict") not in schema.STATUSES
            or not isinstance(results, list)
            or not all(isinstance(r, dict) and r.get("status") in schema.STATUSES and r.get("check") for r in results)
        ):
            return f"is not a report: node {host!r} has no verdict, or results that are not checks with a status"
    return None


def read_report(run_dir: Path, use: str) -> dict:
    """RUN_DIR/report.json for `use` (what the caller does with it); InputError naming the file when it is missing,
    damaged or of another shape, and saying to make it again."""
    path = Path(run_dir) / "report.json"
    doc, why = paths.read_json(path)
    why = why or _report_shape(doc)
    if why:
        raise InputError(f"{path} {why}: no report {use}; make it with `gpufleet report {run_dir}` first")
    return doc


def read_run_info(run_dir: Path, *, strict: bool = False) -> dict:
    """run.json as a dict; for a run without one (older runs) or an unreadable one, what can be derived:
    the start as the earliest host document's, and `problem` saying why. `strict`: an unreadable one is an InputError
    (a command that acts on the run by what run.json says: its Slurm names)."""
    path = run_dir / "run.json"
    info: dict = {}
    if os.path.lexists(path):
        doc, why = paths.read_json(path)
        if isinstance(doc, dict):
            info = dict(doc)
            info["problem"] = None
        else:
            why = why or "is not a JSON object"
            if strict:
                raise InputError(
                    f"{path} {why}: the run's record is needed to act on it, and nothing was done; restore "
                    "it, or move it aside (the run is then known by its folder)"
                )
            info["problem"] = (
                f"{path} {why}: what the run holds was derived from its folder; restore it, or move it aside"
            )
    if not info.get("started"):
        starts = []
        hosts = run_dir / "hosts"
        for p in hosts.glob("*.json") if hosts.is_dir() else []:
            doc = read_json(p)
            if isinstance(doc, dict) and isinstance(doc.get("started"), str):
                starts.append(doc["started"])
        if starts:
            info["started"] = min(starts)
        else:  # hosts/ rather than the run folder: writing the reports does not change its time
            try:
                info["started"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime((hosts if hosts.is_dir() else run_dir).stat().st_mtime)
                )
            except OSError:
                pass
    return info


def read_baseline_file(folder: Path, run_ids: list[str]) -> tuple[dict | None, str | None]:
    """(baseline.json's {"run_id", "set_at"}, None) when it names one of `run_ids` (the runs of the reports
    folder); (None, why it is not taken, naming the file) when it is damaged or names no such run; (None, None)
    when there is none."""
    path = Path(folder) / BASELINE_FILE
    if not path.exists():
        return None, None
    doc, why = paths.read_json(path)
    run_id = doc.get("run_id") if isinstance(doc, dict) else None
    if why is None and not isinstance(run_id, str):
        why = 'is not a baseline record (a JSON object {"run_id": ..., "set_at": ...})'
    elif why is None:
        try:
            paths.safe_name(run_id, "its run_id")
            if run_id not in run_ids:
                why = f"names run {run_id!r}, which is no run folder of {folder}"
        except InputError as exc:
            why = f"is not taken: {exc}"
    if why:
        return None, f"{path} {why}; the baseline is not restored from it: set one with `gpufleet baseline set RUN_ID`"
    return {"run_id": run_id, "set_at": doc.get("set_at") if isinstance(doc.get("set_at"), str) else None}, None


def write_baseline_file(folder: Path, value: dict | None) -> None:
    path = Path(folder) / BASELINE_FILE
    if value is None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise InputError(f"cannot remove {path}: {exc.strerror}; move it aside, then run this again") from None
        return
    paths.write_atomic(path, json.dumps(value, indent=1, sort_keys=True) + "\n")
