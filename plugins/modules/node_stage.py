#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_stage
short_description: "Internal: one part of a node's stage on the node (the engine's gpufleet node-stage)"
version_added: 0.6.0
description:
  - Runs C(gpufleet node-stage --part PART) under O(python) on the node, the node's stage as the engine writes it
    once, and returns the part's host document. The part V(checks) takes the node lock for the run and runs the
    check groups and the error counters; the part V(benchmarks) runs the run tier's benchmarks (the engine decides
    which, from O(tier) and O(benchmarks)) and the counters after them; in check mode the part V(plan) reads who
    holds the lock, runs gpu_inventory and says what a real run would run.
  - Each step of a part is an engine process of its own with its own timeout; a step that hangs or crashes is an
    C(error) result of its group and the others keep what they measured.
  - M(gpufleet.cluster.node_validate) sends it twice a node, V(checks) then V(benchmarks), so that a node lost during
    the benchmarks keeps what the checks measured.
  - While the run holds the node (the part V(benchmarks)), every engine process of the part carries the lock in its
    environment (C(GPUFLEET_LOCK)) and stops itself when the run loses the node or is told to stop.
options:
  python:
    description: Python interpreter on the node that has the gpufleet engine (C(gpufleet_python)).
    type: path
    required: true
  part:
    description: The part of the stage.
    type: str
    required: true
    choices: [checks, benchmarks]
  host_name:
    description: The node's inventory name, recorded in its document and holding its lock.
    type: str
    required: true
  tier:
    description:
      - The run tier (C(gpufleet_tier)) as M(gpufleet.cluster.run_inputs) checked it on the controller; left out, the
        engine's default. The engine looks up what it runs.
    type: str
  benchmarks:
    description: Which of the tier's benchmarks run (C(gpufleet_benchmarks)); left out, the tier's own.
    type: list
    elements: str
  depth:
    description: The benchmarks' depth where the tier has none of its own (C(gpufleet_benchmark_depth)).
    type: str
  profile:
    description: Profile name to force (C(gpufleet_profile)).
    type: str
  thresholds:
    description: Threshold overrides (C(gpufleet_thresholds)).
    type: dict
  check_timeout_s:
    description: Seconds each check group and counter reading may run before it is killed.
    type: int
    default: 120
  benchmark_timeout_s:
    description: Seconds each benchmark may run before it is killed; the soak its duration beyond that.
    type: int
    default: 900
  soak_duration_s:
    description: Seconds of sustained load in the soak (C(gpufleet_soak_duration_s)).
    type: int
  references:
    description: What the node's figures are held against (RUN_DIR/references/HOST.json), for the part V(benchmarks).
    type: dict
  lock:
    description:
      - The node lock of the run - C(path), C(run_id), C(ttl_s) (the lease beyond the node's own benchmarks, which the
        engine adds unless C(ttl_exact)), C(ttl_exact), C(controller), C(dead_runs), C(wait_s).
    type: dict
    required: true
  release:
    description: Give the lock back once the stage is done (no later stage of the run needs the node).
    type: bool
    default: false
  timeout_s:
    description: Seconds the whole part may take; the engine and everything it started are killed then.
    type: int
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.internal
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: full
    details: The part V(plan) runs instead - nothing is taken or measured beyond the read-only gpu_inventory group.
seealso:
  - module: gpufleet.cluster.node_validate
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: The node's checks, under its lock for run r1
  gpufleet.cluster.node_stage:
    python: /opt/gpufleet/venv/bin/python
    part: checks
    host_name: "{{ inventory_hostname }}"
    lock: {path: /run/lock/gpufleet-node.lock, run_id: r1, ttl_s: 3600}
    timeout_s: 600
  register: checks
"""

RETURN = r"""
stage:
  description:
    - The part's host document (C(results), C(profile), C(versions), ...) and beside it C(lock) (the lock's answer
      for V(checks) and V(plan)), C(benchmarks) and C(depth) (what the part V(benchmarks) runs), C(done)
      (nothing is left for it) and C(released).
  returned: success
  type: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    EngineError,
    add_node_env,
    node_args,
    node_env_argument_spec,
    run_json,
)

LOCK_ENV = "GPUFLEET_LOCK"  # gpufleet.base.lock.ENV


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            part=dict(type="str", required=True, choices=["checks", "benchmarks"]),
            host_name=dict(type="str", required=True),
            tier=dict(type="str"),
            benchmarks=dict(type="list", elements="str"),
            depth=dict(type="str"),
            profile=dict(type="str"),
            thresholds=dict(type="dict"),
            check_timeout_s=dict(type="int", default=120),
            benchmark_timeout_s=dict(type="int", default=900),
            soak_duration_s=dict(type="int"),
            references=dict(type="dict"),
            lock=dict(type="dict", required=True),
            release=dict(type="bool", default=False),
            timeout_s=dict(type="int", required=True),
            **node_env_argument_spec(),
        ),
        supports_check_mode=True,
    )
    p = module.params
    add_node_env(p)
    lock = p["lock"]
    part = "plan" if module.check_mode else p["part"]
    argv = ["node-stage", "--part", part, "--python", p["python"]] + node_args(
        p["host_name"], p["profile"], p["thresholds"]
    )
    for flag, value in (("--tier", p["tier"]), ("--depth", p["depth"]), ("--soak-duration-s", p["soak_duration_s"])):
        if value:
            argv += [flag, str(value)]
    if p["benchmarks"] is not None:
        argv += ["--benchmarks"] + p["benchmarks"]
    argv += ["--check-timeout-s", str(p["check_timeout_s"]), "--benchmark-timeout-s", str(p["benchmark_timeout_s"])]
    argv += ["--run-id", lock["run_id"], "--lock-path", lock["path"], "--lock-ttl-s", str(lock.get("ttl_s") or 3600)]
    argv += ["--lock-wait-s", str(lock.get("wait_s") or 0), "--controller", json.dumps(lock.get("controller") or {})]
    argv += ["--dead-run=%s" % run for run in lock.get("dead_runs") or []]
    argv += [] if lock.get("ttl_exact") else ["--lock-ttl-plus-benchmarks"]
    argv += ["--release"] if p["release"] else []
    if p["references"] and part == "benchmarks":
        argv += ["--references", json.dumps(p["references"], sort_keys=True)]
    if part == "benchmarks":  # the run holds the node: every engine process of the part carries its lock
        os.environ[LOCK_ENV] = json.dumps(
            {"path": lock["path"], "run_id": lock["run_id"], "holder": p["host_name"], "heartbeat_timeout_s": None},
            sort_keys=True,
        )
    try:
        dummy, doc = run_json(p["python"], argv, p["timeout_s"], p["host_name"])
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(changed=False, stage=doc)


if __name__ == "__main__":
    main()
