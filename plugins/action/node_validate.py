"""gpufleet.cluster.node_validate: the whole node stage of validate.yml, for one node, in one task.

What it does, on the controller, in the task's own worker:

    run 1 on the node (gpufleet.cluster.node_steps)   node_lock (take the node for this run), gpu_inventory,
                                                      gpu_health, host_hygiene, gpu_counters (before)
          [a lock held by a run of this controller that is gone is taken over, or waited for: NodeTake.take()]
    run 2 on the node (gpufleet.cluster.node_steps)   benchmark (handed RUN_DIR/references/<host>.json, what its
                                                      figures are held against), gpu_counters (after),
                                                      node_lock released when no later play needs the node
    here                                              the node's host document built from the steps' results and
                                                      written to RUN_DIR/hosts/<host>.json; a summary returned

Why one task, and two module runs: most of what a run costs the controller is Ansible's own work per task and per
module it sends to a node (a worker forked, the task's templates compiled, its result copied back into the main
process and cleaned there), far more than the stage's work. One task a node that sends one module twice keeps a
whole run near 0.15 to 0.24 s of controller CPU a node (docs/scale.md; tools/controller_cost.py measures it).
Two runs, not one, so that a node lost during the benchmarks keeps what run 1 measured.

What reaches the document when something goes wrong: a step whose module could not answer is an `error` result of
its group (engine_schema.STEP_GROUPS); a node that did not answer, one error result connection.reachable; a node
another run holds is not measured and its document names that run. The document is written with the engine's own
writer (no process started for it); only a summary and the facts the later plays read (validate_node_multinode,
validate_node_lock_held, ...) go back to the main process, since a result's size is paid again there. After each
run, a line `[HOST] gpufleet: checks|benchmarks: ... | pass=N ...` tells the live view (gpufleet.runner.events)
where the node is and how it fares so far.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.utils.display import Display
from ansible_collections.gpufleet.cluster.plugins.action.node_take import ARGUMENT_SPEC as TAKE_SPEC
from ansible_collections.gpufleet.cluster.plugins.action.node_take import LOCK_ARGS, NodeTake, lock_result, utc_now
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError, stop_with_controller
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import CHECK_GROUPS, STEP_GROUPS, result
from ansible_collections.gpufleet.cluster.plugins.module_utils.record_module import run_record

display = Display()

REMEDY_DEFAULT = "read the reason, fix the node or the input and re-run validate.yml"
REMEDY_UNREACHABLE = (
    "check the inventory address, ssh access (ansible_user, keys) and that the node is up; then re-run with --limit"
)

# The engine's writer of host documents (what `gpufleet record` runs), imported once in Ansible's main process,
# which loads this plugin before forking the workers that run it: the installed engine (pip install
# '<checkout>[controller]'); else the collection's own src/, which the collection ships so that the controller
# needs no install (README, "Install"); else none, and `gpufleet record` runs under controller_python.
ENGINE_SRC = str(Path(__file__).resolve().parents[2] / "src")


def _engine(module, name):
    """A name of the engine, from the installed engine or the collection's src/; None where neither imports."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        pass
    sys.path.append(ENGINE_SRC)  # only where the engine is not installed
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:  # the controller's Python lacks what the engine needs
        sys.path.remove(ENGINE_SRC)
        return None


write_host_document = _engine("gpufleet.fleet.document_writer", "record")
# What the node's figures are held against, written for the run before the nodes' stage (gpufleet references).
read_references = _engine("gpufleet.comparisons.node", "read")

ARGUMENT_SPEC = {
    "lock": {"type": "dict", "required": True, "options": TAKE_SPEC},
    "check_args": {"type": "dict", "required": True},
    "benchmark_args": {"type": "dict"},
    "release": {"type": "bool", "default": False},
    "multinode": {"type": "bool", "default": True},
    "run_dir": {"type": "path", "required": True},
    "document": {"type": "dict", "required": True},
    "controller_python": {"type": "path"},
    "node_env": {"type": "dict", "default": {}},
    "site_env": {"type": "dict", "default": {}},
}


def error_result(check, group, reason, remedy, klass, detail):
    return result(
        check,
        "error",
        reason,
        group=group,
        remedy=remedy,
        detail=detail,
        failure_class=klass,
        started=utc_now(),
        seconds=0.0,
    )


