"""The files beside the store and in the run folders that it reads and writes: a run's run.json (with what
can be derived when it is missing or unreadable), the baseline file beside the store, and the sections that actions
after the report put into its report.md."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpufleet import paths
from gpufleet.errors import InputError
from gpufleet.fleet import BASELINE_FILE


def put_md_section(path: Path, heading: str, lines: list[str]) -> None:
    """report.md with its section `heading` (a line "## ...") replaced by `lines` (which start with it), up to the
    next "## " heading; appended when it has none. Nothing when there is no report.md yet."""
    if not path.exists():
        return
    text = path.read_text().rstrip("\n")
    start = text.find(f"\n{heading}\n")
    if start < 0:
        head, tail = text, ""
    else:
        head = text[:start]
        nxt = text.find("\n## ", start + len(heading) + 2)
        tail = "\n" + text[nxt:] if nxt >= 0 else ""
    paths.write_atomic(path, head.rstrip("\n") + "\n\n" + "\n".join(lines).rstrip("\n") + tail + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_run_info(run_dir: Path) -> dict:
    """run.json as a dict; for a run without one (older runs) or an unreadable one, what can be derived:
    the start as the earliest host document's, and `problem` saying why."""
    path = run_dir / "run.json"
    info: dict = {}
    if path.exists():
        doc = read_json(path)
        if isinstance(doc, dict):
            info = dict(doc)
            info["problem"] = None
        else:
            info["problem"] = (
                f"{path} is unreadable (not a JSON object); what the run holds was derived from its folder"
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


def read_baseline_file(folder: Path) -> dict | None:
    doc = read_json(Path(folder) / BASELINE_FILE)
    return doc if isinstance(doc, dict) and isinstance(doc.get("run_id"), str) and doc["run_id"] else None


def write_baseline_file(folder: Path, value: dict | None) -> None:
    path = Path(folder) / BASELINE_FILE
    if value is None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise InputError(f"cannot remove {path}: {exc.strerror}") from None
        return
    paths.write_atomic(path, json.dumps(value, indent=1, sort_keys=True) + "\n")
