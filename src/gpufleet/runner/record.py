"""The runner's own record of a run, and what a run folder holds.

    <run_dir>/runner/                ansible-runner's private data dir (env/settings) and its artifacts/<ident>/
                                     (command, stdout, job_events/, status, rc) of every invocation
    <run_dir>/runner/runner.json     {"schema_version": 1, "run_id", "reports_dir", "project", "inventory",
                                      "invocations": [{"n", "ident", "command", "playbook", "started", "started_epoch",
                                                       "ended", "status", "rc", "exit", "interrupted", "limit",
                                                       "stages", "peers", "extravars", "extravars_withheld", "hosts",
                                                       "last_stage": {host: stage},
                                                       "controller": {"host", "pid", "started_ticks", "boot_id"}}]}

`extravars` are the operator's own (-e, --tier), without the run id, folder and resume variables the runner
sets; a resume starts from them. Only gpufleet_* settings keep their values: any other variable and
gpufleet_node_env may hold a secret, and `extravars_withheld` names them, for a resume to ask for again. An invocation with no "ended" was cut off (its controller killed).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.base import paths
from gpufleet.base.errors import InputError

RECORD = "runner.json"
RUNNER_DIR = "runner"
RECORD_SCHEMA_VERSION = 1


def runner_dir(run_dir: Path) -> Path:
    return run_dir / RUNNER_DIR


def read_record(run_dir: Path) -> dict | None:
    path = runner_dir(run_dir) / RECORD
    if not path.exists():
        return None
    doc, why = paths.read_json(path)
    if why:
        raise InputError(f"{path} {why}; expected the runner's record of the run: restore it, or move it aside")
    if not isinstance(doc, dict) or not isinstance(doc.get("invocations"), list):
        raise InputError(
            f"{path} is not the runner's record (a JSON object with a list of invocations): restore it, or move it aside"
        )
    return doc


def write_record(run_dir: Path, doc: dict) -> None:
    paths.make_dir(runner_dir(run_dir))
    paths.write_atomic(runner_dir(run_dir) / RECORD, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def read_json(path: Path) -> tuple[dict | None, str | None]:
    """(document, None), or (None, why it could not be read); (None, None) when there is no file."""
    if not path.exists():
        return None, None
    doc, why = paths.read_json(path)
    if why:
        return None, why
    if not isinstance(doc, dict):
        return None, "is not a JSON object"
    return doc, None


@dataclass
class RunFolder:
    """What resume reads: the records, every host document (or why it cannot be read) and the report."""

    run_dir: Path
    run: dict | None = None  # run.json
    record: dict | None = None  # runner/runner.json
    report: dict | None = None  # report.json
    docs: dict = field(default_factory=dict)  # host -> document
    unreadable: dict = field(default_factory=dict)  # host -> why
    mtimes: dict = field(default_factory=dict)  # host -> seconds since the epoch
    peer_docs: dict = field(default_factory=dict)  # peers/<host>.json

    def hosts(self) -> list[str]:
        """Every node of the run, in the order the records give them."""
        seen: list[str] = []

        def add(names):
            for h in names or []:
                if isinstance(h, str) and h not in seen:
                    seen.append(h)

        for inv in (self.record or {}).get("invocations", []):
            if inv.get("command") != "locate":
                add(inv.get("hosts"))
        if self.run:
            for att in self.run.get("attempts") or []:
                if att.get("playbook") not in ("locate",):
                    add(att.get("hosts"))
            add(self.run.get("hosts"))
        add(((self.report or {}).get("nodes") or {}).keys())
        add(sorted(self.docs))
        add(sorted(self.unreadable))
        return seen


def load_run_folder(run_dir: Path) -> RunFolder:
    if not run_dir.is_dir():
        raise InputError(f"there is no run folder {run_dir}; expected <reports-dir>/<run-id> of an earlier run")
    folder = RunFolder(run_dir)
    run, why = read_json(run_dir / "run.json")
    if why:
        raise InputError(f"{run_dir / 'run.json'} {why}; expected the run record: restore it, or move it aside")
    folder.run = run
    folder.record = read_record(run_dir)
    report, _ = read_json(run_dir / "report.json")
    folder.report = report
    hosts_dir = run_dir / "hosts"
    if hosts_dir.is_dir():
        for path in sorted(hosts_dir.glob("*.json")):
            if path.name.startswith("."):
                continue
            host = path.stem
            doc, why = read_json(path)
            if doc is None or not isinstance(doc.get("results"), list):
                folder.unreadable[host] = why or "holds no results list"
            else:
                folder.docs[host] = doc
            folder.mtimes[host] = path.stat().st_mtime
    peers_dir = run_dir / "peers"
    if peers_dir.is_dir():
        for path in sorted(peers_dir.glob("*.json")):
            doc, _ = read_json(path)
            if doc is not None:
                folder.peer_docs[path.stem] = doc
    return folder


def running_playbooks(run_dir: Path) -> list[int]:
    """ansible-playbook processes still working on this run (their controller may have been killed).

    Other processes that carry the mark, such as ssh's ControlPersist masters, outlive a run by design.
    """
    mark = f"GPUFLEET_RUNNER_RUN_DIR={run_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if mark in environ and b"ansible-playbook" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)
