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
  - gpufleet.cluster.engine_check
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
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
  description: The same host document as RV(gpufleet), as the fact C(gpufleet_gpu_health).
  returned: success
  type: dict
  contains:
    gpufleet_gpu_health:
      description: The host document of the C(gpu_health) group.
      type: dict
gpufleet:
  description:
    - The host document of the C(gpu_health) group, as C(gpufleet check --json) prints it.
    - Its C(results) list holds one result per check with the keys of C(gpufleet.base.schema.result).
  returned: success
  type: dict
  contains:
    schema_version:
      description: Version of the result schema.
      type: int
      sample: 1
    host:
      description: Host name the document is for (O(host_name) when given).
      type: str
      sample: node0
    engine_version:
      description: Version of the gpufleet engine that ran the checks.
      type: str
      sample: 0.1.0
    profile:
      description: The threshold profile used, with every threshold's value and source.
      type: dict
    versions:
      description: Driver, CUDA, NVML, kernel, OS and Python versions seen on the node.
      type: dict
    machine:
      description: The machine's system, board and chassis identity (DMI), each field not read with why.
      type: dict
    started:
      description: UTC time the checks started.
      type: str
      sample: "2026-11-21T21:00:00Z"
    seconds:
      description: Wall time of the checks in seconds.
      type: float
    results:
      description:
        - One entry per check with C(check), C(group), C(status) (pass, info, warn, fail, skip or error), C(value), C(unit),
          C(threshold), C(reason), C(remedy), C(detail), C(class), C(started) and C(seconds).
        - C(class) is the failure class of a C(warn), C(fail) or C(error) result, one of V(hardware), V(environment),
          V(configuration) or V(software) (C(gpufleet.base.failure_class)); null for the other statuses.
      type: list
      elements: dict
      sample:
        - check: ecc
          group: gpu_health
          status: fail
          value: null
          unit: null
          threshold: null
          reason: "GPU 3: 2 volatile uncorrectable ECC errors"
          remedy: "drain the node, then reset the GPU with no process on it: `nvidia-smi -r -i 3`"
          detail: {}
          class: hardware
          started: "2026-11-21T21:00:00Z"
          seconds: 0.01
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
