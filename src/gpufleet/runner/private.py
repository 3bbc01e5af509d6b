"""What the runner keeps out of sight and out of the way: the extra variables in a private file that
ansible-playbook reads with -e @FILE (never its command line), the environment in ansible-runner's command artifact
kept to its names, runner.json's record of the variables without a secret's value, and Ansible's local temporary
files in a folder of ours that goes when the run ends."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from gpufleet.base import paths
from gpufleet.base.errors import InputError
from gpufleet.runner import record as rec
from gpufleet.runner.project import tool_env

# -e variables whose values runner.json keeps for a resume: the gpufleet_* settings. Any other (a become password)
# and a node's environment (a token in gpufleet_node_env) may hold a secret: runner.json keeps only its name, and
# a resume asks for it again; so does a site's signing command, whose line may carry a token (the key's path is kept).
SECRET_VARS = {"gpufleet_node_env", "gpufleet_certify_command"}
NOT_RECORDED = "(not recorded)"


def recorded_vars(user_vars: dict) -> tuple[dict, list[str]]:
    """(the -e variables runner.json keeps with their values, the names of those it keeps without)."""
    kept = {k: v for k, v in user_vars.items() if k.startswith("gpufleet_") and k not in SECRET_VARS}
    return kept, sorted(set(user_vars) - set(kept))


VARS_PREFIX = "gpufleet-vars-"
LOCAL_TMP_PREFIX = "gpufleet-ansible-"


def write_private_vars(values: dict) -> Path:
    """The playbook's extra variables in a file of a private temporary folder (0700; the file 0600), outside the
    run folder: ansible-playbook reads them with -e @FILE, so that neither ansible-runner's command artifact nor
    its env/ holds their values. The folder is named after this process: the caller removes it once the playbook
    has read it, `gpufleet run playbook` when the playbook is gone first, the next runner when both were killed."""
    _remove_left_behind(VARS_PREFIX)
    folder = Path(tempfile.mkdtemp(prefix=f"{VARS_PREFIX}{os.getpid()}-"))
    path = folder / "extravars.json"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        json.dump(values, handle)
    return path


def ansible_local_tmp() -> Path:
    """A private folder for ansible-playbook's local temporary files (ANSIBLE_LOCAL_TEMP), named after this process;
    those of runners that are gone (killed before they could remove theirs) are removed first, once no process
    uses them."""
    _remove_left_behind(LOCAL_TMP_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{LOCAL_TMP_PREFIX}{os.getpid()}-"))


def _remove_left_behind(prefix: str) -> None:
    """This user's folders <prefix><pid>-* in the temporary folder whose runner (pid) is gone and that no process
    uses any more (an ansible-playbook its killed runner left, or that one's workers, may still work in it)."""
    for old in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = old.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or old.is_symlink() or not old.is_dir():
            continue
        if old.stat().st_uid == os.getuid() and not users(old):
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def users(folder: Path) -> list[int]:
    """The processes that use `folder`: named in their environment (ANSIBLE_LOCAL_TEMP, which ansible-playbook's
    workers and what they start inherit), working in it, or holding a file open in it."""
    inside = str(folder)
    named = f"={inside}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            places = [os.readlink(entry / "cwd")] + [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone meanwhile, or another user's
            continue
        if any(var.endswith(named) for var in environ) or any(
            p == inside or p.startswith(inside + "/") for p in places
        ):
            found.append(int(entry.name))
    return found


def playbook_command(playbook: str, vars_file: Path) -> dict:
    """ansible_runner.run's `binary` and `cmdline` for a playbook: ansible-playbook (this Python's) started through
    `gpufleet run playbook`, which asks the kernel to stop it when this runner dies, and removes vars_file should
    the playbook end before this runner can. ansible-runner adds the inventory, --limit and -e @vars_file."""
    ansible_playbook = shutil.which("ansible-playbook", path=tool_env()["PATH"])
    if ansible_playbook is None:
        raise InputError(
            f"ansible-playbook is not installed beside {sys.executable}: install the controller extra "
            "(pip install 'gpufleet[controller]')"
        )
    wrapper = ["-m", "gpufleet", "run", "playbook", "--runner", str(os.getpid()), "--vars", str(vars_file)]
    return {"binary": sys.executable, "cmdline": shlex.join([*wrapper, ansible_playbook, playbook])}


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
