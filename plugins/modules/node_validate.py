#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_validate
short_description: "Internal: the node stage of validate.yml in one task - lock, checks, counters, benchmarks, host document"
version_added: 0.4.0
description:
  - An action plugin. Runs the engine's node stage (C(gpufleet node-stage), written once in the engine) on the node
    in two parts, each one run of M(gpufleet.cluster.node_stage) - first the node lock (taken as
    M(gpufleet.cluster.node_take) takes it, with the takeover of a run of this controller that is gone and the bounded
    wait), the check groups and the error counters before; then the run tier's benchmarks (the engine decides which),
    the counters after and, with O(release), the lock given back. A tier without benchmarks is done in the first.
  - Why one task for the whole stage. Most of what a run costs the controller is Ansible's own work per task and per
    module it sends to a node, far more than the stage's work; one task a node that sends one module twice keeps a
    whole run near 0.15 to 0.24 s of controller CPU a node (docs/scale.md). Two module runs, not one, so that a node
    lost during the benchmarks keeps what the first run measured.
  - A node another run holds is not measured; a step that could not answer is an C(error) result of its group; a
    node lost during the benchmarks keeps what the first run measured.
  - Writes the node's host document to O(run_dir)/hosts on the controller from the task's own worker (the engine's
    writer, or C(gpufleet record --no-store) under O(controller_python) when that is another interpreter); the report
    indexes it into the store. Only a summary and the facts below go back to Ansible's main process.
  - "Prints C([HOST] gpufleet: benchmarks: NAMES) when the node's benchmarks start, for whoever watches the run."
  - Fails only when the host document could not be written; the lock is then given back.
options:
  lock:
    description:
      - The node lock - the options of M(gpufleet.cluster.node_take) (C(python), C(path), C(run_id), C(holder),
        C(ttl_s), C(controller), C(dead_runs), C(wait_s), C(controller_python), C(engine_src)).
    type: dict
    required: true
  stage:
    description:
      - The node stage's own options, those of M(gpufleet.cluster.node_stage) - C(python), C(tier), C(benchmarks),
        C(depth), C(profile), C(thresholds), C(check_timeout_s), C(benchmark_timeout_s), C(soak_duration_s).
    type: dict
    required: true
  ttl_exact:
    description: The lock's C(ttl_s) is the whole lease (C(gpufleet_lock_ttl_s)); else the engine adds the node's
      own benchmarks to it, each at its timeout.
    type: bool
    default: false
  release:
    description: Give the lock back at the end (no later stage of the run needs the node).
    type: bool
    default: false
  multinode:
    description: Whether the node wants the runs across nodes (C(gpufleet_nccl_multinode)), for RV(ansible_facts).
    type: bool
    default: true
  run_dir:
    description: The run's folder on the controller.
    type: path
    required: true
  document:
    description: The host document the results go into (its keys before any group answered).
    type: dict
    required: true
  controller_python:
    description: Python interpreter on the controller with the gpufleet engine; left out, the one running Ansible.
    type: path
  site_env:
    description:
      - Environment of the site for every engine process on the node (the site's own profiles, the checks turned
        off), beneath I(node_env), which wins where both name a variable. The module's input, never the command line.
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.internal
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: partial
    details: The lock is only read, the node runs its read-only gpu_inventory group, and no host document is written.
seealso:
  - module: gpufleet.cluster.node_stage
  - module: gpufleet.cluster.node_take
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check and benchmark the node
  gpufleet.cluster.node_validate:
    lock: {python: /opt/gpufleet/venv/bin/python, run_id: r1, holder: "{{ inventory_hostname }}"}
    stage: {python: /opt/gpufleet/venv/bin/python, tier: smoke}
    release: true
    run_dir: /srv/gpufleet/reports/r1
    document: {schema_version: 1, host: "{{ inventory_hostname }}", versions: {}, seconds: 0.0, results: []}
"""

RETURN = r"""
path:
  description: The host document written on the controller (null in check mode).
  returned: success
  type: str
steps:
  description: The parts of the node stage whose results are in it, in order (V(checks), V(benchmarks)).
  returned: success
  type: list
  elements: str
status_counts:
  description: How many of the document's results have each status.
  returned: success
  type: dict
node_lost:
  description: True when the node stopped answering (at the lock, during the checks or the benchmarks); the message says how.
  returned: when the node was lost
  type: bool
ansible_facts:
  description:
    - C(validate_node_reachable), C(validate_node_locked), C(validate_node_lock_held) (taken and not given back),
      C(validate_node_lock_results), C(validate_node_errors), C(validate_node_benchmark) (the train_gpt2 results) and
      C(validate_node_multinode) (C(wanted), C(ready), C(why)), which the later plays of validate.yml read.
  returned: success
  type: dict
"""
