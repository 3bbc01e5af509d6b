# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Body of node_lock (the node lock taken, renewed or given back) and its arguments, which the node_validate action
shares (doc fragment gpufleet.cluster.node_lock).
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    EngineError,
    add_node_env,
    node_env_argument_spec,
    run_json,
)

LOCK_COMMANDS = {"acquired": "acquire", "heartbeat": "heartbeat", "released": "release"}
# The engine waits this long at the least for the processes of a stale lock's run to stop (gpufleet.base.lock.STOP_WAIT_S).
STOP_WAIT_S = 60


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
        **node_env_argument_spec(),
    )


def lock_module_argument_spec():
    return dict(lock_argument_spec(), state=dict(type="str", choices=list(LOCK_COMMANDS), default="acquired"))


def run_lock_module(module):
    """Body of node_lock: the engine's `gpufleet lock` on the node; another run holding it is an answer, not a failure."""
    p = module.params
    add_node_env(p)
    if module.check_mode:
        args = ["lock", "show", "--path", p["path"]]
    else:
        args = [
            "lock",
            LOCK_COMMANDS[p["state"]],
            "--path",
            p["path"],
            "--run-id",
            p["run_id"],
            "--holder",
            p["holder"],
        ]
        if p["state"] == "acquired":
            args += ["--ttl-s", str(p["ttl_s"]), "--controller", json.dumps(p["controller"], sort_keys=True)]
            for run in p["dead_runs"]:
                args += ["--dead-run", run]
            args += ["--wait-s", str(p["wait_s"])]
    try:
        dummy, out = run_json(p["python"], args, 60 + max(p["wait_s"], STOP_WAIT_S), p["holder"])
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    out.setdefault("reason", None)
    module.exit_json(changed=not module.check_mode and p["state"] != "heartbeat", **out)
