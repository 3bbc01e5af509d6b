"""What the runner keeps out of sight and out of the way: the extra variables in a private file that
ansible-playbook reads with -e @FILE (never its command line), the environment in ansible-runner's command artifact
kept to its names, runner.json's record of the variables without a secret's value, and Ansible's local temporary
files in a folder of ours that goes when the run ends."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from gpufleet import paths
from gpufleet.runner import record as rec

# -e variables whose values runner.json keeps for a resume: the gpufleet_* settings. Any other (a become password)
# and a node's environment (a token in gpufleet_node_env) may hold a secret: runner.json keeps only its name, and
# a resume asks for it again.
SECRET_VARS = {"gpufleet_node_env"}
NOT_RECORDED = "(not recorded)"


def recorded_vars(user_vars: dict) -> tuple[dict, list[str]]:
    """(the -e variables runner.json keeps with their values, the names of those it keeps without)."""
    kept = {k: v for k, v in user_vars.items() if k.startswith("gpufleet_") and k not in SECRET_VARS}
    return kept, sorted(set(user_vars) - set(kept))


def write_private_vars(values: dict) -> Path:
    """The playbook's extra variables in a file of a private temporary folder (0700; the file 0600), outside the
    run folder: ansible-playbook reads them with -e @FILE, so that neither ansible-runner's command artifact nor
    its env/ holds their values. The caller removes the folder."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-vars-"))
    path = folder / "extravars.json"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        json.dump(values, handle)
    return path


LOCAL_TMP_PREFIX = "gpufleet-ansible-"


def ansible_local_tmp() -> Path:
    """A private folder for ansible-playbook's local temporary files (ANSIBLE_LOCAL_TEMP), named after this process;
    those of runners that are gone (killed before they could remove theirs) are removed first."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{LOCAL_TMP_PREFIX}*-*"):
        pid = old.name[len(LOCAL_TMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and old.is_dir() and old.stat().st_uid == os.getuid():
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{LOCAL_TMP_PREFIX}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redact_command(artifact_dir: Path, keep: set[str]) -> None:
    """ansible-runner's artifacts/<ident>/command holds the whole environment ansible-playbook got (this process's,
    which may hold a password or a token): keep the names, and the values of the variables gpufleet set itself."""
    path = Path(artifact_dir) / "command"
    doc, _ = rec.read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("env"), dict):
        return
    if all(v == NOT_RECORDED for k, v in doc["env"].items() if k not in keep):
        return
    doc["env"] = {k: v if k in keep else NOT_RECORDED for k, v in doc["env"].items()}
    paths.write_atomic(path, json.dumps(doc), mode=0o600)