def group_error(group, res):
    """The `error` result of a group whose module could not answer."""
    msg = res.get("msg") or "the %s module failed without a message" % group
    stderr = res.get("stderr") or ""
    return error_result(
        "engine",
        group,
        msg,
        res.get("remedy") or REMEDY_DEFAULT,
        "environment" if "No space left on device" in msg + stderr else "software",
        {"rc": res.get("rc"), "stderr": stderr, "cmd": res.get("cmd")},
    )


def stage_line(host, stage, what, lock=None, ran=()):
    """The line that tells whoever watches the run (gpufleet.runner.events.STAGE_LINE) where the node is, with the
    statuses of what it has measured so far: `[HOST] gpufleet: STAGE: WHAT | pass=N warn=N ...`."""
    counts = {}
    if lock is not None:
        counts["pass" if lock.get("acquired") else "error"] = 1  # the lock's own result
    for step in ran:
        if step["module"] == "node_lock":
            continue  # a give-back is no result of the node's
        res = step["result"]
        doc = res.get("gpufleet") if isinstance(res.get("gpufleet"), dict) and not res.get("failed") else None
        for status in [r.get("status") for r in (doc or {}).get("results") or []] if doc else ["error"]:
            counts[status] = counts.get(status, 0) + 1
    line = "[%s] gpufleet: %s: %s" % (host, stage, what)
    return line + (" | " + " ".join("%s=%d" % kv for kv in sorted(counts.items())) if counts else "")


def readiness_missing(inventory, benchmarks):
    """What a real run needs first and the node lacks, from its gpu_inventory step (check mode): NVML through
    nvidia-ml-py, the expected GPU count, and for the benchmarks torch with CUDA in gpufleet_python."""
    doc = (inventory or {}).get("gpufleet")
    if not isinstance(doc, dict):
        return ["gpu_inventory could not run: %s" % (inventory or {}).get("msg", "no answer")]
    missing = [
        "%s.%s: %s" % (r.get("group"), r.get("check"), r.get("reason"))
        for r in doc.get("results") or []
        if r.get("check") == "gpu_count" and r.get("status") not in ("pass", "warn", "info")
    ]
    versions = doc.get("versions") or {}
    not_read = versions.get("not_read") or {}
    if benchmarks and not versions.get("torch"):
        missing.append("torch, which the benchmarks need: %s" % not_read.get("torch", "not found"))
    elif benchmarks and not versions.get("torch_cuda"):
        missing.append(
            "torch with CUDA, which the benchmarks need: torch %s is a build without CUDA" % versions["torch"]
        )
    return missing


