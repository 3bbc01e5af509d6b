# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.run_inputs: check every node's variables on the controller in one task, before any node is
touched.

One pass instead of an assert looping over the nodes for each variable: every hostvars[node] builds that node's
variables again, which cost the controller far more than the checks themselves. Each node's variables are read
once; the checks run in the order the playbooks gave them, each over every node, and the first that fails gives
its message, naming the variable, the node and the value.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import re
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import yaml
from ansible.inventory.manager import IGNORED as INVENTORY_IGNORED
from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_json
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_results import torchrun_margin_s

# The engine that ships with the collection (its src/), whose profiles the nodes hold their thresholds against and
# whose report reads the Slurm names: the same checks, on the controller, before any node is touched. Its registry
# (what a run tier, a benchmark and a depth may be) needs nothing beyond Python.
ENGINE_SRC = str(Path(__file__).resolve().parents[2] / "src")
if ENGINE_SRC not in sys.path:
    sys.path.append(ENGINE_SRC)
from gpufleet.base import registry  # noqa: E402

try:
    from gpufleet.base import paths as engine_paths
    from gpufleet.base import profiles
    from gpufleet.base.errors import InputError
    from gpufleet.certify.signing import check_key_file
    from gpufleet.fleet.export import slurm_name

    ENGINE_MISSING = None
except ImportError as exc:  # said when the checks that need it run
    ENGINE_MISSING = "the engine in %s cannot be imported by the controller's Python (%s)" % (ENGINE_SRC, exc)

CHECK_SETS = ("node", "validate", "finetune", "finetune_if_set", "run")
ARGUMENT_SPEC = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "checks": {"type": "list", "elements": "str", "required": True, "choices": list(CHECK_SETS)},
}
COLLECTION_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# hostvars holds the inventory's values only: the role's defaults stand in for a fine-tune variable a node leaves unset.
ROLE_DEFAULTS = os.path.join(COLLECTION_ROOT, "roles", "validate_node", "defaults", "main.yml")
PREFIX = "gpufleet_"  # the collection's variables; any other name is the site's own
# Variables that were renamed: the old name is refused with the new one.
RENAMED = {"gpufleet_benchmark_tier": "gpufleet_benchmark_depth", "gpufleet_locate_tier": "gpufleet_locate_depth"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FT_TIMEOUTS = ("gpufleet_finetune_timeout_s", "gpufleet_finetune_rdzv_timeout_s")
FT_RUN_WIDE = ("gpufleet_finetune_config", "gpufleet_finetune_max_steps", "gpufleet_finetune_master_port") + FT_TIMEOUTS


def _either(names, word):
    """`a, b and c` (word and) or `a, b or c`."""
    return "%s %s %s" % (", ".join(names[:-1]), word, names[-1]) if len(names) > 1 else names[0]


def _whole(value):
    """`value | string is match('^[0-9]+$')`."""
    return re.match(r"^[0-9]+$", str(value)) is not None


def _positive_whole(value):
    return _whole(value) and int(str(value)) > 0


def _port(value):
    return _whole(value) and 0 < int(str(value)) < 65536


def _boolean_text(value):
    return isinstance(value, bool) or str(value).lower() in ("true", "false", "yes", "no")


def _abs_path(value):
    return isinstance(value, str) and os.path.isabs(value)


def _home_or_abs(value):
    return isinstance(value, str) and (os.path.isabs(value) or re.match(r"~(/|$)", value) is not None)


def _finetune_config(value):
    return (
        isinstance(value, str)
        and len(value.strip()) > 0
        and (os.path.isabs(value) or re.match(r"~(/|$)", value) is not None or ".." not in value.split("/"))
    )


def _iterable(value):
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _list(value):
    """A list, neither a string nor a mapping (Jinja's `is sequence and is not string and is not mapping`)."""
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, Mapping))


def _node_env(value):
    env = value or {}
    return (
        isinstance(env, Mapping)
        and all(ENV_NAME.match(str(k)) for k in env)
        and not any(
            isinstance(v, Mapping) or (not isinstance(v, str) and _iterable(v)) or v is None for v in env.values()
        )
    )


