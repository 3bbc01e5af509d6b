#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_hygiene
short_description: Check the host settings GPU training depends on
version_added: 0.1.0
description:
  - Runs the C(host_hygiene) check group of the gpufleet engine on the node and returns its host document.
  - The group reads the host settings that cost training throughput or stability when wrong, such as PCIe ACS on GPU
    paths, NUMA affinity and balancing, InfiniBand ports and rates, nvidia_peermem, IOMMU mode, CPU governor, fabric
    manager and the NCCL environment.
  - A failed check is data in the returned document, never a module failure.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.host_document
  - gpufleet.cluster.engine_check
  - gpufleet.cluster.node_env
seealso:
  - module: gpufleet.cluster.gpu_inventory
  - module: gpufleet.cluster.gpu_health
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check host settings, expecting 8 active 400 Gb/s InfiniBand ports
  gpufleet.cluster.host_hygiene:
    python: /opt/gpufleet/venv/bin/python
    host_name: "{{ inventory_hostname }}"
    thresholds:
      ib_ports_min: 8
      ib_rate_min_gbps: 400
  register: hygiene
"""

RETURN = r"""
ansible_facts:
  description: RV(gpufleet) again, as the fact C(gpufleet_host_hygiene).
  returned: success
  type: dict
gpufleet:
  description:
    - The host document of the C(host_hygiene) group, as C(gpufleet check --json) prints it, one result per check.
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
        - {check: infiniband, group: host_hygiene, status: fail, value: null, unit: null, threshold: null,
           reason: "6 active InfiniBand ports, expected at least 8",
           remedy: "check the cables and the subnet manager for the ports that are down", detail: {},
           class: hardware, started: "2026-11-21T21:00:00Z", seconds: 0.01}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.check_module import check_argument_spec, run_check_module

GROUP = "host_hygiene"


def build_module():
    return AnsibleModule(argument_spec=check_argument_spec(), supports_check_mode=True)


def main():
    run_check_module(build_module(), GROUP)


if __name__ == "__main__":
    main()
