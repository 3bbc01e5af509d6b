# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The node lock's arguments, shared by node_lock and the node_take action (doc fragment gpufleet.cluster.node_lock).
"""

from __future__ import annotations


def lock_argument_spec():
    return dict(
        python=dict(type="path", required=True),
        path=dict(type="path", default="/run/lock/gpufleet-node.lock"),
        run_id=dict(type="str", required=True),
        holder=dict(type="str", required=True),
        ttl_s=dict(type="int", default=3600),
        controller=dict(type="dict", default={}),
        dead_runs=dict(type="list", elements="str", default=[]),
        wait_s=dict(type="int", default=0),
    )