# Per node: (variable, test of a value the node sets, what the message says is expected). A variable the node
# leaves unset passes: its default is the role's or the engine's.
EXPECT_SECONDS = "must be a positive whole number of seconds"
NODE_CHECKS = [
    (
        "gpufleet_python",
        _abs_path,
        "must be the absolute path of a Python interpreter on the node, for example /opt/gpufleet/venv/bin/python",
    ),
    (
        "gpufleet_thresholds",
        lambda v: isinstance(v or {}, Mapping),
        "must be a mapping of threshold -> value, for example {gpus_expected: 8}",
    ),
    (
        "gpufleet_node_env",
        _node_env,
        "must be a mapping of environment variable name -> string or number, for example "
        "{CUDA_VISIBLE_DEVICES: '0,1,2,3'}",
    ),
]
VALIDATE_CHECKS = [
    ("gpufleet_check_timeout_s", _positive_whole, EXPECT_SECONDS),
    (
        "gpufleet_benchmarks",
        lambda v: _list(v) and all(b in registry.benchmark_names(selectable=True) for b in v),
        "must be a list of benchmarks from %s, for example [%s], or [] to run none"
        % (
            _either(registry.benchmark_names(selectable=True), "and"),
            ", ".join(registry.benchmark_names(default=True)),
        ),
    ),
    (
        "gpufleet_benchmark_depth",
        lambda v: v in registry.chosen_depths(),
        "must be %s" % _either(registry.chosen_depths(), "or"),
    ),
    ("gpufleet_nccl_multinode", _boolean_text, "must be true or false"),
    ("gpufleet_nccl_master_port", _port, "must be a TCP port, 1 to 65535, open between the nodes"),
    # One loop over the nodes for both timeouts: see _failure.
    (("gpufleet_benchmark_timeout_s", "gpufleet_nccl_timeout_s"), _positive_whole, EXPECT_SECONDS),
]
FINETUNE_CHECKS = [
    ("gpufleet_finetune", _boolean_text, "must be true or false"),
    (
        "gpufleet_finetune_config",
        _finetune_config,
        "must be the path of a fine-tune config, relative to gpufleet_finetune_dir on the node and inside it "
        "(files/configs/qwen2-7b-lora.yml), or absolute",
    ),
    (
        "gpufleet_finetune_dir",
        _home_or_abs,
        "must be an absolute path on the node, or one under ~, for example ~/gpufleet-finetune",
    ),
    ("gpufleet_finetune_max_steps", _whole, "must be a whole number of steps, 0 for the config's training.max_steps"),
    ("gpufleet_finetune_master_port", _port, "must be a TCP port, 1 to 65535, open between the nodes"),
    (FT_TIMEOUTS, _positive_whole, EXPECT_SECONDS),
]
RUN_CHECKS = [
    ("gpufleet_soak_duration_s", _positive_whole, "must be a positive whole number of seconds, for example 7200"),
    (
        "gpufleet_lock_path",
        _abs_path,
        "must be the absolute path of the lock file on the node, for example /run/lock/gpufleet-node.lock",
    ),
    (
        "gpufleet_lock_wait_s",
        _whole,
        "must be a whole number of seconds to wait for another run to give the node back, 0 for none",
    ),
    (
        "gpufleet_lock_ttl_s",
        _whole,
        "must be a whole number of seconds the node's lock lasts when its run never gives it "
        "back, 0 for the longest the run can take there",
    ),
    ("gpufleet_lock_heartbeat_timeout_s", _positive_whole, EXPECT_SECONDS),
    # What the report and the run's start read, each node's value (the -e and group values every node sees).
    ("gpufleet_resume", _boolean_text, "must be true or false"),
    ("gpufleet_baseline_set", _boolean_text, "must be true or false"),
    (
        "gpufleet_history_db",
        lambda v: v in (None, "") or isinstance(v, str),
        "must be the path of the store file, for example /srv/gpufleet/reports/gpufleet.db",
    ),
    (
        "gpufleet_controller_python",
        lambda v: v in (None, "") or _abs_path(v),
        "must be the absolute path of a Python interpreter on the controller",
    ),
]
VARIABLES = sorted(
    {
        name
        for checks in (NODE_CHECKS, VALIDATE_CHECKS, FINETUNE_CHECKS, RUN_CHECKS)
        for names, dummy, dummy2 in checks
        for name in ((names,) if isinstance(names, str) else names)
    }
    | {"gpufleet_tier", "gpufleet_profile", "gpufleet_profile_dir", "gpufleet_slurm_node_name", "gpufleet_baseline"}
    | {"gpufleet_certify_key", "gpufleet_certify_command", "gpufleet_certify_pubkey", "gpufleet_reports_dir"}
)


