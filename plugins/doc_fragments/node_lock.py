# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Options of the node lock shared by node_lock and node_take."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  python:
    description: Path on the node of the Python interpreter that has the gpufleet engine (C(gpufleet_python)).
    type: path
    required: true
  path:
    description: The lock file on the node (C(gpufleet_lock_path)).
    type: path
    default: /run/lock/gpufleet-node.lock
  run_id:
    description: The run taking the lock.
    type: str
    required: true
  holder:
    description: The inventory host the lock is taken for; several hosts of one run may share a machine.
    type: str
    required: true
  ttl_s:
    description: Seconds the lease lasts when it is not given back (when taking the lock).
    type: int
    default: 3600
  controller:
    description: The controller running the run, recorded in the lock (gpufleet.cluster.run_start returns it).
    type: dict
    default: {}
  dead_runs:
    description: Runs whose locks are stale because the controller knows they were killed.
    type: list
    elements: str
    default: []
  wait_s:
    description: When taking the lock, seconds to wait for another run to give the node back before answering
      that it is not acquired (C(gpufleet_lock_wait_s)).
    type: int
    default: 0
"""
