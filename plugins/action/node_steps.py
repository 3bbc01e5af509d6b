# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""gpufleet.cluster.node_steps: several of the node's modules in one task, one after another.

A task costs the controller far more than the module it runs (a worker forked, the task's templates compiled
again, its result copied and cleaned in the main process): the check groups and the benchmark stage each run as
one task, their modules from here. Each step keeps its own outcome: a module that could not answer, or a node lost
during it, becomes an `error` result of the step's group, and the steps before it keep what they measured.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

# The steps a task may run, each with its group: the node's modules that return a host document.
MODULES = {"gpu_inventory": "gpu_inventory", "gpu_health": "gpu_health", "host_hygiene": "host_hygiene",
           "gpu_counters": "counters", "benchmark": "benchmark"}
REMEDY_DEFAULT = "read the reason, fix the node or the input and re-run validate.yml"


def group_error(group, res):
    """The `error` result of a group whose module could not answer (the fields of gpufleet.schema.result)."""
    msg = res.get("msg") or "the %s module failed without a message" % group
    stderr = res.get("stderr") or ""
    return {"check": "engine", "group": group, "status": "error", "value": None, "unit": None, "threshold": None,
            "class": "environment" if "No space left on device" in msg + stderr else "software",
            "reason": msg, "remedy": res.get("remedy") or REMEDY_DEFAULT,
            "detail": {"rc": res.get("rc"), "stderr": stderr, "cmd": res.get("cmd")},
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": 0.0}


class ActionModule(ActionBase):

    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec={
            "steps": {"type": "list", "elements": "dict", "required": True},
        })
        docs, names, errors, lost_during, lost = [], [], [], set(), None
        for step in args["steps"]:
            module = step.get("module")
            if module not in MODULES:
                return dict(results, failed=True, msg="gpufleet.cluster.node_steps: step module %r is none of %s"
                            % (module, ", ".join(MODULES)))
            name = step.get("name") or module
            if step.get("after_benchmark") and "benchmark" in lost_during:
                continue  # a node lost during the benchmarks has no counters to read after them
            try:
                res = self._execute_module(module_name="gpufleet.cluster." + module, module_args=step.get("args") or {},
                                           task_vars=task_vars)
            except AnsibleConnectionFailure as exc:
                res = {"unreachable": True, "msg": str(exc)}
            if res.get("unreachable"):
                lost = res.get("msg")
                lost_during.add(module)
            doc = res.get("gpufleet")
            if isinstance(doc, dict) and not res.get("failed") and not res.get("unreachable"):
                docs.append(doc)
                names.append(name)
            else:
                errors.append(group_error(MODULES[module], res))
                # Said where the run is watched, as the failed task said it when each module was a task of its own.
                display.warning("%s on %s: %s" % (module, task_vars.get("inventory_hostname"), errors[-1]["reason"]))
        # Each document once: the main process copies and cleans every result it gets, in proportion to its size.
        results.update(changed=False, docs=docs, steps=names, errors=errors)
        if lost is not None:
            results.update(unreachable=True, msg=lost)
        return results
