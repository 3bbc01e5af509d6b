#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: finetune
short_description: Run this node's share of the gpufleet LoRA fine-tune under torchrun
version_added: 0.1.0
description:
  - Runs C(python -m gpufleet finetune --config CONFIG --nnodes N --node-rank R --master-addr A --master-port P --json)
    on the node and returns the host document it prints, whose result C(finetune.finetune) holds the losses, the eval
    loss, tokens/s per GPU, MFU (against the bf16 peak of O(profile)), the adapter written and, for a run that
    failed, which rank or node failed and why.
  - With O(nnodes) greater than 1 the fine-tune runs across hosts. Run the module on every host of the run at the
    same time (C(async) with C(poll=0), then C(async_status)), each with its own O(node_rank), all with the same
    O(config), O(max_steps), O(master_addr) and O(master_port).
  - The engine kills torchrun a little before O(timeout_s) (a quarter of it earlier, 10 s to a minute) and reports
    the hang as a C(fail) with the torchrun log tail; past O(timeout_s) the module kills the engine's whole process
    group itself and returns an C(error) result.
  - The module fails only when the engine cannot run at all (missing interpreter, engine not installed, input it
    refuses such as a config that does not load), with a C(msg) that says why and a C(remedy).
  - A fine-tune whose loss did not go down, or a run that lost a node, is data in the returned document (status
    C(fail)), never a module failure. On a node without CUDA the run is a logic check on the CPU (gloo) and its
    result is C(skip), not a performance figure.