def _yaml_file(path):
    with open(path) as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _set_facts(node):
    """The names every set_fact task under node (a task file's YAML) sets."""
    if isinstance(node, list):
        return set().union(*[_set_facts(item) for item in node]) if node else set()
    if not isinstance(node, Mapping):
        return set()
    names = set()
    for key, value in node.items():
        if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, Mapping):
            names |= set(value) - {"cacheable"}
        elif isinstance(value, (list, Mapping)):
            names |= _set_facts(value)
    return names


@lru_cache(maxsize=1)
def known_variables():
    """Every gpufleet_* variable the collection knows, from what declares it: the options of each role's entry points
    (meta/argument_specs.yml) and its defaults, the facts its playbooks and roles set (set_fact) and those its check
    modules return (gpufleet_<group>). A node's variables are checked against it (_unknown_failure)."""
    names = set(PREFIX + group for group in registry.group_names())
    for path in glob.glob(os.path.join(COLLECTION_ROOT, "roles", "*", "meta", "argument_specs.yml")):
        for spec in (_yaml_file(path).get("argument_specs") or {}).values():
            names |= set(spec.get("options") or {})
    for path in glob.glob(os.path.join(COLLECTION_ROOT, "roles", "*", "defaults", "main.yml")):
        names |= set(_yaml_file(path) or {})
    for pattern in (("playbooks", "*.yml"), ("roles", "*", "tasks", "*.yml")):
        for path in glob.glob(os.path.join(COLLECTION_ROOT, *pattern)):
            names |= _set_facts(_yaml_file(path))
    return frozenset(n for n in names if n.startswith(PREFIX))


def _unknown_failure(hosts, names):
    """The first gpufleet_* variable of a node that the collection does not know (a misspelt name would otherwise
    leave its default in place without a word), with the known name nearest to it, or None."""
    known = known_variables()
    for host in hosts:
        for name in sorted(names[host]):
            if name in RENAMED:
                return "%s (for %s) is called %s now (the benchmarks' depth, apart from the run's tier)" % (
                    name,
                    host,
                    RENAMED[name],
                )
            if name.startswith(PREFIX) and name not in known:
                # Compared without the prefix every name shares, which would make any two look alike.
                near = difflib.get_close_matches(name[len(PREFIX) :], [k[len(PREFIX) :] for k in known], n=1)
                return "%s (for %s) is not a variable of gpufleet.cluster; %s" % (
                    name,
                    host,
                    "did you mean %s%s?" % (PREFIX, near[0])
                    if near
                    else "its variables are in roles/validate_node/meta/argument_specs.yml (docs/inventory.md)",
                )
    return None


def _profile_dir_failure(hosts, values, sources):
    """A gpufleet_profile_dir inside a folder the run's inventory (-i) is read from, where Ansible parses every file
    it does not skip as inventory: its profiles would become groups, with warnings on every run. None when none is."""
    for host in hosts:
        site_dir = values[host].get("gpufleet_profile_dir") or None
        if not _abs_path(site_dir):
            continue  # run_prepare names it
        for source in sources or []:
            folder = os.path.realpath(source)
            rel = os.path.relpath(os.path.realpath(site_dir), folder)
            parts = rel.split(os.sep)
            if not os.path.isdir(folder) or rel == "." or parts[0] == "..":
                continue
            if not any(INVENTORY_IGNORED.search(part.encode()) for part in parts):
                return (
                    "gpufleet_profile_dir for %s (%s) is inside the inventory folder %s, which Ansible reads as "
                    "inventory: its profiles would become groups, with a warning on every run; keep them beside the "
                    'inventory, for example in %s-profiles (gpufleet_profile_dir: "{{ inventory_dir }}-profiles")'
                    % (host, site_dir, source.rstrip("/"), source.rstrip("/"))
                )
    return None


