#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark
short_description: Run the gpufleet benchmarks on a node (matmul, HBM and PCIe bandwidth, NCCL collectives)
version_added: 0.1.0
description:
  - Runs C(python -m gpufleet bench NAMES --json --each-timeout-s TIMEOUT_S) on the node and returns one host
    document whose results have the group C(benchmark).
  - C(matmul) measures dense matrix products on every GPU at once, C(memory) HBM copy and PCIe host/device bandwidth,
    C(nccl) the collectives (all-reduce, all-gather, reduce-scatter, all-to-all) under torchrun, with bus bandwidth
    following nccl-tests, and inside a node the send/recv bandwidth of every GPU pair; C(train_gpt2) trains a
    GPT-2-small-shaped model on random tokens on one GPU and then on all of them (DDP), for tokens/s per GPU, MFU
    and the scaling efficiency.
  - With O(nnodes) greater than 1 the NCCL benchmark and C(train_gpt2) run across hosts. Run the module on every host
    of the run at the same time (C(async) with C(poll=0), then C(async_status)), each with its own O(node_rank), all
    with the same O(master_addr) and O(master_port).
  - Across hosts C(train_gpt2) runs on every GPU of every host at once, with no one-GPU run first; its scaling
    efficiency (result C(train_scaling)) is the per-GPU throughput across the hosts over this host's own single-node
    figure, given as O(train_reference). Without one that has a figure, C(train_scaling) is an C(error) that says
    which figure is missing.
  - The engine runs each benchmark in a process of its own with its own O(timeout_s). A benchmark that passes it is
    killed with its whole process group, and one that crashes or prints no document becomes an C(error) result with
    the stderr tail; the other benchmarks keep what they measured.
  - With both V(matmul) and V(sdc) in O(benchmarks), V(sdc) runs in V(matmul)'s engine process, at its place, and its
    computations run in the matmul workers right after their timed products (one start of torch and CUDA per GPU,
    not two); that run may take O(timeout_s) for each of the two, and if it is killed both are C(error).
  - The module fails only when the engine cannot run at all (missing interpreter, engine not installed, input it
    refuses such as an unknown threshold), with a C(msg) that says why and a C(remedy).
  - A result below its threshold is data in the returned document (status C(fail)), never a module failure. On a
    node without CUDA the benchmarks run on the CPU at tiny sizes (gloo for NCCL) and their results are C(skip),
    a logic check and not a performance figure.
options:
  python:
    description:
      - Path on the node of the Python interpreter that has the gpufleet engine and torch installed (C(gpufleet_python)).
    type: path
    required: true
  benchmarks:
    description:
      - The benchmarks to run, in this order; the engine's (C(gpufleet bench --help) lists them), which refuses a
        name it does not know, naming the ones it does.
      - With O(nnodes) greater than 1 only those that run across hosts (V(nccl), V(train_gpt2)) are allowed.
      - V(soak) is sustained load for O(soak_duration_s) while a sampler watches every GPU.
      - V(sdc) runs seeded bf16 and fp32 products and a few training steps on every GPU and compares their hashes.
    type: list
    elements: str
    required: true
  depth:
    description:
      - How much each benchmark measures, one of the engine's depths (C(gpufleet bench --help)) - V(smoke) a short pass
        of each; V(quick) a few sizes and shapes (minutes for a node); V(thorough) sweeps them all.
      - Left out, the engine's default depth.
    type: str
  timeout_s:
    description:
      - Seconds each benchmark may run. Past it the engine's whole process group is killed and the benchmark is an
        C(error) result.
      - For V(nccl) and V(train_gpt2) the engine kills torchrun itself a little earlier (a quarter of O(timeout_s), a minute at
        most, 10 s at least), so that a hang is reported as C(fail) with the torchrun log tail.
    type: int
    default: 900
  nnodes:
    description:
      - Number of hosts in the run of V(nccl) or V(train_gpt2). 1 runs inside this node.
    type: int
    default: 1
  node_rank:
    description:
      - This host's rank in the run across hosts, 0 to O(nnodes) - 1; rank 0 is the master.
    type: int
    default: 0
  master_addr:
    description:
      - Address of the rank 0 host, which every host of the run across hosts dials for the rendezvous.
    type: str
    default: 127.0.0.1
  master_port:
    description:
      - TCP port of the rendezvous on O(master_addr); it must be open between the hosts.
      - Left out with O(nnodes=1), a free local port is used, so several runs on one machine do not collide.
    type: int
  train_reference:
    description:
      - This host's own single-node C(benchmark.train_gpt2) result from earlier in the run (as the module returned
        it, or as the host document holds it). Used only by V(train_gpt2) with O(nnodes) greater than 1, whose
        scaling efficiency is the per-GPU throughput across the hosts over this result's C(value).
      - Left out, or without a C(value) (that run failed), the C(train_scaling) result is an C(error) naming the
        missing figure.
    type: dict
  references:
    description:
      - What this host's figures are held against, as C(gpufleet references) writes it for a run (its baseline
        run's figures, its GPUs' place among their siblings in its earlier runs, the baseline run's fleet medians).
        A figure past one of them is measured again on the host, so that a warning or a failure never rests on one
        measurement. Used with O(nnodes=1) only.
    type: dict
  soak_duration_s:
    description:
      - Seconds of sustained load for V(soak); left out, the engine's default. O(timeout_s) must leave room for it.
    type: int
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.host_document
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: partial
    details:
      - The module changes nothing on the node, but benchmarks load its GPUs for minutes. In check mode nothing runs
        and the module returns C(skipped) with a message and a document of C(skip) results.
