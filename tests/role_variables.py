"""The variables a role reads: every name its task files, defaults, vars and templates use in a Jinja expression,
less what the role defines itself (registered results, set_fact, task and block vars, loop variables, vars/main.yml)
and Ansible's own (magic variables, connection variables, Jinja globals).

    reads(ROLES / "validate_node", "nccl_multinode")   # {name: sorted task files that read it}

An entry point's files are its task file and every file it includes or imports (include_tasks, import_tasks),
followed through; the role's vars/main.yml entries are expanded where a file uses them, so a variable read only
through one (validate_node_check_args reads gpufleet_python) counts for that entry point. Names are read from the
template's syntax tree (jinja2's parser, which Ansible's templar uses), attribute names of hostvars lookups and
quoted names in filters (`map(attribute='gpufleet_nccl_multinode')`, `hostvars[h]['gpufleet_python']`) included.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import yaml
from jinja2 import nodes

ROLES = Path(__file__).resolve().parents[1] / "roles"

# Conditionals Ansible templates without braces.
BARE_KEYS = {"when", "failed_when", "changed_when", "until", "that"}
# Ansible's own names and Jinja's globals: never a role's input.
MAGIC = {
    "hostvars",
    "groups",
    "group_names",
    "inventory_hostname",
    "inventory_hostname_short",
    "inventory_dir",
    "inventory_file",
    "play_hosts",
    "playbook_dir",
    "role_path",
    "role_name",
    "omit",
    "item",
    "ansible_loop",
    "ansible_index_var",
    "lookup",
    "query",
    "q",
    "now",
    "range",
    "dict",
    "lipsum",
    "cycler",
    "joiner",
    "namespace",
    "undef",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
    "environment",
    "ansible_failed_result",
    "ansible_failed_task",
    "ansible_facts",
    "ansible_check_mode",
    "ansible_diff_mode",
    "ansible_limit",
    "ansible_play_hosts",
    "ansible_play_hosts_all",
    "ansible_play_batch",
    "ansible_playbook_python",
    "ansible_host",
    "ansible_user",
    "ansible_python_interpreter",
    "ansible_version",
    "ansible_run_tags",
    "ansible_skip_tags",
    "ansible_forks",
    "ansible_connection",
    "ansible_parent_role_names",
    "ansible_role_names",
    "ansible_verbosity",
    "loop",
    "varname",
    "super",
    "self",
    "ansible_local",
}
ENV = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _template_names(text: str, bare: bool, prefixes: tuple[str, ...]) -> set[str]:
    source = "{{ " + text + " }}" if bare and "{{" not in text and "{%" not in text else text
    if "{{" not in source and "{%" not in source:
        return set()
    tree = ENV.parse(source)
    # Names loaded and not set in the template itself ({% set %}, {% for %}); no filter needs to be known.
    stored = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    found = {n.name for n in tree.find_all(nodes.Name) if n.ctx == "load"} - stored
    for node in tree.find_all((nodes.Getattr, nodes.Const)):
        value = node.attr if isinstance(node, nodes.Getattr) else node.value
        if isinstance(value, str) and NAME.match(value) and value.startswith(prefixes):
            found.add(value)  # hostvars[h].gpufleet_x, map(attribute='gpufleet_x'), hostvars[h]['gpufleet_x']
    return found


def _walk(value, key: str | None = None):
    """(text, bare) of every string under value; key is the mapping key above it."""
    if isinstance(value, str):
        yield value, key in BARE_KEYS
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, k if k in BARE_KEYS or key not in BARE_KEYS else key)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)


def _defined(tasks) -> set[str]:
    """Names a task list defines: registered results, set_fact keys, task and block vars, loop variables."""
    out = set()
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if "register" in task:
            out.add(task["register"])
        for key in ("ansible.builtin.set_fact", "set_fact"):
            if isinstance(task.get(key), dict):
                out |= {k for k in task[key] if k != "cacheable"}
        out |= set((task.get("vars") or {}).keys())
        loop_var = (task.get("loop_control") or {}).get("loop_var")
        if loop_var:
            out.add(loop_var)
        for key in ("block", "rescue", "always"):
            out |= _defined(task.get(key))
    return out


def _includes(tasks) -> list[str]:
    out = []
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks"):
            target = task.get(key)
            if isinstance(target, dict):
                target = target.get("file")
            if target:
                out.append(target)
        for key in ("block", "rescue", "always"):
            out += _includes(task.get(key))
    return out


def _load(path: Path):
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def entry_files(role: Path, entry: str) -> list[Path]:
    """The entry point's task file and every task file it includes, followed through."""
    todo, seen = [role / "tasks" / f"{entry}.yml"], []
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        todo += [role / "tasks" / name for name in _includes(_load(path))]
    return seen


def role_facts(role: Path) -> set[str]:
    """What the role sets itself, for any of its entry points: vars/main.yml, registered results, set_fact, task and
    include vars, loop variables in every task file, and the facts its action plugins return (`"<role>_..."`)."""
    out = set(_load(role / "vars" / "main.yml") or {})
    for path in sorted((role / "tasks").glob("*.yml")):
        out |= _defined(_load(path))
    for path in sorted((role.parents[1] / "plugins" / "action").glob("*.py")):
        out |= set(re.findall(rf"""["']({role.name}_[a-z0-9_]+)["']""", path.read_text()))
    return out


def reads(role: Path, entry: str = "main") -> dict[str, list[str]]:
    """{variable: the files that read it} for the entry point: inputs only, what the role sets itself left out."""
    role_vars = _load(role / "vars" / "main.yml") or {}
    files = entry_files(role, entry)
    # Handlers and templates belong to the main entry point (the tasks that notify or template them).
    if entry == "main":
        files += sorted((role / "templates").glob("*.j2")) + [
            p for p in [role / "handlers" / "main.yml"] if p.is_file()
        ]
    prefixes = ("gpufleet_", f"{role.name}_")
    defined, used = role_facts(role), {}
    for path in files:
        if path.suffix == ".j2":
            texts = [(path.read_text(), False)]
        else:
            doc = _load(path)
            texts = list(_walk(doc))
        for text, bare in texts:
            for name in _template_names(text, bare, prefixes):
                used.setdefault(name, set()).add(path.name)
    # A vars/main.yml entry used here reads what its value reads, through any entries it uses in turn.
    todo = [n for n in used if n in role_vars]
    expanded = set()
    while todo:
        name = todo.pop()
        if name in expanded:
            continue
        expanded.add(name)
        for text, bare in _walk(role_vars[name]):
            for inner in _template_names(text, bare, prefixes):
                used.setdefault(inner, set()).add(f"vars/main.yml:{name}")
                if inner in role_vars:
                    todo.append(inner)
    return {
        name: sorted(where)
        for name, where in sorted(used.items())
        if name not in defined and name not in MAGIC and not name.startswith("ansible_")
    }
