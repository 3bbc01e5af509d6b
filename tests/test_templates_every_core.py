"""Every template the collection and the checkout's playbooks run renders the same on every ansible-core claimed
(2.16 to 2.20). Before 2.19 (2.16, 2.17 and 2.18 share one templating engine) a template's result is text unless it is
a variable alone or reads as a list, a mapping or a boolean; from 2.19 it keeps its type. What that changes, each kept
out here, in every task file, playbook, variables file and template (roles/, playbooks/, the playbooks at the root,
inventory/, molecule/):

- a template whose whole value can be null (`{{ x | default(none) }}`, `{{ a if b else none }}`) renders '' before
  2.19 and null from 2.19: a module given '' for "unset" refuses it (gpufleet_benchmarks names ''). Give such a
  value inside a mapping or list expression, or leave the option out with `omit`;
- a number from a template inside a variable's mapping or list (`master_port: "{{ p | int }}"`) stays text before
  2.19, and so reaches a host document as text: give the whole mapping as one expression;
- `omit` as an item of a list stays in the list before 2.19 (its placeholder text); from 2.19 the item goes;
- `default=none` in `map(attribute=...)` is no default to Jinja: before 2.19 an item without the attribute fails the
  task (2.19 lets it through);
- a boolean option given as text (`-e nvidia_driver_reboot_allowed=false`) is true before 2.19 wherever its truth is
  taken (`when: nvidia_driver_reboot_allowed`), and a conditional of text fails from 2.19: every read of a boolean
  option (a role's meta/argument_specs.yml, type bool) goes through `| bool`, which reads the text alike on both;
  another option is never a conditional's value (`when: host_tuning_cpu_governor and ...`), but compared.

tests/test_ansible_versions.py runs the README's command on the versions themselves.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml
from jinja2 import nodes

from role_variables import BARE_KEYS, ENV

REPO = Path(__file__).resolve().parents[1]
FILES = sorted(
    {
        *REPO.glob("*.yml"),
        *(REPO / "playbooks").rglob("*.yml"),
        *(REPO / "roles").rglob("*.yml"),
        *(REPO / "inventory").rglob("*.yml"),
        *(REPO / "molecule").rglob("*.yml"),
    }
)
TEMPLATES = sorted((REPO / "roles").rglob("*.j2"))
# What may read a boolean option without `| bool` around it: a test of it (`is boolean`, `is defined`) or a filter that
# shows it as it is, in a message.
BOOL_READERS = {"bool", "to_json", "to_nice_json", "string", "type_debug"}
NUMBER_FILTERS = {"int", "float", "length", "count", "round", "abs", "sum"}
# The keys under which a task or a play gives variables their values.
VARIABLE_KEYS = {"vars", "ansible.builtin.set_fact", "set_fact"}


def role_options() -> dict[str, str]:
    """{option: its type} of every role's entry points (meta/argument_specs.yml)."""
    found = {}
    for path in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            found.update((name, spec.get("type", "str")) for name, spec in (entry.get("options") or {}).items())
    return found


OPTIONS = role_options()


def _may_be_null(node: nodes.Node) -> bool:
    """Whether an expression's own value can be null: a null literal, a default of null, a branch that is null."""
    if isinstance(node, nodes.Const):
        return node.value is None
    if isinstance(node, nodes.Name):
        return node.name in ("none", "None")
    if isinstance(node, nodes.CondExpr):
        return node.expr2 is None or _may_be_null(node.expr1) or _may_be_null(node.expr2)
    if isinstance(node, nodes.Filter) and node.name == "default":
        return bool(node.args) and _may_be_null(node.args[0])
    if isinstance(node, nodes.Or):
        return _may_be_null(node.right)
    return False


def _option(node: nodes.Node) -> str | None:
    """The role option node reads as it is: a variable, or an attribute (hostvars[h].nvidia_driver_install)."""
    if isinstance(node, nodes.Name) and node.ctx == "load" and node.name in OPTIONS:
        return node.name
    if isinstance(node, nodes.Getattr) and node.attr in OPTIONS:
        return node.attr
    return None


