#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_steps
short_description: Run several of the node's gpufleet modules in one task, each keeping its own outcome
version_added: 0.3.0
description:
  - Runs each step's module on the node, one after another, from one task (an action plugin), so that the controller
    pays for one task and not for one for each module.
  - A step whose module could not answer, or during which the node was lost, becomes an C(error) result of its group
    (check C(engine)) in RV(errors); the documents of the steps before it stay in RV(docs). A node lost during a step
    makes the task unreachable, after the remaining steps were tried as each would have been on its own.
options:
  steps:
    description:
      - The steps, in order. Each has C(module) (one of gpu_inventory, gpu_health, host_hygiene, gpu_counters, benchmark
        of gpufleet.cluster), C(args) (that module's arguments), optionally C(name) (its name in RV(steps); default
        the module) and C(after_benchmark) (true - skipped when the node was lost during the benchmark step).
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Each module is run in check mode and answers as it does then.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
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
docs:
  description: The host documents of the steps that answered, in the order of the steps.
  returned: always
  type: list
  elements: dict
steps:
  description: The name of each step whose document is in RV(docs), in the same order.
  returned: always
  type: list
  elements: str
errors:
  description: One C(error) result (gpufleet's result schema) for each step that could not answer, naming its group.
  returned: always
  type: list
  elements: dict
"""