def _failure(checks, hosts, values):
    """The message of the first check that fails, over every node in turn, or None."""
    for names, test, expect in checks:
        for host in hosts:
            for name in (names,) if isinstance(names, str) else names:
                if name in values[host]:
                    value = values[host][name]
                    if not test(value):
                        return "%s for %s %s; got %s" % (name, host, expect, to_json(values[host].get(name)))
    return None


def _finetune_failure(hosts, values, defaults):
    failure = _failure(FINETUNE_CHECKS, hosts, values)
    if failure:
        return failure
    for host in hosts:
        # The engine stops torchrun this margin before the timeout (gpufleet.cluster.finetune); the rendezvous must end first.
        timeout, rdzv = (values[host].get(name, defaults[name]) for name in FT_TIMEOUTS)
        margin_s = torchrun_margin_s(int(str(timeout)))
        if not int(str(rdzv)) < int(str(timeout)) - margin_s:
            return (
                "gpufleet_finetune_rdzv_timeout_s for %s (%s) must be less than gpufleet_finetune_timeout_s (%s) "
                "less its %s s margin" % (host, rdzv, timeout, margin_s)
            )
    # One job: a node with another config, step count, port or timeout would wait for a run that never comes.
    first = hosts[0]
    for host in hosts[1:]:
        for name in FT_RUN_WIDE:
            value, first_value = (values[h].get(name, defaults[name]) for h in (host, first))
            if str(value) != str(first_value):
                return (
                    "%s must be the same on every node of the fine-tune (set it for the group): %s has %s, %s has %s"
                    % (name, host, to_json(value), first, to_json(first_value))
                )
    return None


def _thresholds_failure(hosts, values):
    """The first node whose gpufleet_profile or gpufleet_thresholds the engine on the node would refuse (an unknown
    profile or key, a wrong type, a number out of the key's bounds, NaN or infinity), in the engine's own words,
    or None. Each distinct pair is checked once, with the node's site profiles (gpufleet_profile_dir) where it has
    a folder of them; a gpufleet_profile_dir that is no absolute folder is left to run_prepare, which names it."""
    seen = {}
    for host in hosts:
        profile = values[host].get("gpufleet_profile") or None
        overrides = values[host].get("gpufleet_thresholds") or {}
        site_dir = values[host].get("gpufleet_profile_dir") or None
        if profile is not None and not isinstance(profile, str):
            return "gpufleet_profile for %s must be the name of a profile of files/profiles; got %s" % (
                host,
                to_json(profile),
            )
        if site_dir is not None and not (_abs_path(site_dir) and os.path.isdir(site_dir)):
            continue
        key = json.dumps([profile, overrides, site_dir], sort_keys=True, default=str)
        if key not in seen:
            if ENGINE_MISSING:
                return "gpufleet_thresholds for %s could not be checked: %s" % (host, ENGINE_MISSING)
            try:
                profiles.resolve(None, profile_name=profile, overrides=dict(overrides), site_dir=site_dir)
                seen[key] = None
            except InputError as exc:
                seen[key] = str(exc)
        if seen[key]:
            name = "gpufleet_profile" if seen[key].startswith("gpufleet_profile") else "gpufleet_thresholds"
            return "%s for %s: %s" % (name, host, seen[key])
    return None


def _names_failure(hosts, values):
    """The first Slurm node name the report's drain lines would refuse (gpufleet_slurm_node_name), or a
    gpufleet_baseline that is no run id, or None."""
    checks = (
        ("gpufleet_slurm_node_name", lambda host, value: slurm_name(host, {host: value})),
        ("gpufleet_baseline", lambda host, value: engine_paths.safe_name(value, "gpufleet_baseline")),
    )
    for host in hosts:
        for name, check in checks:
            value = values[host].get(name)
            if value in (None, ""):
                continue
            if ENGINE_MISSING:
                return "%s for %s could not be checked: %s" % (name, host, ENGINE_MISSING)
            try:
                check(host, value)
            except InputError as exc:
                return "%s for %s: %s" % (name, host, exc)
    return None


