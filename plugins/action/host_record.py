# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.host_record: the host document written on the controller from the task's own worker.

The document goes to the controller whatever host the task runs for, so nothing is sent anywhere: the module of the
same name would start a module process on the controller for every node, which costs more than the write itself.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError
from ansible_collections.gpufleet.cluster.plugins.module_utils.record_module import record_argument_spec, run_record


class ActionModule(ActionBase):
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=record_argument_spec())
        if self._task.check_mode:
            return dict(results, skipped=True, msg="the host document is not written in check mode")
        try:
            record = run_record(args)
        except EngineError as exc:
            return dict(results, failed=True, **exc.fail_kwargs())
        return dict(results, changed=True, path=record.get("path"), record=record)
