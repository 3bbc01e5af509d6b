#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Check the health of a node's NVIDIA GPUs
version_added: 0.1.0
description:
  - Runs the C(gpu_health) check group of the gpufleet engine on the node and returns its host document.
  - The group looks for what makes a GPU unfit for training, each held against the node's threshold profile, such as
    ECC errors, pending row remaps and retired pages, Xid events in the kernel log, throttling, temperature, power
    limit, PCIe link and NVLink state.
  - A failed check is data in the returned document, never a module failure.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.host_document
  - gpufleet.cluster.engine_check
  - gpufleet.cluster.node_env
seealso:
  - module: gpufleet.cluster.gpu_inventory
  - module: gpufleet.cluster.host_hygiene
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check GPU health with a forced profile and a longer timeout
  gpufleet.cluster.gpu_health:
    python: /opt/gpufleet/venv/bin/python
    profile: h100-sxm
    timeout_s: 300
    host_name: "{{ inventory_hostname }}"
  register: health
"""

RETURN = r"""
ansible_facts:
  description: RV(gpufleet) again, as the fact C(gpufleet_gpu_health).
  returned: success
  type: dict
gpufleet:
  description:
    - The host document of the C(gpu_health) group, as C(gpufleet check --json) prints it, one result per check.
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
        - {check: ecc, group: gpu_health, status: fail, value: null, unit: null, threshold: null,
           reason: "GPU 3: 2 volatile uncorrectable ECC errors",
           remedy: "drain the node, then reset the GPU with no process on it: `nvidia-smi -r -i 3`", detail: {},
           class: hardware, started: "2026-11-21T21:00:00Z", seconds: 0.01}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.check_module import check_argument_spec, run_check_module

GROUP = "gpu_health"


def build_module():
    return AnsibleModule(argument_spec=check_argument_spec(), supports_check_mode=True)


def main():
    run_check_module(build_module(), GROUP)


if __name__ == "__main__":
    main()