def _run_failure(hosts, values):
    # The run tier's one check, where the controller first receives it: the registry's lookup, the node's words.
    for host in [h for h in hosts if "gpufleet_tier" in values[h]]:
        try:
            registry.run_tier(values[host]["gpufleet_tier"], "gpufleet_tier for %s" % host)
        except ValueError as exc:
            return str(exc)
    tiers = dict((host, values[host].get("gpufleet_tier", registry.DEFAULT_RUN_TIER)) for host in hosts)
    if len(set(tiers.values())) > 1:
        return "gpufleet_tier must be the same on every node of the run (set it for the group or with -e); got %s" % (
            to_json(tiers)
        )
    return _failure(RUN_CHECKS, hosts, values) or _names_failure(hosts, values) or _certify_failure(hosts, values)


def _certify_failure(hosts, values):
    """Why the run could not sign its certificates, said before any node is measured: a key file open to others or
    inside the reports folder, a signing command without its public key, both given; or None."""
    run = values[hosts[0]] if hosts else {}
    key, command = run.get("gpufleet_certify_key"), run.get("gpufleet_certify_command")
    if key and command:
        return "give gpufleet_certify_key or gpufleet_certify_command, not both"
    if command and not run.get("gpufleet_certify_pubkey"):
        return "gpufleet_certify_command needs gpufleet_certify_pubkey: the public key (PEM) of the key it signs with"
    if not key:
        return None
    if ENGINE_MISSING:
        return "gpufleet_certify_key could not be checked: %s" % ENGINE_MISSING
    try:
        check_key_file(key, [run.get("gpufleet_reports_dir") or "reports"], "gpufleet_certify_key")
    except InputError as exc:
        return str(exc)
    return None


def inputs_failure(checks, hosts, values, finetune_defaults, names=None, sources=None):
    """The first failure of the check sets named in checks, in the playbooks' order, or None.

    values: per host, the variables it sets (a variable it does not set is absent); names: per host, the names of
    all its variables (the node checks refuse a gpufleet_* name the collection does not know); sources: the
    inventory's (-i), where no gpufleet_profile_dir may be.
    """
    failure = None
    if "node" in checks:
        failure = (
            _unknown_failure(hosts, names or dict((host, ()) for host in hosts))
            or _failure(NODE_CHECKS, hosts, values)
            or _profile_dir_failure(hosts, values, sources)
            or _thresholds_failure(hosts, values)
        )
    if not failure and "validate" in checks:
        failure = _failure(VALIDATE_CHECKS, hosts, values)
    if not failure and (
        "finetune" in checks
        or ("finetune_if_set" in checks and any("gpufleet_finetune" in values[host] for host in hosts))
    ):
        failure = _finetune_failure(hosts, values, finetune_defaults)
    if not failure and "run" in checks:
        failure = _run_failure(hosts, values)
    return failure


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = task_vars["hostvars"]
        values, names = {}, {}
        for host in args["hosts"]:
            node_vars = hostvars[host]  # builds the node's variables: once per node
            values[host] = dict((name, node_vars[name]) for name in VARIABLES if name in node_vars)
            names[host] = [name for name in node_vars if name.startswith(PREFIX)]
        finetune_defaults = {}
        if {"finetune", "finetune_if_set"} & set(args["checks"]):
            with open(ROLE_DEFAULTS) as defaults_file:
                finetune_defaults = yaml.safe_load(defaults_file)
        sources = task_vars.get("ansible_inventory_sources") or []
        failure = inputs_failure(args["checks"], args["hosts"], values, finetune_defaults, names, sources)
        results.update(changed=False, hosts=len(args["hosts"]))
        if failure:
            results.update(failed=True, msg=failure)
        elif "run" in args["checks"] and args["hosts"]:
            # The run tier, as the engine reads it (registry.py): whether the runs across nodes follow its node stage.
            tier = registry.run_tier(values[args["hosts"][0]].get("gpufleet_tier"))
            results["run_tier"] = {"name": tier.name, "across_nodes": tier.across_nodes}
        return results
