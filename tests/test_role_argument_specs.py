"""Every role's meta/argument_specs.yml names exactly the variables each entry point reads (tests/role_variables.py),
every entry point a playbook includes has a spec, and a spec's default is the role's default."""

from __future__ import annotations

import re

import pytest
import yaml

from role_variables import ROLES, reads

REPO = ROLES.parent
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())
TYPES = {
    "str": str,
    "int": int,
    "bool": bool,
    "list": list,
    "dict": dict,
    "float": (int, float),
    "path": str,
    "raw": object,
}


def specs(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def entry_points_used() -> dict[str, set[str]]:
    """{role: the tasks_from of every playbook and role that includes or imports it, and main}."""
    used = {role: {"main"} for role in ROLE_NAMES}
    for path in [*REPO.glob("*.yml"), *(REPO / "playbooks").glob("*.yml"), *(REPO / "molecule").rglob("*.yml")]:
        text = path.read_text()
        for role, entry in re.findall(
            r"name: (?:gpufleet\.cluster\.)?(\w+)\n(?:\s+#.*\n|\s+rolespec_validate: \w+\n)*"
            r"\s+tasks_from: (\w+)",
            text,
        ):
            used.setdefault(role, {"main"}).add(entry)
    return used


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_each_entry_point_specifies_exactly_what_it_reads(role):
    spec = specs(role)
    missing_entries = entry_points_used()[role] - set(spec)
    assert not missing_entries, f"roles/{role}/meta/argument_specs.yml has no entry point {sorted(missing_entries)}"
    for entry, body in spec.items():
        read = reads(ROLES / role, entry)
        options = set(body.get("options") or {})
        unspecified = {name: read[name] for name in sorted(set(read) - options)}
        assert not unspecified, f"{role} entry point {entry} reads variables its spec lacks: {unspecified}"
        stale = sorted(options - set(read))
        assert not stale, f"{role} entry point {entry}: the spec names variables it does not read: {stale}"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_spec_defaults_are_the_roles_defaults(role):
    defaults = (
        yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
        if (ROLES / role / "defaults" / "main.yml").is_file()
        else {}
    )
    specified = {}
    for entry, body in specs(role).items():
        for name, option in (body.get("options") or {}).items():
            assert option.get("description"), f"{role} {entry}: {name} has no description"
            if "default" in option:
                value = option["default"]
                assert isinstance(value, TYPES[option["type"]]), (role, entry, name, value)
                if name in defaults:
                    assert value == defaults[name], (
                        f"{role} {entry}: {name} defaults to {value!r} in the spec, "
                        f"{defaults[name]!r} in defaults/main.yml"
                    )
            elif name in defaults and defaults[name] is not None and "{{" not in str(defaults[name]):
                pytest.fail(
                    f"{role} {entry}: {name} has a default in defaults/main.yml ({defaults[name]!r}) but none in its spec"
                )
            specified.setdefault(name, option)
    unspecified = sorted(set(defaults) - set(specified))
    assert not unspecified, f"roles/{role}/defaults/main.yml sets variables no entry point specifies: {unspecified}"


def test_the_reader_sees_variables_through_includes_vars_and_hostvars(tmp_path):
    """The reader itself, on a role made here: an include followed, a vars/main.yml entry expanded, a hostvars
    attribute and a quoted name read, what the role sets itself left out."""
    role = tmp_path / "roles" / "demo"
    (role / "tasks").mkdir(parents=True)
    (role / "vars").mkdir()
    (role / "vars" / "main.yml").write_text("demo_args:\n  python: '{{ gpufleet_python }}'\n")
    (role / "tasks" / "main.yml").write_text("""
- name: One
  ansible.builtin.command: "{{ demo_args.python }} {{ hostvars[item].gpufleet_lock_path }}"
  loop: "{{ gpufleet_run_hosts }}"
  register: demo_out
- name: Two
  ansible.builtin.include_tasks: more.yml
  when: demo_out is changed and demo_flag | default(false)
""")
    (role / "tasks" / "more.yml").write_text("""
- name: Three
  ansible.builtin.set_fact:
    demo_fact: "{{ groups['all'] | map('extract', hostvars) | map(attribute='gpufleet_tier') | list }}"
- name: Four
  ansible.builtin.debug:
    msg: "{{ demo_fact }} {% for x in demo_list %}{{ x }}{% endfor %}"
""")
    assert set(reads(role)) == {
        "gpufleet_python",
        "gpufleet_lock_path",
        "gpufleet_run_hosts",
        "demo_flag",
        "gpufleet_tier",
        "demo_list",
    }


def test_the_roles_drain_breaker_and_sweep_share_defaults_are_the_engines():
    """gpufleet_slurm_max_drain and gpufleet_sweep_max_share left unset: the role passes the engine the engine's
    own defaults, so `gpufleet slurm` and `gpufleet service` run by hand break and sweep at the same shares as
    validate.yml and sweep.yml."""
    from gpufleet.fleet.slurm_action import DEFAULT_MAX_DRAIN
    from gpufleet.service.sweep import DEFAULT_SHARE

    defaults = yaml.safe_load((ROLES / "validate_node" / "defaults" / "main.yml").read_text())
    assert defaults["gpufleet_slurm_max_drain"] == DEFAULT_MAX_DRAIN
    assert defaults["gpufleet_sweep_max_share"] == DEFAULT_SHARE
