#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_lock
short_description: Take, renew or give back the lock that lets one run at a time measure a node
version_added: 0.2.0
description:
  - Runs C(python -m gpufleet lock acquire|heartbeat|release) on the node.
  - The lock file records the run that holds the node (run id, controller, since when) and a lease per inventory
    host. A second run finds it held and gets RV(acquired=false) with a RV(reason) naming the run that holds it; the
    module does not fail then, so the play can record that as the node's result.
  - A lock is stale, and taken over with RV(stale) saying why, only when its holder is gone - the node rebooted
    since, or its run is one of O(dead_runs) (the controller knows its ansible-playbook main process is gone) - or,
    for a lock taken from another controller host than O(controller), when its lease expired without being given
    back.
  - V(heartbeat) tells jobs of the run that run in the background (NCCL and training across nodes, the fine-tune)
    that the controller still waits for them; a job whose controller stopped waiting stops itself.
options:
  state:
    description: V(acquired) takes or joins the lock, V(heartbeat) renews the heartbeat, V(released) gives it back.
    type: str
    choices: [acquired, heartbeat, released]
    default: acquired
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.node_lock
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: full
    details: In check mode nothing is written and the module reports what the lock holds.
seealso:
  - module: gpufleet.cluster.job_status
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the node for this run
  gpufleet.cluster.node_lock:
    python: /opt/gpufleet/venv/bin/python
    run_id: "{{ gpufleet_run_id }}"
    holder: "{{ inventory_hostname }}"
    ttl_s: 7200
  register: lock

- name: Give it back
  gpufleet.cluster.node_lock:
    python: /opt/gpufleet/venv/bin/python
    state: released
    run_id: "{{ gpufleet_run_id }}"
    holder: "{{ inventory_hostname }}"
"""

RETURN = r"""
acquired:
  description: With V(acquired), whether the run holds the node now.
  returned: state is acquired
  type: bool
reason:
  description: Why the lock was not taken, renewed or given back (the run that holds it), else null.
  returned: always
  type: str
stale:
  description: With V(acquired), the stale lock that was taken over and why, else null.
  returned: state is acquired
  type: dict
record:
  description: The lock record as it stands.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.lock_module import (
    lock_module_argument_spec,
    run_lock_module,
)


def main():
    run_lock_module(AnsibleModule(argument_spec=lock_module_argument_spec(), supports_check_mode=True))


if __name__ == "__main__":
    main()
