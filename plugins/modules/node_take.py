#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_take
short_description: "Internal: take the node for a run, taking over the lock of a run this controller knows is gone"
version_added: 0.3.0
description:
  - Takes the node lock with M(gpufleet.cluster.node_lock) (V(acquired)), all in one task (an action plugin).
  - Held by a run of this controller (the lock records the controller host), it asks this controller, with
    C(gpufleet run alive), whether that run's ansible-playbook still runs; when it does not, the lock is taken over
    (the run is added to O(dead_runs)) and RV(stale) says so.
  - Still held by another run, it waits up to O(wait_s) seconds for that run to give the node back.
  - A node that does not answer makes the task unreachable. A lock module or controller command that could not run
    fails the task.
options:
  controller_python:
    description: Python interpreter on the controller with the gpufleet engine; left out, the one running Ansible.
    type: path
  engine_src:
    description: Folder on the controller holding the gpufleet package, first on C(PYTHONPATH) for C(gpufleet run alive).
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.internal
  - gpufleet.cluster.node_lock
  - gpufleet.cluster.node_env
attributes:
  check_mode:
    support: full
    details: In check mode the lock module reports what the lock holds and nothing is taken.
seealso:
  - module: gpufleet.cluster.node_lock
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the node for this run
  gpufleet.cluster.node_take:
    python: /opt/gpufleet/venv/bin/python
    run_id: "{{ gpufleet_run_id }}"
    holder: "{{ inventory_hostname }}"
    controller: "{{ run.controller }}"
    wait_s: 600
  register: lock
"""

RETURN = r"""
acquired:
  description: Whether the run holds the node now.
  returned: success
  type: bool
reason:
  description: Why the lock was not taken (the run that holds it), else null.
  returned: success
  type: str
stale:
  description: The stale lock that was taken over and why, else null.
  returned: success
  type: dict
record:
  description: The lock record as it stands.
  returned: success
  type: dict
result:
  description:
    - The C(lock.node_lock) result for the host document (gpufleet's result schema) - C(pass) when this run holds the
      node (saying when a stale lock was taken over), C(error) naming the run that holds it.
  returned: success, not in check mode
  type: dict
"""
