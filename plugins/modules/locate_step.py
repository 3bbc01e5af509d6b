#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: locate_step
short_description: "Internal: plan the rounds that find a fleet's slow node or slow link, on the controller"
version_added: 0.2.0
description:
  - Runs C(python -m gpufleet fleet locate-step RUN_DIR) on the controller, between the rounds of locate.yml.
  - With O(start), begins a localisation over O(nodes) and returns round 1's groups. Without it, reads what every
    node of the round just run wrote under C(RUN_DIR/locate/round-<k>/<node>.json), judges each group's all-reduce
    bus bandwidth against the round's reference, and returns the next round's groups, or RV(done) with the
    findings.
  - Each group runs NCCL under torchrun at once with the others of its round; its first node is its master and
    it has a port of its own (O(base_port) plus the group's place in the round).
  - The state, every round's figures and the findings are written to C(RUN_DIR/locate.json). The planning itself
    is C(gpufleet.fleet.locate) and C(gpufleet.fleet.locate_plan) (pairs, halving, and telling a slow node from a
    slow link).
  - A slow node or link found is data (RV(verdict)), never a module failure; the module fails only when the
    engine cannot run or refuses its input (a missing run folder, fewer than two nodes, a ratio out of range).
options:
  run_dir:
    description: The run's folder on the controller (what gpufleet.cluster.run_start returned).
    type: path
    required: true
  start:
    description: Begin a new localisation over O(nodes); the round files of an earlier one in the run folder go.
    type: bool
    default: false
  nodes:
    description: The nodes to locate among, in inventory order (with O(start)).
    type: list
    elements: str
    default: []
  left_out:
    description:
      - With O(start), the nodes of the run that take no part (they did not answer, another run holds them), each
        with the reason; recorded in C(locate.json).
    type: dict
    default: {}
  method:
    description:
      - V(pairs) pairs every node with another in round 1, then tries each suspect with a known-good node.
      - V(bisect) runs all-node NCCL on the two halves of the fleet at once and follows the slow half, about
        log2(N) rounds for one slow node among N.
      - V(auto) bisects from 32 nodes and pairs below.
    type: str
    choices: [auto, pairs, bisect]
    default: auto
  ratio:
    description:
      - A group is slow when its figure is under this fraction of the round's reference.
      - Left out, C(locate_busbw_ratio_min) of O(thresholds) or of C(files/profiles/generic.yml) (0.8).
    type: float
  thresholds:
    description: The inventory's C(gpufleet_thresholds); only C(locate_busbw_ratio_min) is read here.
    type: dict
  pair_rounds:
    description: With V(pairs), rounds of new pairs (round-robin) while nothing is found; 1 runs round 1 only.
    type: int
  max_rounds:
    description: Stop after this many rounds with what is known then. Left out, it follows from the node count.
    type: int
  reference_gbps:
    description: Judge every group against this bus bandwidth instead of the rounds' own reference.
    type: float
  base_port:
    description: Rendezvous port of the first group of a round; the next groups take the next ports.
    type: int
  timeout_s:
    description: Seconds the planning may take before its process group is killed and the module fails.
    type: int
    default: 120
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.controller_engine
  - gpufleet.cluster.internal
attributes:
  check_mode:
    support: none
    details: It writes C(locate.json); a task that must run under C(--check) sets C(check_mode=false).
seealso:
  - module: gpufleet.cluster.benchmark
  - module: gpufleet.cluster.run_start
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Begin the localisation
  gpufleet.cluster.locate_step:
    run_dir: /srv/gpufleet/reports/slow-run
    start: true
    nodes: "{{ groups['gpu_nodes'] }}"
    method: auto
  register: step

- name: After the nodes of round k wrote locate/round-k/<node>.json, judge it and plan the next
  gpufleet.cluster.locate_step:
    run_dir: /srv/gpufleet/reports/slow-run
  register: step

- name: Say what was found
  ansible.builtin.debug:
    msg: "{{ step.summary }}"
  when: step.done
"""

RETURN = r"""
done:
  description: Whether the localisation is over (no round left to run).
  returned: success
  type: bool
  sample: false
round:
  description: The number of the round to run next; null when done.
  returned: success
  type: int
  sample: 2
groups:
  description: The next round's groups, each run at once with the others.
  returned: success
  type: list
  elements: dict
  contains:
    members:
      description: The group's nodes in inventory order; the first is the master, node rank 0.
      type: list
      elements: str
    master:
      description: The node the others dial.
      type: str
    port:
      description: The group's rendezvous port on its master.
      type: int
    purpose:
      description: Why the group runs (pairs, halves, suspect, untested, link).
      type: str
  sample: [{members: [node0, node3], master: node0, port: 29521, purpose: suspect}]
verdict:
  description: When done, V(found) (a node or link named), V(none) (nothing slow) or V(inconclusive).
  returned: success
  type: str
  sample: found
summary:
  description: When done, one line naming what was found.
  returned: success
  type: str
  sample: node3 is slow
findings:
  description:
    - When done, one entry per finding, with C(kind) (node, link or group), C(node) or C(pair), C(why), a C(text)
      quoting the figures of each round the node or pair ran in, and the C(evidence).
  returned: success
  type: list
  elements: dict
method:
  description: The method in use (pairs or bisect).
  returned: success
  type: str
rounds_run:
  description: How many rounds ran so far.
  returned: success
  type: int
max_rounds:
  description: The most rounds this localisation runs.
  returned: success
  type: int
locate_json:
  description: Path of C(locate.json) in the run folder.
  returned: success
  type: str
"""

import json
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError, run_json


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            start=dict(type="bool", default=False),
            nodes=dict(type="list", elements="str", default=[]),
            left_out=dict(type="dict", default={}),
            method=dict(type="str", default="auto", choices=["auto", "pairs", "bisect"]),
            ratio=dict(type="float"),
            thresholds=dict(type="dict"),
            pair_rounds=dict(type="int"),
            max_rounds=dict(type="int"),
            reference_gbps=dict(type="float"),
            base_port=dict(type="int"),
            python=dict(type="path"),
            engine_src=dict(type="path"),
            timeout_s=dict(type="int", default=120),
        ),
        supports_check_mode=False,
    )
    p = module.params
    args = ["fleet", "locate-step", p["run_dir"], "--method", p["method"]]
    if p["start"]:
        args.append("--start")
    for node in p["nodes"]:
        args += ["--node", node]
    for key in ("ratio", "pair_rounds", "max_rounds", "reference_gbps", "base_port"):
        if p[key] is not None:
            args += ["--" + key.replace("_", "-"), str(p[key])]
    if p["left_out"]:
        args += ["--left-out", json.dumps(p["left_out"], sort_keys=True)]
    if p["thresholds"]:
        args += ["--thresholds", json.dumps(p["thresholds"], sort_keys=True)]
    # engine_src is known to module_utils that put the collection's engine first; older ones take no such argument.
    extra = {"engine_src": p["engine_src"]} if p["engine_src"] else {}
    try:
        dummy, step = run_json(p["python"] or sys.executable, args, p["timeout_s"], "the controller", **extra)
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(changed=True, **step)


if __name__ == "__main__":
    main()
