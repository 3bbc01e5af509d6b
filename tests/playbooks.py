"""One way for the tests to run a playbook: this venv's ansible-playbook from the repository root, Ansible's local
temporary files under the test's own folder, no colour; the run id, reports folder and node lock as -e.

    env = playbook_env(tmp_path, **fleet.ssh_env())
    proc = run_playbook("validate.yml", inventory, "-e", "...", env=env, run_id=run_id, reports=tmp_path)
    proc = start_playbook("validate.yml", inventory, env=env, reports=tmp_path)   # output on proc.stdout
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def playbook_env(tmp: Path, base: dict | None = None, bin_dir: Path = BIN, **extra: str) -> dict:
    """`base` (this process's environment by default) with bin_dir first on PATH, Ansible's local temporary files
    under tmp (never the user's ~/.ansible/tmp), no colour in the output; then extra (ssh settings, ...)."""
    base = os.environ if base is None else base
    return {
        **base,
        "PATH": f"{bin_dir}:{base.get('PATH', '')}",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        **extra,
    }


def playbook_command(
    playbook: str | list[str],
    inventory: Path | str | None,
    *extra: str,
    run_id: str | None = None,
    reports: Path | None = None,
    lock: Path | None = None,
    bin_dir: Path = BIN,
) -> list[str]:
    """ansible-playbook PLAYBOOK (or several, together) -i INVENTORY (none: Ansible's implicit localhost), then -e
    for each of the run id, the reports folder and the node lock given (a lock of the test's own: tests running at
    once on this machine would otherwise wait on its node), then extra (options: no playbook among them)."""
    playbooks = [playbook] if isinstance(playbook, str) else playbook
    cmd = [str(bin_dir / "ansible-playbook"), *playbooks, *([] if inventory is None else ["-i", str(inventory)])]
    for name, value in (("gpufleet_run_id", run_id), ("gpufleet_reports_dir", reports), ("gpufleet_lock_path", lock)):
        if value is not None:
            cmd += ["-e", f"{name}={value}"]
    return [*cmd, *extra]


def run_playbook(
    playbook: str | list[str],
    inventory: Path | str | None,
    *extra: str,
    env: dict,
    timeout_s: float = 600,
    cwd: Path = REPO,
    **names,
) -> subprocess.CompletedProcess:
    """The playbook run to its end, its stdout and stderr captured as text; names: run_id, reports, lock, bin_dir."""
    return subprocess.run(
        playbook_command(playbook, inventory, *extra, **names),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_playbook(
    playbook: str, inventory: Path | str | None, *extra: str, env: dict, new_session: bool = False, **names
) -> subprocess.Popen:
    """The playbook in the background, its stdout and stderr together on proc.stdout as text; new_session: in a
    session of its own, so that a signal to its group reaches it alone."""
    return subprocess.Popen(
        playbook_command(playbook, inventory, *extra, **names),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=new_session,
    )


def validate_on(fleet, inventory: Path, reports: Path, run_id: str, *extra: str, timeout_s: float) -> tuple[int, str]:
    """validate.yml over test hosts (tests/testhosts.py's TestFleet): (exit code, output); the output is also kept
    beside the reports folder, as <run_id>.log, for a failing test's reader."""
    env = playbook_env(reports.parent, **fleet.ssh_env())
    proc = run_playbook("validate.yml", inventory, *extra, env=env, timeout_s=timeout_s, run_id=run_id, reports=reports)
    (reports.parent / f"{run_id}.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr
