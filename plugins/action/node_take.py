# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.node_take: take the node for this run in one task (gpufleet.cluster.node_lock, then, held by a
run of this controller, whether that run still runs, the takeover or the bounded wait).

One task instead of one for each step: a task costs the controller far more than the lock module it runs. The
node stage's own action (node_validate) takes the lock the same way, through `NodeTake.take`.
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
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import result
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


def lock_result(lock, args, started=None):
    """The `lock.node_lock` result (gpufleet.schema.result keys): pass when this run holds the node, else the error
    naming the run that holds it. started: when the lock was asked for (default now)."""
    acquired = bool(lock.get("acquired"))
    stale = lock.get("stale")
    if acquired:
        reason = "held by this run (%s)" % args["run_id"]
        if stale:
            previous = (stale.get("previous") or {}).get("run_id", "?")
            reason += "; took over the stale lock of run %s: %s" % (previous, stale.get("reason"))
        remedy = None
    else:
        reason = "not measured: %s. Figures taken while another run loads the GPUs would be neither run's" % lock.get(
            "reason"
        )
        remedy = (
            "wait for that run to finish and re-run with --limit %s (gpufleet_lock_wait_s=SECONDS waits for it); if "
            "it was stopped on another controller, its lock is stale when its lease runs out (or remove %s on the "
            "node once sure it is dead)" % (args["holder"], args["path"])
        )
    return result(
        "node_lock",
        "pass" if acquired else "error",
        reason,
        group="lock",
        remedy=remedy,
        started=started or utc_now(),
        seconds=0.0,
        detail={
            "path": args["path"],
            "record": lock.get("record"),
            "stale": stale,
            "waited_s": lock.get("waited_s") or 0,
        },
    )


class NodeTake(ActionBase):
    _requires_connection = True

    def take(self, args, task_vars, first=None):
        """The node lock for this run: the lock module's answer (`first`, when already asked), then the takeover of a
        run of this controller that is gone, then the bounded wait. AnsibleConnectionFailure when the node does not
        answer; EngineError when a controller command could not run."""
        lock_args = dict((k, args[k]) for k in LOCK_ARGS)
        lock = first if first is not None else self._lock(lock_args, task_vars)
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
                lock = self._lock(dict(lock_args, dead_runs=args["dead_runs"] + [lock["record"]["run_id"]]), task_vars)
        if not lock.get("failed") and lock.get("acquired") is False and args["wait_s"] > 0:
            lock = self._lock(dict(lock_args, wait_s=args["wait_s"]), task_vars)
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
        results.update(lock)
        if not lock.get("failed") and not self._task.check_mode:
            results["result"] = lock_result(lock, args)
        return results
