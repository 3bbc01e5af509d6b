#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_counters
short_description: Snapshot the error counters of a node's NVIDIA GPUs and its fabric before or after its benchmarks
version_added: 0.2.0
description:
  - Runs C(gpufleet counters --phase PHASE --json) on the node and returns its host document, whose one result (group
    C(counters), check C(snapshot_before) or C(snapshot_after)) lists every GPU NVML sees with its cumulative error
    counters, ECC (volatile and aggregate, corrected and uncorrected), row remapping, NVLink CRC, replay and recovery,
    PCIe replay, and the number of Xid events of that GPU in this boot's kernel log.
  - A second result (check C(fabric_before) or C(fabric_after)) lists every InfiniBand port with the counters of its
    C(counters/) and C(hw_counters/) folders, and every GPU, HCA and PCIe bridge between each and its root port with
    its AER counts (correctable, non-fatal, fatal); C(skip) with the reason on a node with neither.
  - Run it before and after the node's benchmarks. The report's fleet layer judges how much each counter grew during
    the run and since the node's previous run, per hour; this module only reads.
  - Each GPU carries C(visible), whether the node's C(CUDA_VISIBLE_DEVICES) leaves it to the node, and the result
    the boot id, so two snapshots across a reboot are not subtracted.
  - The result is C(pass) when the counters were read (a counter that could not be read is null and named in
    C(detail.unreadable)), C(error) when NVML could not be read, C(skip) on a node without an NVIDIA driver.
  - The module fails only when the engine could not run (missing interpreter, engine not installed, bad input,
    timeout).
options:
  phase:
    description:
      - Whether the snapshot is taken V(before) or V(after) the node's benchmarks; it names the result
        (C(snapshot_before), C(snapshot_after)).
    type: str
    choices: [before, after]
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.host_document
  - gpufleet.cluster.engine_check
  - gpufleet.cluster.node_env
seealso:
  - module: gpufleet.cluster.gpu_health
  - module: gpufleet.cluster.benchmark
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Counters before the benchmarks
  gpufleet.cluster.gpu_counters:
    phase: before
    python: /opt/gpufleet/venv/bin/python
    host_name: "{{ inventory_hostname }}"
  register: counters_before

- name: Benchmark the node
  gpufleet.cluster.benchmark:
    python: /opt/gpufleet/venv/bin/python
    benchmarks: [matmul, memory, nccl]
    host_name: "{{ inventory_hostname }}"

- name: Counters after the benchmarks
  gpufleet.cluster.gpu_counters:
    phase: after
    python: /opt/gpufleet/venv/bin/python
    host_name: "{{ inventory_hostname }}"
  register: counters_after
"""

RETURN = r"""
gpufleet:
  description:
    - The host document of the C(counters) group, as C(gpufleet counters --json) prints it.
    - Its keys, and those of each result, are the engine's host document, described once in the collection's
      C(docs/modules.md) (What the modules return).
  returned: success
  type: dict
  contains:
    results:
      description:
        - The GPUs' snapshot, C(snapshot_before) or C(snapshot_after), then the fabric's, C(fabric_before) or
          C(fabric_after) (C(detail.devices), C(detail.unreadable)). After the benchmarks a third result,
          C(processes_after), lists the GPUs' processes again (as C(gpu_health.processes) does before) and fails on
          any.
        - The snapshot's C(detail) holds C(phase), C(read_at) (UTC), C(boot_id), C(gpus) (each with C(index), C(uuid),
          C(serial), C(pci_bus_id), C(visible) and C(counters)) and C(unreadable) (C(<index>.<counter>) to the reason
          it could not be read).
      type: list
      elements: dict
      sample:
        - check: snapshot_before
          group: counters
          status: pass
          value: 8
          unit: GPUs
          threshold: null
          reason: counters of 8 GPUs read before the benchmarks
          remedy: null
          detail:
            phase: before
            read_at: "2026-11-23T10:00:00Z"
            boot_id: 3f0c1f8e-2d4b-4a8e-9a43-6c7e0c1d2b55
            gpus:
              - index: 0
                uuid: GPU-df63b106-711b-65ab-d334-1175fcbc7655
                serial: "1653724058331"
                pci_bus_id: "0000:18:00.0"
                visible: true
                counters:
                  ecc_corrected_volatile: 0
                  ecc_uncorrected_volatile: 0
                  ecc_corrected_aggregate: 0
                  ecc_uncorrected_aggregate: 0
                  row_remap_correctable: 0
                  row_remap_uncorrectable: 0
                  row_remap_pending: 0
                  row_remap_failure: 0
                  nvlink_crc_data: 216
                  nvlink_crc_flit: 0
                  nvlink_replay: 0
                  nvlink_recovery: 0
                  pcie_replay: 0
                  xid: 0
            unreadable: {}
          class: null
          started: "2026-11-23T10:00:00Z"
          seconds: 0.2
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.check_module import (
    counters_argument_spec,
    run_counters_module,
)


def main():
    run_counters_module(AnsibleModule(argument_spec=counters_argument_spec(), supports_check_mode=True))


if __name__ == "__main__":
    main()
