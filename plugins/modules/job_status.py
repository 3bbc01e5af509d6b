#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_status
short_description: "Internal: wait on a background job of a run and tell it the controller is still there"
version_added: 0.2.0
description:
  - The status of a job started with C(async), as M(ansible.builtin.async_status) gives it, after renewing the
    heartbeat of the run's node lock (M(gpufleet.cluster.node_lock) with V(heartbeat)).
  - A gpufleet job in the background (NCCL or training across nodes, the fine-tune) watches that heartbeat. When the
    controller stops polling (the playbook was interrupted or its controller died), the job stops itself and
    everything it started on the node.
options:
  jid:
    description: The job id from the C(async) task.
    type: str
    required: true
  mode:
    description: V(status) polls the job; V(cleanup) removes its results file.
    type: str
    choices: [status, cleanup]
    default: status
  heartbeat:
    description:
      - The options of M(gpufleet.cluster.node_lock) for the heartbeat (python, path, run_id, holder); left out, no
        heartbeat is sent.
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.internal
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.cluster.node_env
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
seealso:
  - module: ansible.builtin.async_status
  - module: gpufleet.cluster.node_lock
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for the run across nodes, renewing the lock's heartbeat
  gpufleet.cluster.job_status:
    jid: "{{ job.ansible_job_id }}"
    heartbeat:
      python: /opt/gpufleet/venv/bin/python
      run_id: "{{ gpufleet_run_id }}"
      holder: "{{ inventory_hostname }}"
  register: run
  until: run is finished
  retries: 300
  delay: 3
"""

RETURN = r"""
finished:
  description: Whether the job has finished; its own return values come with it then, as with async_status.
  returned: success
  type: bool
heartbeat:
  description: What the heartbeat returned (held, reason).
  returned: when heartbeat was given and mode is status
  type: dict
"""
