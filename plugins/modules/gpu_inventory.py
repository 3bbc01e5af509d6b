#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_inventory
short_description: Check that a node has the NVIDIA GPUs, driver and links its profile expects
version_added: 0.1.0
description:
  - Runs the C(gpu_inventory) check group of the gpufleet engine on the node and returns its host document.
  - The group compares what the driver reports with the node's threshold profile (GPU count and model, memory size,
    driver and VBIOS versions, persistence mode, MIG mode and compute mode).
  - A failed check is data in the returned document, never a module failure.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.host_document
  - gpufleet.cluster.engine_check
  - gpufleet.cluster.node_env
seealso:
  - module: gpufleet.cluster.gpu_health
  - module: gpufleet.cluster.host_hygiene
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Inventory the GPUs
  gpufleet.cluster.gpu_inventory:
    python: /opt/gpufleet/venv/bin/python
    host_name: "{{ inventory_hostname }}"
    thresholds:
      gpus_expected: 8
  register: inventory

- name: Show what did not pass
  ansible.builtin.debug:
    msg: "{{ inventory.gpufleet.results | rejectattr('status', 'equalto', 'pass') | list }}"
"""

RETURN = r"""
ansible_facts:
  description: RV(gpufleet) again, as the fact C(gpufleet_gpu_inventory).
  returned: success
  type: dict
gpufleet:
  description:
    - The host document of the C(gpu_inventory) group, as C(gpufleet check --json) prints it, one result per check.
    - Its keys, and those of each result, are the engine's host document, described once in the collection's
      C(docs/modules.md) (What the modules return).
  returned: success
  type: dict
  contains:
    results:
      description: One result per check of the group; a check that failed is a result, not a module failure.
      type: list
      elements: dict
      sample:
        - {check: gpu_count, group: gpu_inventory, status: error, value: null, unit: null, threshold: null,
           reason: "no NVIDIA driver: libnvidia-ml.so not found",
           remedy: "install the NVIDIA driver (bringup.yml, role nvidia_driver) or run on a GPU node", detail: {},
           class: software, started: "2026-11-21T21:00:00Z", seconds: 0.01}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.check_module import check_argument_spec, run_check_module

GROUP = "gpu_inventory"


def build_module():
    return AnsibleModule(argument_spec=check_argument_spec(), supports_check_mode=True)


def main():
    run_check_module(build_module(), GROUP)


if __name__ == "__main__":
    main()