notes:
  - Across nodes, one host that does not come (down, firewalled rendezvous port) makes every other host wait for it
    until the timeout; each then reports C(fail) with the torchrun log tail.
seealso:
  - module: gpufleet.cluster.gpu_health
  - module: gpufleet.cluster.fleet_report
requirements:
  - The gpufleet engine (Python >= 3.10) and torch installed under O(python) on the node.
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Benchmark one node
  gpufleet.cluster.benchmark:
    python: /opt/gpufleet/venv/bin/python
    benchmarks: [matmul, memory, nccl]
    depth: quick
    timeout_s: 900
    host_name: "{{ inventory_hostname }}"
  register: bench

- name: Start NCCL across every node of the play at once
  gpufleet.cluster.benchmark:
    python: /opt/gpufleet/venv/bin/python
    benchmarks: [nccl]
    host_name: "{{ inventory_hostname }}"
    nnodes: "{{ ansible_play_hosts | length }}"
    node_rank: "{{ ansible_play_hosts.index(inventory_hostname) }}"
    master_addr: "{{ hostvars[ansible_play_hosts[0]].ansible_host }}"
    master_port: 29511
    timeout_s: 600
  async: 660
  poll: 0
  register: nccl_job

- name: Wait for it on every node
  ansible.builtin.async_status:
    jid: "{{ nccl_job.ansible_job_id }}"
  register: nccl
  until: nccl is finished
  retries: 230
  delay: 3

- name: Then train GPT-2-small across the same nodes, against each node's own single-node figure
  gpufleet.cluster.benchmark:
    python: /opt/gpufleet/venv/bin/python
    benchmarks: [train_gpt2]
    host_name: "{{ inventory_hostname }}"
    nnodes: "{{ ansible_play_hosts | length }}"
    node_rank: "{{ ansible_play_hosts.index(inventory_hostname) }}"
    master_addr: "{{ hostvars[ansible_play_hosts[0]].ansible_host }}"
    master_port: 29511
    timeout_s: 600
    # The node's train_gpt2 result from a run of this module inside the node (benchmarks [train_gpt2]).
    train_reference: "{{ bench.gpufleet.results | selectattr('check', 'equalto', 'train_gpt2') | first }}"
  async: 660
  poll: 0
  register: train_job
"""

RETURN = r"""
msg:
  description: Why nothing ran (check mode).
  returned: when skipped
  type: str
  sample: "benchmarks not run in check mode: they load the GPUs; run without --check to measure"
gpufleet:
  description:
    - One host document for all the benchmarks that ran, as C(gpufleet bench --json) prints it; C(engine_version) is
      null when no benchmark answered.
    - Its keys, and those of each result, are the engine's host document, described once in the collection's
      C(docs/modules.md) (What the modules return).
  returned: always
  type: dict
  contains:
    results:
      description:
        - The results of every benchmark, group C(benchmark), each with C(trust), how far its figure can be trusted.
          A benchmark that timed out or crashed is one C(error) result named after it, carrying the command, exit
          code and stderr tail in C(detail).
        - C(detail) keeps the raw measurements and the method (warm-up, iterations, sizes, timer, versions); the NCCL
          results carry C(rows), one per message size with C(size_bytes), C(algbw_gbps), C(busbw_gbps) and C(correct).
      type: list
      elements: dict
      sample:
        - {check: matmul_bf16, group: benchmark, status: pass, value: 779.2, unit: TFLOPS,
           threshold: {key: matmul_bf16_tflops_min, value: 700, min: 700,
                       source: "about 795 TFLOPS is the best bf16 matmul reached on H100 SXM"},
           reason: "slowest GPU bf16 matmul 779.2 TFLOPS (minimum 700)", remedy: null, detail: {}, class: null,
           trust: clean, started: "2026-11-21T21:00:00Z", seconds: 41.2}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.benchmark_module import (
    benchmark_argument_spec,
    run_benchmark_module,
)


def build_module():
    return AnsibleModule(argument_spec=benchmark_argument_spec(), supports_check_mode=True)


def main():
    run_benchmark_module(build_module())


if __name__ == "__main__":
    main()