class ActionModule(NodeTake):
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        results = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname")
        # The node's environment beneath the site's, as the modules' input (never `environment`, which Ansible
        # writes into each module's command line).
        self._node_env = dict(args["site_env"], **args["node_env"])
        lock_args = dict(args["lock"], node_env=self._node_env)
        # This worker, and with it what it runs on the node, ends with the run's ansible-playbook (kill -9 included).
        stop_with_controller()
        self._lock_spec = dict((k, lock_args[k]) for k in ("path", "run_id", "holder"))
        bench = args["benchmark_args"]
        # Its references go to the node with its benchmarks, which measure again a figure past one of them.
        refs = read_references(args["run_dir"], host) if bench and read_references else None
        if refs:
            bench = dict(bench, references=refs)
        release = {
            "module": "node_lock",
            "name": "release",
            "args": dict(dict((k, lock_args[k]) for k in ("python", "path", "run_id", "holder")), state="released"),
        }
        checks = [{"module": g, "args": args["check_args"]} for g in CHECK_GROUPS]
        checks.append(
            {"module": "gpu_counters", "name": "counters_before", "args": dict(args["check_args"], phase="before")}
        )
        second = []
        if bench:
            second = [
                {"module": "benchmark", "args": bench},
                {"module": "gpu_counters", "name": "counters_after", "args": dict(args["check_args"], phase="after")},
            ]
        if args["release"]:
            second.append(release)

        # The wait comes after; the node's environment goes to node_steps once, not into each step's arguments.
        lock_step = {"module": "node_lock", "args": dict((k, lock_args[k]) for k in LOCK_ARGS if k != "node_env")}
        if self._task.check_mode:
            return self._plan(results, task_vars, host, lock_step, args["check_args"], bench, args["multinode"])
        done, lost, errors, lock = [], None, [], None
        asked = utc_now()  # the lock result's start: when this run asked for the node
        try:
            ran = self._steps([lock_step] + checks + ([] if bench else second), task_vars)
            lock = ran.pop(0)["result"]
            if lock.get("failed"):
                ran = []  # the lock could not be taken: nothing else ran
            if not lock.get("failed") and not lock.get("acquired") and not self._task.check_mode:
                lock = self.take(lock_args, task_vars, first=lock)  # a stale lock of this controller, or the wait
                if lock.get("acquired"):
                    ran = self._steps(checks + ([] if bench else second), task_vars)
            done += ran
            if lock.get("acquired"):
                display.display(stage_line(host, "checks", ", ".join(CHECK_GROUPS), lock, ran))
            if lock.get("acquired") and bench:
                display.display(stage_line(host, "benchmarks", ", ".join(bench.get("benchmarks") or [])))
                try:
                    done += self._steps(second, task_vars)
                except AnsibleConnectionFailure as exc:
                    lost = "the node was lost during the benchmarks: %s" % exc
                    errors.append(group_error("benchmark", {"msg": lost}))
        except AnsibleConnectionFailure as exc:
            lost = str(exc)
            if lock is None:
                errors.append(
                    error_result(
                        "reachable",
                        "connection",
                        "node did not answer: %s" % (lost or "no message"),
                        REMEDY_UNREACHABLE,
                        "environment",
                        {"ansible_host": task_vars.get("ansible_host", host)},
                    )
                )
            else:
                errors.append(group_error("gpu_inventory", {"msg": "the node was lost during the checks: %s" % lost}))
        except EngineError as exc:  # `gpufleet run alive` on this controller could not answer
            lock = dict(exc.fail_kwargs(), failed=True)

        reachable = lock is not None
        locked = bool(reachable and not lock.get("failed") and lock.get("acquired"))
        lock_results = []
        if lock is not None and lock.get("failed"):
            errors.insert(0, group_error("lock", lock))
        elif lock is not None and not self._task.check_mode:
            lock_results.append(lock_result(lock, lock_args, asked))
        docs, released = [], False
        for step in done:
            res = step["result"]
            if step["module"] == "node_lock":
                released = not res.get("failed")
                if res.get("failed"):
                    display.warning("%s: could not give the node lock back: %s" % (host, res.get("msg")))
            elif isinstance(res.get("gpufleet"), dict) and not res.get("failed"):
                docs.append((step["name"], res["gpufleet"]))
            else:
                errors.append(group_error(STEP_GROUPS[step["module"]], res))
                display.warning("%s on %s: %s" % (step["module"], host, errors[-1]["reason"]))

        document = dict(args["document"])
        if docs:
            document.update(docs[0][1])
        document.update(
            host=host,
            seconds=round(sum(d.get("seconds") or 0 for dummy, d in docs), 4),
            results=lock_results + [r for dummy, d in docs for r in d.get("results") or []] + errors,
        )
        path = self._write(args, host, document)
        if isinstance(path, dict):
            # The document could not be written: the task fails, saying why, and the node leaves the later plays;
            # its lock goes back now, as no later play will give it back.
            if locked and not released:
                try:
                    self._steps([release], task_vars)
                except AnsibleConnectionFailure:
                    pass
            return dict(results, failed=True, **path)

        benchmark = [d for name, d in docs if name == "benchmark"]
        trains = [r for d in benchmark for r in d.get("results") or [] if r.get("check") == "train_gpt2"]
        why = (
            "the node did not answer"
            if not reachable
            else "another run holds it"
            if not locked and not errors
            else "a module could not run on it (%s)" % ", ".join(dict.fromkeys(e["group"] for e in errors))
            if errors
            else ""
        )
        counts = {}
        for r in document["results"]:
            counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
        results.update(
            changed=False,
            path=path,
            steps=[name for name, dummy in docs],
            status_counts=counts,
            ansible_facts={
                "validate_node_reachable": reachable,
                "validate_node_locked": locked,
                "validate_node_lock_held": locked and not released,
                "validate_node_lock_results": lock_results,
                "validate_node_errors": errors,
                # Read by the entry point nccl_multinode: the node's own train_gpt2 figure for the scaling across nodes.
                "validate_node_benchmark": {"gpufleet": {"results": trains}} if benchmark else {},
                # Read by nccl_multinode and finetune_multinode: a node that was not reached, that another run holds,
                # or where a module could not run, stays out of the runs across nodes so it cannot hold the others up.
                "validate_node_multinode": {
                    "wanted": args["multinode"],
                    "ready": reachable and locked and not errors,
                    "why": why,
                },
            },
        )
        if lost:
            results.update(msg=lost, node_lost=True)
            display.warning("%s: %s; what it measured before is in its host document" % (host, lost))
        return results

    def _plan(self, results, task_vars, host, lock_step, check_args, bench, multinode):
        """Check mode: nothing measured and nothing written. The node is asked who holds its lock (the lock module in
        check mode reads it) and what a real run needs first: the gpu_inventory group (read-only) says whether NVML
        answers through nvidia-ml-py and whether the GPU count is the expected one; its document's versions say
        whether gpufleet_python has torch with CUDA, which the benchmarks need. The facts say what a real run would
        do there and what it lacks (validate_node_check_plan, read by check_mode_plan.yml)."""
        plan = {
            "reachable": True,
            "engine": None,
            "lock": None,
            "missing": [],
            "checks": list(CHECK_GROUPS) + ["counters"],
            "benchmarks": list((bench or {}).get("benchmarks") or []),
            "tier": (bench or {}).get("tier"),
        }
        try:
            lock, inventory = [
                step["result"]
                for step in self._steps([lock_step, {"module": "gpu_inventory", "args": check_args}], task_vars)
            ]
        except AnsibleConnectionFailure as exc:
            plan.update(reachable=False, engine="node did not answer: %s" % (exc or "no message"))
            lock = inventory = None
        if lock is not None and lock.get("failed"):
            plan["engine"] = lock.get("msg") or "gpufleet_python could not run the engine"
        elif lock is not None:
            record = lock.get("record") or {}
            holders = record.get("holders") or {}
            plan["lock"] = (
                "held by run %s (taken %s, for %s): a real run waits gpufleet_lock_wait_s for it, or takes it "
                "over if its holder is gone" % (record.get("run_id"), record.get("taken"), ", ".join(sorted(holders)))
                if holders
                else "free"
            )
            plan["missing"] = readiness_missing(inventory, bool(plan["benchmarks"]))
        display.display(
            "[%s] gpufleet: check mode: would run %s; benchmarks %s"
            % (host, ", ".join(plan["checks"]), ", ".join(plan["benchmarks"]) or "none")
        )
        results.update(
            changed=False,
            msg="check mode: nothing measured or written",
            ansible_facts={
                "validate_node_check_plan": plan,
                "validate_node_reachable": plan["reachable"],
                "validate_node_locked": False,
                "validate_node_lock_held": False,
                "validate_node_lock_results": [],
                "validate_node_errors": [],
                "validate_node_benchmark": {},
                "validate_node_multinode": {"wanted": multinode, "ready": False, "why": "check mode"},
            },
        )
        return results

    def _steps(self, steps, task_vars):
        """The steps run on the node by one gpufleet.cluster.node_steps module."""
        if not steps:
            return []
        res = self._execute_module(
            module_name="gpufleet.cluster.node_steps",
            task_vars=task_vars,
            module_args={"steps": steps, "node_env": self._node_env, "lock": self._lock_spec},
        )
        if res.get("unreachable"):
            raise AnsibleConnectionFailure(res.get("msg") or "the node did not answer")
        if res.get("failed") or not isinstance(res.get("steps"), list):
            # The module itself could not run (no Python on the node, say): every step is an error of its group.
            return [
                {"name": s.get("name") or s["module"], "module": s["module"], "result": dict(res, failed=True)}
                for s in steps
            ]
        return res["steps"]

    def _write(self, args, host, document):
        """The host document written under RUN_DIR/hosts; its path, or the failure as a dict."""
        if self._task.check_mode:
            return None
        python = args["controller_python"]
        controller = args["lock"]["controller"] or None  # refused when gone: what a stopped run left behind
        if write_host_document is not None and (not python or python == sys.executable):
            try:
                return write_host_document(Path(args["run_dir"]), host, document, controller=controller)["path"]
            except Exception as exc:  # InputError and OSError alike: said, as `gpufleet record` would
                return {
                    "msg": "the host document of %s could not be written under %s: %s" % (host, args["run_dir"], exc)
                }
        try:
            done = run_record(
                {
                    "run_dir": args["run_dir"],
                    "host": host,
                    "document": document,
                    "replace_groups": [],
                    "folder": "hosts",
                    "python": python,
                    "engine_src": ENGINE_SRC,
                    "db": None,
                    "no_store": True,
                    "controller": controller,
                }
            )
        except EngineError as exc:
            return exc.fail_kwargs()
        return done.get("path")
