#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_steps
short_description: "Internal: run several of the node's gpufleet modules on the node in one module run, each keeping its own outcome"
version_added: 0.3.0
description:
  - Runs several of the collection's node modules (node_lock, gpu_inventory, gpu_health, host_hygiene, gpu_counters,
    benchmark) one after another in one module process on the node, and returns, for each, what that module would
    have returned had it been sent alone.
  - Why one module for several. Most of what a run costs the controller is Ansible's own work per task and per module
    it sends to a node (a worker forked, the module sent, its result copied back into the main process), far more
    than the modules' work. The node stage of validate.yml (M(gpufleet.cluster.node_validate), one task a node)
    sends this module twice a node instead of seven modules, which keeps a whole run near 0.15 to 0.24 s of
    controller CPU a node (docs/scale.md, tools/controller_cost.py).
  - How. Every module file of the collection only builds an AnsibleModule and hands it to its body, a function of
    module_utils that reads C(params) and C(check_mode) and answers with C(exit_json) or C(fail_json). Each step's
    arguments are checked against its module's argument spec, as AnsibleModule checks them, and its body is called
    with a stand-in that has the same four members and hands the answer back instead of printing it and exiting. The
    bodies are the modules' own, unchanged.
  - A step that fails (its module would have failed) is returned with C(failed) and its message; the steps after it
    still run.
  - A C(node_lock) step that does not leave the lock held by this run (another run holds it, or the lock could not
    be taken) ends the list there, as nothing is measured on a node this run does not hold.
  - Once whoever started it is gone (the run was stopped), no further step runs but a C(node_lock) step that gives
    the lock back.
  - While the run holds the node lock (O(lock)), every engine process a step starts carries it in its environment
    (C(GPUFLEET_LOCK)). Such a process does not start once the run no longer holds the lock, stops itself when the
    run loses it or is told to stop, and a run that would take a stale lock over finds it and waits for it to end.
options:
  steps:
    description:
      - The steps, in order. Each has C(module) (one of node_lock, gpu_inventory, gpu_health, host_hygiene,
        gpu_counters, benchmark) and C(args) (that module's arguments), and optionally C(name) (its name in
        RV(steps); default the module).
    type: list
    elements: dict
    required: true
  lock:
    description:
      - The node lock of the run (C(path), C(run_id), C(holder)), held from a C(node_lock) step of the list that takes
        it, or from the start when the list has none (the run took it before).
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.internal
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: full
    details: Each step runs as its module does in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.cluster.node_lock
  - module: gpufleet.cluster.gpu_inventory
  - module: gpufleet.cluster.benchmark
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: "Run the check groups on the node: gpu_inventory, gpu_health"
  gpufleet.cluster.node_steps:
    steps:
      - {module: gpu_inventory, args: {python: /opt/gpufleet/venv/bin/python, host_name: "{{ inventory_hostname }}"}}
      - {module: gpu_health, args: {python: /opt/gpufleet/venv/bin/python, host_name: "{{ inventory_hostname }}"}}
  register: checks
"""

RETURN = r"""
steps:
  description:
    - One entry a step that ran, in order, with C(name), C(module) and C(result) (what that module would have
      returned; a host document under C(gpufleet) for the check, counter and benchmark steps).
  returned: always
  type: list
  elements: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.gpufleet.cluster.plugins.module_utils.benchmark_module import (
    benchmark_argument_spec,
    run_benchmark_module,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.check_module import (
    check_argument_spec,
    counters_argument_spec,
    run_check_module,
    run_counters_module,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    add_node_env,
    controller_gone,
    node_env_argument_spec,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import CHECK_GROUPS
from ansible_collections.gpufleet.cluster.plugins.module_utils.lock_module import (
    lock_module_argument_spec,
    run_lock_module,
)

LOCK_ENV = "GPUFLEET_LOCK"  # gpufleet.lock.ENV

# How one module run holds several modules (DOCUMENTATION, "How"): for each step
#   1. its arguments are checked against its module's argument spec (ArgumentSpecValidator, as AnsibleModule does);
#   2. its module's body is called with a StepModule: params and check_mode as AnsibleModule has them, and
#      exit_json / fail_json that raise StepDone carrying the answer instead of printing it and ending the process;
#   3. that answer is the step's entry in RV(steps): what the module would have returned had it been sent alone.
# So the bodies run unchanged, one after another, in this one process.


def _check_group_body(group):
    return lambda module: run_check_module(module, group)


# Each step's module: its arguments and its body (engine_schema.STEP_GROUPS names them all).
STEPS = dict(
    [("node_lock", (lock_module_argument_spec, run_lock_module))]
    + [(g, (check_argument_spec, _check_group_body(g))) for g in CHECK_GROUPS]
    + [
        ("gpu_counters", (counters_argument_spec, run_counters_module)),
        ("benchmark", (benchmark_argument_spec, run_benchmark_module)),
    ]
)


class StepDone(Exception):
    """A step's module body answered (exit_json or fail_json): its result."""

    def __init__(self, result):
        super().__init__()
        self.result = result


class StepModule:
    """The part of AnsibleModule a module body uses (params, check_mode, exit_json, fail_json), for a step run
    inside this module: its answer is raised as StepDone, not printed."""

    def __init__(self, params, check_mode):
        self.params = params
        self.check_mode = check_mode

    def exit_json(self, **result):
        raise StepDone(result)

    def fail_json(self, **result):
        raise StepDone(dict(result, failed=True))


def run_step(module_name, args, check_mode):
    """What the step's module would have returned."""
    spec, body = STEPS[module_name]
    checked = ArgumentSpecValidator(spec()).validate(args or {})
    if checked.error_messages:
        return {"failed": True, "msg": "%s: %s" % (module_name, "; ".join(checked.error_messages))}
    try:
        body(StepModule(checked.validated_parameters, check_mode))
    except StepDone as done:
        return done.result
    return {"failed": True, "msg": "%s ended without an answer" % module_name}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            steps=dict(type="list", elements="dict", required=True), lock=dict(type="dict"), **node_env_argument_spec()
        ),
        supports_check_mode=True,
    )
    add_node_env(module.params)
    steps = module.params["steps"]
    spec = module.params["lock"]
    marker = (
        json.dumps(
            {"path": spec["path"], "run_id": spec["run_id"], "holder": spec["holder"], "heartbeat_timeout_s": None},
            sort_keys=True,
        )
        if spec
        else None
    )
    held = not any(
        s.get("module") == "node_lock" and (s.get("args") or {}).get("state", "acquired") == "acquired" for s in steps
    )
    ran = []
    for step in steps:
        name = step.get("module")
        if name not in STEPS:
            module.fail_json(msg="step module %r is none of %s" % (name, ", ".join(STEPS)))
        if controller_gone() and not (name == "node_lock" and (step.get("args") or {}).get("state") == "released"):
            continue  # nobody will read it (the run was stopped): nothing more is measured, a lock is still given back
        if marker and held and name != "node_lock":
            os.environ[LOCK_ENV] = marker  # what the engine processes of this step carry (run_engine copies it)
        else:
            os.environ.pop(LOCK_ENV, None)
        result = run_step(name, step.get("args"), module.check_mode)
        ran.append({"name": step.get("name") or name, "module": name, "result": result})
        args = step.get("args") or {}
        if name == "node_lock" and args.get("state", "acquired") == "acquired" and not module.check_mode:
            held = bool(result.get("acquired")) and not result.get("failed")
            if not held:
                break  # nothing is measured on a node this run does not hold
    module.exit_json(changed=False, steps=ran)


if __name__ == "__main__":
    main()
