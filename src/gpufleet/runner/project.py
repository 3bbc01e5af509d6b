"""Where the playbooks are, and what the inventory holds.

A checkout (the repository root: galaxy.yml, validate.yml, playbooks/) runs its own playbooks, from its root so
that its ansible.cfg (collections_path) applies. Without one, the installed collection's playbooks run by their
names (gpufleet.cluster.validate) from the current folder, whose ansible.cfg then applies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.base.errors import InputError

COLLECTION = "gpufleet.cluster"
NODE_GROUP = "gpu_nodes"
INVENTORY_TIMEOUT_S = 120


def is_checkout(path: Path) -> bool:
    return all((path / p).is_file() for p in ("galaxy.yml", "validate.yml", "playbooks/validate.yml"))


@dataclass
class Project:
    root: Path | None  # the checkout; None: the installed collection
    cwd: Path  # where ansible-playbook runs

    def playbook(self, name: str) -> str:
        """validate -> /checkout/validate.yml, or gpufleet.cluster.validate from an installed collection."""
        if self.root is not None:
            path = self.root / f"{name}.yml"
            if not path.is_file():
                raise InputError(f"the checkout {self.root} has no {name}.yml; expected the gpufleet repository root")
            return str(path)
        return f"{COLLECTION}.{name}"

    def describe(self) -> str:
        return f"checkout {self.root}" if self.root else f"installed collection {COLLECTION} (from {self.cwd})"


def find_project(explicit: str | None = None) -> Project:
    """--project DIR, else the current folder when it is a checkout, else the checkout this engine runs from,
    else the installed collection."""
    if explicit:
        root = Path(explicit).resolve()
        if not is_checkout(root):
            raise InputError(
                f"--project {explicit}: {root} is not a gpufleet checkout (galaxy.yml, validate.yml and "
                "playbooks/validate.yml at its root)"
            )
        return Project(root, root)
    cwd = Path.cwd()
    if is_checkout(cwd):
        return Project(cwd, cwd)
    here = Path(__file__).resolve().parents[3]  # src/gpufleet/runner -> the checkout of an editable install
    if is_checkout(here):
        return Project(here, here)
    return Project(None, cwd)


def tool_env(extra: dict | None = None) -> dict:
    """The environment for Ansible's commands: this interpreter's bin folder first, so its ansible runs."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = dict(os.environ, PATH=f"{bin_dir}:{path}" if bin_dir not in path.split(":") else path)
    env.update(extra or {})
    return env


_PLAIN_LIMIT = re.compile(r"[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*")


@dataclass
class Inventory:
    path: str
    hosts: list[str]  # gpu_nodes, in inventory order
    hostvars: dict[str, dict]


def _group_hosts(data: dict, group: str, seen: set | None = None) -> list[str]:
    seen = seen if seen is not None else set()
    if group in seen:
        return []
    seen.add(group)
    entry = data.get(group) or {}
    hosts = list(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts += [h for h in _group_hosts(data, child, seen) if h not in hosts]
    return hosts


def read_inventory(project: Project, inventory: str, limit: str | None = None) -> Inventory:
    """The nodes of gpu_nodes (narrowed by limit) and their variables, from `ansible-inventory --list`."""
    path = Path(inventory)
    if not path.exists():
        raise InputError(f"inventory {inventory} does not exist; expected an inventory file or folder (-i)")
    cmd = ["ansible-inventory", "-i", str(path.resolve()), "--list"]
    if limit:
        cmd += ["--limit", limit]
    try:
        proc = subprocess.run(
            cmd,
            cwd=project.cwd,
            # Verbosity (ANSIBLE_VERBOSITY, or verbosity in an ansible.cfg) prints a banner before the JSON.
            env=tool_env({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_VERBOSITY": "0"}),
            capture_output=True,
            text=True,
            timeout=INVENTORY_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise InputError(
            "ansible-inventory is not installed beside this Python: install the controller extra "
            "(pip install 'gpufleet[controller]')"
        ) from None
    except subprocess.TimeoutExpired:
        raise InputError(f"ansible-inventory -i {inventory} took more than {INVENTORY_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise InputError(f"inventory {inventory} cannot be read: {proc.stderr.strip()[-1500:]}")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise InputError(f"ansible-inventory -i {inventory} printed no JSON: {proc.stdout[:300]!r}") from None
    hosts = _group_hosts(data, NODE_GROUP)
    return Inventory(str(path.resolve()), hosts, (data.get("_meta") or {}).get("hostvars") or {})


def nodes_of(project: Project, inventory: str, limit: str | None) -> tuple[Inventory, list[str]]:
    """The whole inventory and the nodes the limit picks (all of gpu_nodes without one)."""
    inv = read_inventory(project, inventory)
    if not inv.hosts:
        raise InputError(
            f"inventory {inventory} has no hosts in the group {NODE_GROUP}; put the nodes to validate there"
        )
    if not limit:
        return inv, list(inv.hosts)
    if _PLAIN_LIMIT.fullmatch(limit) and all(h in inv.hosts for h in limit.split(",")):
        picked = set(limit.split(","))
        return inv, [h for h in inv.hosts if h in picked]
    limited = read_inventory(project, inventory, limit).hosts
    picked = [h for h in inv.hosts if h in limited]
    if not picked:
        raise InputError(f"--limit {limit} matches no node of {NODE_GROUP} in {inventory}")
    return inv, picked
