# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.job_status: the node lock's heartbeat, then ansible.builtin.async_status, in one task.

One task because a polling loop (`until`) repeats one task: each poll must both tell the node's background job
that the controller still waits and read the job's status.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import stop_with_controller


class ActionModule(ActionBase):
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec={
                "jid": {"type": "str", "required": True},
                "mode": {"type": "str", "choices": ["status", "cleanup"], "default": "status"},
                "heartbeat": {"type": "dict"},
                "node_env": {"type": "dict", "default": {}},
            }
        )
        # A worker whose ansible-playbook is gone renews no heartbeat: the job it checks on stops itself.
        stop_with_controller()
        beat = None
        if args["heartbeat"] and args["mode"] == "status":
            beat = self._execute_module(
                module_name="gpufleet.cluster.node_lock",
                module_args=dict(args["heartbeat"], state="heartbeat", node_env=args["node_env"]),
                task_vars=task_vars,
            )
        # As the async_status action does: the job's results file is in the shell's async_dir on the node.
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        log_path = self._connection._shell.join_path(async_dir, args["jid"])
        results.update(
            started=False,
            finished=False,
            stdout="",
            stderr="",
            stdout_lines=[],
            stderr_lines=[],
            ansible_job_id=args["jid"],
        )
        if args["mode"] == "cleanup":
            results["erased"] = log_path
        else:
            results.update(results_file=log_path, started=True)
        status = self._execute_module(
            module_name="ansible.legacy.async_status",
            task_vars=task_vars,
            module_args={"jid": args["jid"], "mode": args["mode"], "_async_dir": async_dir},
        )
        results = merge_hash(results, status)
        for key in ("started", "finished"):
            results[key] = bool(results[key])
        if beat is not None:
            results["heartbeat"] = {
                "held": beat.get("held"),
                "reason": beat.get("reason"),
                "failed": beat.get("failed", False),
                "msg": beat.get("msg"),
            }
        return results