def _results(node: nodes.Node) -> list[nodes.Node]:
    """What a conditional's value can be: itself, or through `and` and `or`, each of their operands' values."""
    if isinstance(node, (nodes.And, nodes.Or)):
        return _results(node.left) + _results(node.right)
    return [node]


def _option_reads(node: nodes.Node, results: list, parents: tuple = ()) -> list[str]:
    """What in node reads a role option so that the versions differ: a boolean one read without `| bool` (through
    any `| default(...)`) or a test around it; any other one as the value of a conditional (results)."""
    found = []
    name = _option(node)
    if name:
        above, child = list(parents), node
        while above and isinstance(above[-1], nodes.Filter) and above[-1].name == "default" and above[-1].node is child:
            child = above.pop()
        reader = above[-1] if above else None
        if OPTIONS[name] == "bool" and not (
            (isinstance(reader, nodes.Filter) and reader.name in BOOL_READERS and reader.node is child)
            or (isinstance(reader, nodes.Test) and reader.node is child)
        ):
            found.append(f"{name} read without | bool: text such as 'false' is true before ansible-core 2.19")
        elif OPTIONS[name] != "bool" and any(child is r for r in results):
            found.append(
                f"{name} ({OPTIONS[name]}) as the value of a conditional, which must be true or false from "
                "ansible-core 2.19 and is its truth before: compare it (length > 0, != '')"
            )
        if isinstance(node, nodes.Name):
            return found
    for sub in node.iter_child_nodes():
        found += _option_reads(sub, results, (*parents, node))
    return found


def _number(node: nodes.Node) -> bool:
    """Whether an expression's value is a number: `| int`, `| length`, arithmetic, `.index(...)`."""
    if isinstance(node, nodes.Filter):
        return node.name in NUMBER_FILTERS
    if isinstance(node, (nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Pow, nodes.Neg)):
        return True
    if isinstance(node, nodes.Add):
        return _number(node.left) or _number(node.right)
    if isinstance(node, nodes.Const):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, nodes.Call):
        return isinstance(node.node, nodes.Getattr) and node.node.attr in ("index", "count")
    if isinstance(node, nodes.CondExpr):
        return _number(node.expr1) or (node.expr2 is not None and _number(node.expr2))
    return False


def problems(text: str, bare: bool = False, list_item: bool = False, in_value: bool = False) -> list[str]:
    """What in one template renders differently before ansible-core 2.19 and from it. bare: a conditional, written
    without braces; list_item: an item of a YAML list; in_value: inside the mapping or list a variable is given."""
    source = "{{ " + text + " }}" if bare and "{{" not in text and "{%" not in text else text
    if "{{" not in source and "{%" not in source:
        return []
    with warnings.catch_warnings():  # a regex's '\.' in a quoted string: Jinja's own escape, as Ansible reads it
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ENV.parse(source)
    out = []
    body = tree.body
    whole = (
        body[0].nodes[0]
        if len(body) == 1
        and isinstance(body[0], nodes.Output)
        and len(body[0].nodes) == 1
        and not isinstance(body[0].nodes[0], nodes.TemplateData)
        else None
    )
    if not bare and whole is not None and _may_be_null(whole):
        out.append("its whole value can be null or undefined, which ansible-core before 2.19 renders as ''")
    if in_value and whole is not None and _number(whole):
        out.append(
            "a number inside a variable's mapping or list, which ansible-core before 2.19 keeps as text: "
            "give the whole mapping or list as one expression"
        )
    for call in tree.find_all((nodes.Filter, nodes.Call)):
        if any(kw.key == "default" and _may_be_null(kw.value) for kw in call.kwargs):
            out.append(
                "default=none in an attribute filter, which Jinja takes for no default: ansible-core before 2.19 "
                "then fails on the item that lacks the attribute; give a default that is not null ('')"
            )
    omits = [n for n in tree.find_all(nodes.Name) if n.name == "omit"]
    if omits and (list_item or any(omit in lst.items for lst in tree.find_all(nodes.List) for omit in omits)):
        out.append("omit as an item of a list, which ansible-core before 2.19 leaves in the list")
    results = _results(whole) if bare and whole is not None else []
    out += list(dict.fromkeys(_option_reads(tree, results)))
    return out