options:
  python:
    description:
      - Path on the node of the Python interpreter that has the gpufleet engine, torch, transformers, peft and
        datasets installed (C(gpufleet_python)).
    type: path
    required: true
  config:
    description:
      - Path on the node of the fine-tune config (the collection's C(files/configs/*.yml)).
      - Paths inside the config (data, DeepSpeed JSON) resolve beside it.
    type: path
    required: true
  nnodes:
    description:
      - Number of hosts in the run. 1 runs on this node alone.
    type: int
    default: 1
  node_rank:
    description:
      - This host's rank in the run, 0 to O(nnodes) - 1; rank 0 is the master.
    type: int
    default: 0
  master_addr:
    description:
      - Address of the rank 0 host, which every host of the run dials for the rendezvous.
    type: str
    default: 127.0.0.1
  master_port:
    description:
      - TCP port of the rendezvous on O(master_addr); it must be open between the hosts.
    type: int
    default: 29513
  nproc_per_node:
    description:
      - Ranks on this host. Left out, one per GPU the node shows (C(CUDA_VISIBLE_DEVICES) narrows them), one without.
    type: int
  max_steps:
    description:
      - Optimizer steps, overriding C(training.max_steps) of the config. Left out or V(0), the config's.
    type: int
  output_dir:
    description:
      - Where the adapter and the TensorBoard logs go on the node, overriding C(training.output_dir) of the config.
    type: path
  timeout_s:
    description:
      - Seconds the run may take on this host. Past it the engine's whole process group is killed.
    type: int
    default: 3600
  rdzv_timeout_s:
    description:
      - Seconds torchrun waits for every host to join. Left out, C(distributed.rdzv_timeout_s) of the config.
      - Must be less than the engine's own limit inside O(timeout_s).
    type: int
  env:
    description:
      - "Environment variables added to the engine's environment, and so to torchrun's and every rank's, for example
        C({CUDA_VISIBLE_DEVICES: '0,1,2,3', NCCL_SOCKET_IFNAME: eth0})."
      - Names must be shell variable names; values are strings, numbers or booleans.
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.host_document
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: partial
    details:
      - The fine-tune writes an adapter and loads the GPUs for minutes. In check mode nothing runs and the module
        returns C(skipped) with a message and a document with one C(skip) result.
notes:
  - Across nodes, a host that does not come (down, firewalled rendezvous port) makes the others wait for it until
    O(rdzv_timeout_s); a host that dies during the run makes the others fail at their next collective, and their
    result names the address of the rank they lost.
seealso:
  - module: gpufleet.cluster.benchmark
  - module: gpufleet.cluster.fleet_report
requirements:
  - The gpufleet engine (Python >= 3.10) with torch, transformers, peft and datasets under O(python) on the node.
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fine-tune on this node alone, a few steps
  gpufleet.cluster.finetune:
    python: /opt/gpufleet/venv/bin/python
    config: /opt/gpufleet/finetune/files/configs/qwen2-7b-lora.yml
    max_steps: 20
    output_dir: /opt/gpufleet/finetune/output/smoke
    timeout_s: 1800
    host_name: "{{ inventory_hostname }}"

- name: Start the fine-tune on every node of the play at once
  gpufleet.cluster.finetune:
    python: /opt/gpufleet/venv/bin/python
    config: /opt/gpufleet/finetune/files/configs/qwen2-7b-lora.yml
    nnodes: "{{ ansible_play_hosts | length }}"
    node_rank: "{{ ansible_play_hosts.index(inventory_hostname) }}"
    master_addr: "{{ hostvars[ansible_play_hosts[0]].ansible_host }}"
    master_port: 29513
    timeout_s: 3600
    rdzv_timeout_s: 300
    env:
      NCCL_SOCKET_IFNAME: eth0
    host_name: "{{ inventory_hostname }}"
  async: 3660
  poll: 0
  register: finetune_job

- name: Wait for it on every node
  ansible.builtin.async_status:
    jid: "{{ finetune_job.ansible_job_id }}"
  register: finetune
  until: finetune is finished
  retries: 1250
  delay: 3
"""

RETURN = r"""
msg:
  description: Why nothing ran (check mode).
  returned: when skipped
  type: str
  sample: "fine-tune not run in check mode: it writes an adapter and loads the GPUs; run without --check"
cmd:
  description: The engine command the module ran.
  returned: when the engine ran
  type: list
  elements: str
gpufleet:
  description:
    - The host document C(gpufleet finetune --json) printed, with one result C(finetune) in the group C(finetune),
      whose C(value) is tokens/s per GPU; C(engine_version) is null when the engine did not answer.
    - A run the module had to kill, or whose engine crashed or printed no document, is one C(error) result with the
      command, exit code and stderr tail in C(detail).
    - Its keys, and those of each result, are the engine's host document, described once in the collection's
      C(docs/modules.md) (What the modules return).
  returned: always
  type: dict
  contains:
    results:
      description:
        - The result's C(detail) holds C(world_size), C(nnodes), C(node_rank), C(losses), C(loss_first), C(loss_last),
          C(eval_loss_first), C(eval_loss), C(adapter_dir) (on node rank 0), C(mfu), the launch settings and, for a
          failed run, C(failure) (C(phase), C(cause), the rank and host that failed first, C(peer_addr) of a lost
          peer) and C(log_tail).
      type: list
      elements: dict
"""

import json
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    add_node_env,
    node_args,
    node_env_argument_spec,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_results import (
    run_engine_results,
    start_engine_run,
    torchrun_engine_timeout_s,
    torchrun_input_problem,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import host_document

GROUP = "finetune"  # gpufleet.finetune.results.GROUP
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REMEDY_TIMEOUT = (
    "the fine-tune hung past timeout_s and was killed: read the stderr tail and the other nodes' finetune "
    "results; raise timeout_s only if the steps simply need longer"
)


def argument_spec():
    return dict(
        python=dict(type="path", required=True),
        config=dict(type="path", required=True),
        nnodes=dict(type="int", default=1),
        node_rank=dict(type="int", default=0),
        master_addr=dict(type="str", default="127.0.0.1"),
        master_port=dict(type="int", default=29513),
        nproc_per_node=dict(type="int"),
        max_steps=dict(type="int"),
        output_dir=dict(type="path"),
        timeout_s=dict(type="int", default=3600),
        rdzv_timeout_s=dict(type="int"),
        env=dict(type="dict", default={}),
        thresholds=dict(type="dict"),
        profile=dict(type="str"),
        host_name=dict(type="str"),
        **node_env_argument_spec(),
    )


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def input_problem(p):
    """What is wrong with the arguments, or None."""
    problem = torchrun_input_problem(p)
    if problem:
        return problem
    if not 0 < p["master_port"] < 65536:
        return "master_port = %s; expected a TCP port, 1 to 65535" % p["master_port"]
    if p["nproc_per_node"] is not None and p["nproc_per_node"] < 1:
        return "nproc_per_node = %s; expected 1 or more ranks" % p["nproc_per_node"]
    if p["max_steps"] is not None and p["max_steps"] < 0:
        return "max_steps = %s; expected 0 (the config's training.max_steps) or more steps" % p["max_steps"]
    if p["rdzv_timeout_s"] is not None:
        inner = torchrun_engine_timeout_s(p["timeout_s"])
        if not 0 < p["rdzv_timeout_s"] < inner:
            return "rdzv_timeout_s = %s; expected 1 to %s s, under the engine's limit inside timeout_s %s" % (
                p["rdzv_timeout_s"],
                inner - 1,
                p["timeout_s"],
            )
    for name, value in p["env"].items():
        if not _ENV_NAME.match(name):
            return (
                "env name %r is not an environment variable name (letters, digits and _, not starting with a digit)"
                % name
            )
        if isinstance(value, (dict, list)) or value is None:
            return "env %s = %s; expected a string or a number" % (name, json.dumps(value))
    return None


def engine_args(p):
    args = [
        "finetune",
        "--config",
        p["config"],
        "--nnodes",
        str(p["nnodes"]),
        "--node-rank",
        str(p["node_rank"]),
        "--master-addr",
        p["master_addr"],
        "--master-port",
        str(p["master_port"]),
        "--timeout-s",
        str(torchrun_engine_timeout_s(p["timeout_s"])),
    ]
    if p["rdzv_timeout_s"]:
        args += ["--rdzv-timeout-s", str(p["rdzv_timeout_s"])]
    if p["max_steps"]:
        args += ["--max-steps", str(p["max_steps"])]
    if p["nproc_per_node"]:
        args += ["--nproc-per-node", str(p["nproc_per_node"])]
    if p["output_dir"]:
        args += ["--output-dir", p["output_dir"]]
    return args + node_args(p["host_name"], p["profile"], p["thresholds"]) + ["--json"]


def env_value(value):
    if isinstance(value, bool):  # YAML true/false: the spelling a shell script would test for
        return "1" if value else "0"
    return str(value)


def main():
    module = build_module()
    p = module.params
    host, started, t0 = start_engine_run(
        module,
        "finetune",
        input_problem(p),
        ["finetune"],
        GROUP,
        "fine-tune not run in check mode: it writes an adapter and loads the GPUs; run without --check",
    )
    # The engine's environment: this process's, the node's (node_env), then env's; torchrun and every rank inherit it.
    add_node_env(p)
    add_node_env(p, dict((k, env_value(v)) for k, v in p["env"].items()))
    args = engine_args(p)
    doc, results = run_engine_results(
        module,
        p,
        args,
        host,
        "finetune",
        GROUP,
        "gpufleet finetune",
        dict(nnodes=p["nnodes"], node_rank=p["node_rank"], master="%s:%s" % (p["master_addr"], p["master_port"])),
        REMEDY_TIMEOUT,
    )
    if doc is None:  # the run was killed, crashed or printed no usable document: its error result alone
        doc = host_document(host, started, round(time.monotonic() - t0, 2), results)
    # It ran: an adapter and logs were written (or a failed run's log kept).
    module.exit_json(changed=True, cmd=[p["python"], "-m", "gpufleet"] + args, gpufleet=doc)


if __name__ == "__main__":
    main()
