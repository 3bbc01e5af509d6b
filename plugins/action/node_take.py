# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.node_take: take the node for this run in one task (gpufleet.cluster.node_lock, then, held by a
run of this controller, whether that run still runs, the takeover or the bounded wait).

One task instead of one for each step: a task costs the controller far more than the lock module it runs. The
node stage's own action (node_validate) takes the lock the same way, through `NodeTake.take`, each ask the engine's
part `checks` of the node's stage, which takes the lock and, once the node is this run's, checks it.
"""

from __future__ import annotations

import json
import sys
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    EngineError,
    run_json,
    stop_with_controller,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.lock_module import lock_argument_spec

ARGUMENT_SPEC = dict(lock_argument_spec(), controller_python={"type": "path"}, engine_src={"type": "path"})
LOCK_ARGS = (
    "python",
    "path",
    "run_id",
    "holder",
    "ttl_s",
    "controller",
    "dead_runs",
    "node_env",
)  # wait_s: when waiting


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class NodeTake(ActionBase):
    _requires_connection = True

    def take(self, args, task_vars, first=None, ask=None):
        """The node lock for this run: the lock module's answer (`first`, when already asked), then the takeover of a
        run of this controller that is gone, then the bounded wait. `ask(lock_args) -> the lock's answer` asks the
        node (default: the lock module). AnsibleConnectionFailure when the node does not answer; EngineError when a
        controller command could not run."""
        ask = ask or (lambda module_args: self._lock(module_args, task_vars))
        lock_args = dict((k, args[k]) for k in LOCK_ARGS)
        lock = first if first is not None else ask(lock_args)
        held_here = (lock.get("record") or {}).get("controller") or {}
        if (
            not lock.get("failed")
            and lock.get("acquired") is False
            and held_here.get("host") == args["controller"].get("host")
        ):
            # A run killed from another reports folder of this controller is not in dead_runs: ask this controller
            # whether the holder's ansible-playbook still runs, and take the node over when it does not.
            dummy, alive = run_json(
                args["controller_python"] or sys.executable,
                ["run", "alive", "--controller", json.dumps(held_here, sort_keys=True)],
                60,
                "the controller",
                engine_src=args["engine_src"],
            )
            if alive.get("alive") is False:
                lock = ask(dict(lock_args, dead_runs=args["dead_runs"] + [lock["record"]["run_id"]]))
        if not lock.get("failed") and lock.get("acquired") is False and args["wait_s"] > 0:
            lock = ask(dict(lock_args, wait_s=args["wait_s"]))
        return lock

    def _lock(self, module_args, task_vars):
        lock = self._execute_module(
            module_name="gpufleet.cluster.node_lock", module_args=module_args, task_vars=task_vars
        )
        if lock.get("unreachable"):
            raise AnsibleConnectionFailure(lock.get("msg") or "the node did not answer")
        return lock


class ActionModule(NodeTake):
    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        stop_with_controller()  # nothing taken for a run whose ansible-playbook is gone
        try:
            lock = self.take(args, task_vars)
        except AnsibleConnectionFailure as exc:
            return dict(results, unreachable=True, msg=str(exc))
        except EngineError as exc:
            lock = dict(exc.fail_kwargs(), failed=True)
        results.update(lock)  # with `result`, the node's lock.node_lock result, as the engine made it
        return results