def _strings(value, key=None, list_item=False, depth=None):
    """(text, {bare, list_item, in_value}) of every string under a YAML value: bare under a conditional's key (when,
    that, ...); depth: how far below a variable's name (vars:, set_fact, a vars file), None outside one."""
    if isinstance(value, str):
        yield value, {"bare": key in BARE_KEYS, "list_item": list_item, "in_value": (depth or 0) > 0}
    elif isinstance(value, dict):
        for k, v in value.items():
            # under vars: the mapping of names (-1), each variable's value (0), what is inside a value (1 on)
            inner = -1 if k in VARIABLE_KEYS and depth is None else None if depth is None else depth + 1
            yield from _strings(v, k if k in BARE_KEYS or key not in BARE_KEYS else key, False, inner)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, key, key not in BARE_KEYS, None if depth is None else depth + 1)


def template_problems(path: Path) -> list[str]:
    """Each problem of a file's templates, after the start of the template's text."""
    if path.suffix == ".j2":
        return problems(path.read_text())
    doc = yaml.safe_load(path.read_text())
    if path.parent.name in ("vars", "defaults", "group_vars", "host_vars"):
        doc = {"vars": doc}  # a file of variables: each of its keys is one
    return [f"{' '.join(text.split())[:90]!r}: {p}" for text, where in _strings(doc) for p in problems(text, **where)]


def test_the_rules_find_what_they_are_for():
    assert problems("{{ gpufleet_benchmarks | default(none) }}") == [
        "its whole value can be null or undefined, which ansible-core before 2.19 renders as ''"
    ]
    assert problems("{{ x if y else none }}") and problems("{{ x if y }}") and problems("{{ none }}")
    assert problems("{{ x | default(omit) }}", list_item=True) and problems("{{ [1, omit] }}")
    assert problems("nvidia_driver_reboot_allowed", bare=True) == [
        "nvidia_driver_reboot_allowed read without | bool: text such as 'false' is true before ansible-core 2.19"
    ]
    assert problems("{{ 'x' if hostvars[h].gpufleet_finetune else 'y' }}")
    assert problems("a and not host_tuning_acs_disable | default(false)", bare=True)
    assert problems("x and host_tuning_cpu_governor", bare=True)
    assert problems("{{ docs | map(attribute='detail.failure.peer', default=none) | select | first }}")
    for number in ("{{ p | int }}", "{{ a.index(b) }}", "{{ x | length }}", "{{ a | int + 90 }}", "{{ a * 2 }}"):
        assert problems(number, in_value=True), number
        assert problems(number) == [], number  # an option's value: the module's type converts it
    doc = {"vars": {"info": {"port": "{{ p | int }}", "hosts": ["{{ h | default(omit) }}"]}}}
    assert [where for text, where in _strings(doc)] == [
        {"bare": False, "list_item": False, "in_value": True},
        {"bare": False, "list_item": True, "in_value": True},
    ]
    # What renders alike: null or a number inside a mapping expression, omit for an option, a boolean read as one.
    for same in (
        ("{{ {'tier': gpufleet_tier | default(none), 'port': p | int} }}", False, False, True),
        ("{{ gpufleet_tier | default(omit) }}", False, False, False),
        ("{{ x | default(none) | to_json }}", False, False, False),
        ("got {{ x | default(none) }}", False, False, False),
        ("nvidia_driver_reboot_allowed | bool and x", True, False, False),
        ("host_tuning_cpu_governor | length > 0", True, False, False),
        ("{{ gpufleet_finetune | default(false) | bool }}", False, True, False),
        ("gpufleet_sweep_submit | default(false) is boolean", True, False, False),
        ("{{ gpufleet_finetune | to_json }}", False, False, False),
        ("{{ 'a' ~ b | int }}", False, False, True),
        ("{{ docs | map(attribute='detail.failure.peer', default='') | select | first }}", False, False, False),
    ):
        assert problems(*same) == [], same


@pytest.mark.parametrize("path", FILES + TEMPLATES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_template_renders_alike_on_every_claimed_ansible_core(path):
    found = template_problems(path)
    assert not found, f"{path.relative_to(REPO)}: {found}"
