#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_inputs
short_description: "Internal: check every node's variables on the controller in one task, before any node is touched"
version_added: 0.3.0
description:
  - Reads each node's variables once (C(hostvars)) and checks them on the controller, in the task's worker (an action
    plugin; no module process), so that the controller pays for one task and reads each node's variables once, not
    once for each variable checked.
  - The checks run in the order of O(checks), each over every node of O(hosts) in turn; the first that fails fails
    the task with a message that names the variable, the node and the value it has (as JSON), and what was expected.
  - A variable a node leaves unset passes, except that the fine-tune checks take the validate_node role's defaults
    for it.
options:
  hosts:
    description: The nodes of the run, in inventory order; the first gives the run-wide fine-tune settings.
    type: list
    elements: str
    required: true
  checks:
    description:
      - The sets of checks to apply.
      - V(node) - first, every C(gpufleet_*) variable of each node is one the collection knows (from its roles'
        argument specs and defaults, the facts its playbooks and modules set); one it does not know is refused with
        the known name nearest to it. Then C(gpufleet_python), C(gpufleet_thresholds), C(gpufleet_node_env) (every
        playbook that runs on the nodes); C(gpufleet_profile_dir) outside the folders the inventory is read from;
        then C(gpufleet_profile) and C(gpufleet_thresholds) against the collection's profiles (files/profiles), as the
        engine on the node holds them - an unknown profile or key, a wrong type, a number outside the key's bounds,
        NaN or infinity - in the engine's own words.
      - V(validate) - C(gpufleet_check_timeout_s), C(gpufleet_benchmarks), C(gpufleet_benchmark_depth),
        C(gpufleet_nccl_multinode), C(gpufleet_nccl_master_port), C(gpufleet_benchmark_timeout_s),
        C(gpufleet_nccl_timeout_s) (validate.yml).
      - V(finetune) - C(gpufleet_finetune) and the C(gpufleet_finetune_*) variables; the rendezvous must end inside the
        fine-tune timeout less the engine's margin, and the config, step count, port and timeouts must be the same on
        every node.
      - V(finetune_if_set) - the V(finetune) checks when a node sets C(gpufleet_finetune) (validate.yml, where the
        fine-tune is optional).
      - V(run) - C(gpufleet_tier) (a run tier of the engine's registry, the same on every node; its one check, which
        the nodes trust), C(gpufleet_soak_duration_s),
        C(gpufleet_lock_path), C(gpufleet_lock_wait_s), C(gpufleet_lock_ttl_s), C(gpufleet_lock_heartbeat_timeout_s);
        what the run's start and its report read - C(gpufleet_resume), C(gpufleet_baseline_set), C(gpufleet_history_db),
        C(gpufleet_controller_python), C(gpufleet_slurm_node_name) (a name the drain lines take), C(gpufleet_baseline)
        (a run id).
    type: list
    elements: str
    choices: [node, validate, finetune, finetune_if_set, run]
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.internal
attributes:
  check_mode:
    support: full
    details: It only reads variables.
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check every node's variables
  run_once: true
  delegate_to: localhost
  gpufleet.cluster.run_inputs:
    hosts: "{{ gpufleet_validate_hosts }}"
    checks: [node, validate, finetune_if_set, run]
"""

RETURN = r"""
hosts:
  description: How many nodes were checked.
  returned: always
  type: int
msg:
  description: The first check that failed, naming the variable, the node and its value.
  returned: failed
  type: str
run_tier:
  description: The run's tier as the engine reads it - C(name) and C(across_nodes) (the runs across nodes follow it).
  returned: with the V(run) checks, when they pass
  type: dict
"""
