"""gpufleet.cluster.node_validate: the whole node stage of validate.yml, for one node, in one task.

The stage itself is the engine's (`gpufleet node-stage`, gpufleet/node/stage.py), written once; this action runs
its two parts on the node and keeps what they measured, on the controller, in the task's own worker:

    run 1 on the node (gpufleet.cluster.node_stage, part checks)    the node lock (taken for this run), the check
                                                                    groups, the counters before
          [a lock held by a run of this controller that is gone is taken over, or waited for: NodeTake.take()]
    run 2 on the node (gpufleet.cluster.node_stage, part benchmarks) the tier's benchmarks (the engine decides which;
                                                                    handed RUN_DIR/references/<host>.json), the
                                                                    counters after, the lock given back (release)
    here                                                            the node's host document built from both parts
                                                                    and written to RUN_DIR/hosts/<host>.json; a
                                                                    summary returned

Why one task, and two module runs: most of what a run costs the controller is Ansible's own work per task and per
module it sends to a node (a worker forked, the task's templates compiled, its result copied back into the main
process and cleaned there), far more than the stage's work. One task a node that sends one module twice keeps a
whole run near 0.15 to 0.24 s of controller CPU a node (docs/scale.md; tools/controller_cost.py measures it).
Two runs, not one, so that a node lost during the benchmarks keeps what run 1 measured; a tier without benchmarks
is done in run 1.

What reaches the document when something goes wrong: a step of the stage that could not answer is an `error` result
of its group (the engine's); a part whose module could not run at all, one of the part's group; a node that did not
answer, one error result connection.reachable; a node another run holds is not measured and its document names
that run. The document is written with the engine's own writer (no process started for it); only a summary and the
facts the later plays read (validate_node_multinode, validate_node_lock_held, ...) go back to the main process,
since a result's size is paid again there. After each run, a line `[HOST] gpufleet: checks|benchmarks: ... |
pass=N ...` tells the live view (gpufleet.runner.events) where the node is and how it fares so far.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.utils.display import Display
from ansible_collections.gpufleet.cluster.plugins.action.node_take import ARGUMENT_SPEC as TAKE_SPEC
from ansible_collections.gpufleet.cluster.plugins.action.node_take import LOCK_ARGS, NodeTake, utc_now
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError, stop_with_controller
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import result
from ansible_collections.gpufleet.cluster.plugins.module_utils.record_module import run_record

display = Display()

# The keys of a host document a part's document gives the node's (the first part's: engine, profile, versions, the
# machine's identity).
DOCUMENT_KEYS = ("schema_version", "engine_version", "profile", "versions", "machine", "started")
STOP_WAIT_S = 60  # the engine waits this long at the least for a stale lock's processes to stop (gpufleet.base.lock)
ANSWER_MARGIN_S = 120  # beyond a part's own limit, for the module to kill the engine and answer
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
# The check groups the node's stage runs, for its lines and its bounds (the registry needs nothing beyond Python),
# and what the run tier runs there, for check mode: the controller's own lookup, the tier checked by run_inputs.
CHECK_GROUPS = _engine("gpufleet.base.registry", "group_names")()
stage_plan = _engine("gpufleet.base.registry", "stage_plan")

ARGUMENT_SPEC = {
    "lock": {"type": "dict", "required": True, "options": TAKE_SPEC},
    "stage": {"type": "dict", "required": True},
    "ttl_exact": {"type": "bool", "default": False},
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


def stage_line(host, stage, what, docs=(), lock=None):
    """The line that tells whoever watches the run (gpufleet.runner.events.STAGE_LINE) where the node is, with the
    statuses of what it has measured so far: `[HOST] gpufleet: STAGE: WHAT | pass=N warn=N ...`."""
    counts = {}
    if lock is not None and not docs:
        counts["pass" if lock.get("acquired") else "error"] = 1  # the lock's own result
    for doc in docs:
        for status in [r.get("status") for r in doc.get("results") or []]:
            counts[status] = counts.get(status, 0) + 1
    line = "[%s] gpufleet: %s: %s" % (host, stage, what)
    return line + (" | " + " ".join("%s=%d" % kv for kv in sorted(counts.items())) if counts else "")


def readiness_missing(inventory, benchmarks):
    """What a real run needs first and the node lacks, from its gpu_inventory step (check mode): NVML through
    nvidia-ml-py, the expected GPU count, and for the benchmarks torch with CUDA in gpufleet_python."""
    missing = [
        "%s.%s: %s" % (r.get("group"), r.get("check"), r.get("reason"))
        for r in inventory.get("results") or []
        if r.get("check") in ("gpu_count", "engine") and r.get("status") not in ("pass", "warn", "info")
    ]
    versions = inventory.get("versions") or {}
    not_read = versions.get("not_read") or {}
    if benchmarks and not versions.get("torch"):
        missing.append("torch, which the benchmarks need: %s" % not_read.get("torch", "not found"))
    elif benchmarks and not versions.get("torch_cuda"):
        missing.append(
            "torch with CUDA, which the benchmarks need: torch %s is a build without CUDA" % versions["torch"]
        )
    return missing


@contextlib.contextmanager
def answer_within(seconds):
    """The node's answer within `seconds`, or AnsibleConnectionFailure: the part's own limit, and the module's kill
    at it, are past by then, so a node that gives no answer at all (its connection hangs) is taken for lost."""

    def late(signum, frame):
        raise AnsibleConnectionFailure("the node gave no answer within %d s" % seconds)

    before = signal.signal(signal.SIGALRM, late)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


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
        self._stage = dict(args["stage"], host_name=host, release=args["release"])
        self._lock_spec = dict((k, lock_args[k]) for k in LOCK_ARGS if k not in ("python", "holder", "node_env"))
        self._lock_spec["ttl_exact"] = args["ttl_exact"]
        if self._task.check_mode:
            return self._plan(results, task_vars, host, args["multinode"])
        parts, lost, errors, lock = {}, None, [], None
        try:
            lock = self._checks(self._lock_spec, task_vars, parts)
            if not lock.get("failed") and not lock.get("acquired"):
                # a stale lock of this controller, or the wait; each ask runs the checks once the node is this run's
                lock = self.take(lock_args, task_vars, first=lock, ask=lambda a: self._checks(a, task_vars, parts))
            checks = parts.get("checks") or {}
            if lock.get("acquired"):
                display.display(stage_line(host, "checks", ", ".join(CHECK_GROUPS), [checks], lock))
            if lock.get("acquired") and not checks.get("done"):
                display.display(stage_line(host, "benchmarks", ", ".join(checks.get("benchmarks") or [])))
                try:
                    parts["benchmarks"] = self._benchmarks(args["run_dir"], checks, task_vars)
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
        if lock is not None and lock.get("failed"):
            errors.insert(0, group_error("lock", lock))
        for name, part in list(parts.items()):
            if part.get("failed"):  # the part's module could not run at all (its engine run did not answer)
                errors.append(group_error("benchmark" if name == "benchmarks" else "gpu_inventory", parts.pop(name)))
                display.warning("node_stage %s on %s: %s" % (name, host, errors[-1]["reason"]))
        docs = [parts[name] for name in ("checks", "benchmarks") if name in parts]
        released = any(d.get("released") for d in docs)
        if locked and docs and docs[-1].get("done") and args["release"] and not released:
            display.warning("%s: could not give the node lock back (the engine said why on the node)" % host)
        lock_results = [r for d in docs[:1] for r in d.get("results") or [] if r.get("check") == "node_lock"]

        document = dict(args["document"])
        if docs:
            document.update((k, docs[0][k]) for k in DOCUMENT_KEYS if k in docs[0])
        document.update(
            host=host,
            seconds=round(sum(d.get("seconds") or 0 for d in docs), 4),
            results=[r for d in docs for r in d.get("results") or []] + errors,
        )
        path = self._write(args, host, document)
        if isinstance(path, dict):
            # The document could not be written: the task fails, saying why, and the node leaves the later plays;
            # its lock goes back now, as no later play will give it back.
            if locked and not released:
                try:
                    give_back = dict((k, lock_args[k]) for k in ("python", "path", "run_id", "holder", "node_env"))
                    self._lock(dict(give_back, state="released"), task_vars)
                except AnsibleConnectionFailure:
                    pass
            return dict(results, failed=True, **path)

        trains = [r for r in (parts.get("benchmarks") or {}).get("results") or [] if r.get("check") == "train_gpt2"]
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
            steps=list(parts),
            status_counts=counts,
            ansible_facts={
                "validate_node_reachable": reachable,
                "validate_node_locked": locked,
                "validate_node_lock_held": locked and not released,
                "validate_node_lock_results": lock_results,
                "validate_node_errors": errors,
                # Read by the entry point nccl_multinode: the node's own train_gpt2 figure for the scaling across nodes.
                "validate_node_benchmark": {"gpufleet": {"results": trains}} if "benchmarks" in parts else {},
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

    def _part(self, part, task_vars, timeout_s, **more):
        """One part of the engine's node stage on the node (gpufleet.cluster.node_stage): its document, or the
        module's failure (`failed`) when it could not run; AnsibleConnectionFailure when the node gives no answer."""
        module_args = dict(self._stage, part=part, lock=self._lock_spec, node_env=self._node_env, **more)
        module_args["timeout_s"] = int(timeout_s)
        with answer_within(timeout_s + ANSWER_MARGIN_S):
            res = self._execute_module(
                module_name="gpufleet.cluster.node_stage", task_vars=task_vars, module_args=module_args
            )
        if res.get("unreachable"):
            raise AnsibleConnectionFailure(res.get("msg") or "the node did not answer")
        if res.get("failed") or not isinstance(res.get("stage"), dict):
            return dict(res, failed=True)
        return res["stage"]

    def _checks(self, lock_spec, task_vars, parts):
        """The part `checks` under `lock_spec` (its dead_runs and wait_s): the lock's answer, with its result; the
        part's document kept in `parts` when this run holds the node."""
        self._lock_spec = dict(self._lock_spec, dead_runs=lock_spec["dead_runs"], wait_s=lock_spec.get("wait_s") or 0)
        stage = self._stage
        wait_s = self._lock_spec["wait_s"]
        timeout_s = 60 + max(wait_s, STOP_WAIT_S) + (len(CHECK_GROUPS) + 2) * int(stage.get("check_timeout_s") or 120)
        doc = self._part("checks", task_vars, timeout_s)
        if doc.get("failed"):
            return doc
        got = dict(
            doc.get("lock") or {}, result=next((r for r in doc["results"] if r.get("check") == "node_lock"), None)
        )
        parts["checks"] = doc
        return got

    def _benchmarks(self, run_dir, checks, task_vars):
        """The part `benchmarks`, with what the node's figures are held against (it measures again a figure past
        one of them), within the sum of its benchmarks' timeouts."""
        refs = read_references(run_dir, self._stage["host_name"]) if read_references else None
        names = checks.get("benchmarks") or []
        stage = self._stage
        timeout_s = (
            len(names) * int(stage.get("benchmark_timeout_s") or 900)
            + (int(stage.get("soak_duration_s") or 0) if "soak" in names else 0)
            + int(stage.get("check_timeout_s") or 120)
            + 120
        )
        return self._part("benchmarks", task_vars, timeout_s, **({"references": refs} if refs else {}))

    def _plan(self, results, task_vars, host, multinode):
        """Check mode: nothing measured and nothing written. The node is asked who holds its lock and what a real run
        needs first (the engine's part `plan`: the lock read, the gpu_inventory group, read-only, which says whether
        NVML answers through nvidia-ml-py and whether the GPU count is the expected one; its document's versions say
        whether gpufleet_python has torch with CUDA, which the benchmarks need); what a real run would run there is the
        controller's own lookup of the tier (stage_plan). The facts say what a real run would do there and what it
        lacks (validate_node_check_plan, read by check_mode_plan.yml)."""
        plan = {
            "reachable": True,
            "engine": None,
            "lock": None,
            "missing": [],
            "checks": list(CHECK_GROUPS) + ["counters"],
        }
        # What the tier runs there: the controller's lookup, not the node's answer (nothing measured, nothing to ask).
        names, depth = stage_plan(self._stage.get("tier"), self._stage.get("benchmarks"), self._stage.get("depth"))
        plan.update(benchmarks=list(names), depth=depth)
        try:
            answer = self._part("checks", task_vars, 60 + 2 * int(self._stage.get("check_timeout_s") or 120))
        except AnsibleConnectionFailure as exc:
            plan.update(reachable=False, engine="node did not answer: %s" % (exc or "no message"))
            answer = None
        if answer is not None and answer.get("failed"):
            plan["engine"] = answer.get("msg") or "gpufleet_python could not run the engine"
        elif answer is not None:
            record = (answer.get("lock") or {}).get("record") or {}
            holders = record.get("holders") or {}
            plan["lock"] = (
                "held by run %s (taken %s, for %s): a real run waits gpufleet_lock_wait_s for it, or takes it "
                "over if its holder is gone" % (record.get("run_id"), record.get("taken"), ", ".join(sorted(holders)))
                if holders
                else "free"
            )
            plan["missing"] = readiness_missing(answer, bool(plan["benchmarks"]))
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

    def _write(self, args, host, document):
        """The host document written under RUN_DIR/hosts; its path, or the failure as a dict."""
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
