# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Run the gpufleet engine for the gpufleet.cluster modules.

The modules stay thin: they declare their arguments and documentation and
call run_check_module(), run_benchmark_module() or run_report_module(). The
engine itself (`python -m gpufleet ...`) runs under gpufleet_python, which may
differ from the interpreter Ansible runs the module with.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

CHECK_GROUPS = ("gpu_inventory", "gpu_health", "host_hygiene")

# Enough stderr to show a traceback's last frames, not a whole log.
TAIL_CHARS = 3000
# How long a process group gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 5
# How often a waiting module looks whether its controller is still there.
CHECK_EVERY_S = 1.0
PR_SET_PDEATHSIG = 1

REMEDY_BRINGUP = "run bringup.yml (role python_env) or set gpufleet_python to an interpreter that has the gpufleet engine"
REMEDY_INPUT = "fix the variable or file the message names and run the playbook again"
REMEDY_RERUN = "read the stderr tail, fix the node and run the playbook again"

# Benchmarks `gpufleet bench` knows, and the group of their results (gpufleet.checks.benchmarks.GROUP).
BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "train_gpt2", "soak")
BENCHMARK_TIERS = ("smoke", "quick", "thorough")
BENCHMARK_GROUP = "benchmark"
SCHEMA_VERSION = 1  # gpufleet.schema.SCHEMA_VERSION: the host documents this module builds itself

REMEDY_TIMEOUT = ("the benchmark hung or needs longer than timeout_s: read the stderr tail and the node's gpu_health "
                  "results, then re-run, with a longer timeout_s if the tier needs it")

_NO_ENGINE = re.compile(r"No module named '?gpufleet'?\s*$", re.MULTILINE)


def check_argument_spec():
    """Arguments shared by gpu_inventory, gpu_health and host_hygiene."""
    return dict(
        python=dict(type="path", required=True),
        profile=dict(type="str"),
        thresholds=dict(type="dict"),
        timeout_s=dict(type="int", default=120),
        host_name=dict(type="str"),
    )


class EngineError(Exception):
    """The engine could not give an answer; the message says why and what to do."""

    # kind: "python" (no interpreter), "engine" (not installed), "input" (refused its input), "timeout",
    # "exit" (non-zero exit) or "output" (no JSON object printed).
    def __init__(self, msg, rc=None, stdout="", stderr="", cmd=None, remedy=REMEDY_RERUN, kind="exit"):
        super().__init__(msg)
        self.kind = kind
        self.msg = msg
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.cmd = cmd
        self.remedy = remedy

    def fail_kwargs(self):
        kwargs = dict(msg=self.msg, rc=self.rc, stdout=self.stdout, stderr=self.stderr, cmd=self.cmd, remedy=self.remedy)
        return dict((k, v) for k, v in kwargs.items() if v is not None)


def tail(text, limit=TAIL_CHARS):
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _kill_group(proc):
    """SIGTERM the whole process group, then SIGKILL what is left after the grace period."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            # The leader is gone; children that ignored SIGTERM must not outlive it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return


def _die_with_parent():
    """In the engine before exec: the kernel sends it SIGTERM should this module die (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def controller_gone():
    """Whether whoever reads this module's output is gone: the ssh session or the local worker that started it
    closed its end of stdout (a pipe reports POLLERR, a socket POLLHUP). False when it cannot tell."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
        return any(events & (select.POLLERR | select.POLLHUP) for dummy, events in poller.poll(0))
    except (ValueError, OSError, AttributeError):  # no real stdout (tests that capture it), or no poll()
        return False


class _Interrupted(Exception):
    pass


def run_engine(python, args, timeout_s, host, input_text=None, engine_src=None):
    """Run `python -m gpufleet ARGS` (with input_text on its stdin); return (rc, stdout, stderr).

    engine_src, a folder holding the gpufleet package (the collection's src/), goes first on PYTHONPATH: the
    controller modules run the engine that ships with the collection, installed or checked out.

    Raises EngineError when python is missing or the command passes timeout_s. The engine leaves nothing
    behind: it is killed with its process group when this module is stopped (a signal), when the controller
    that waits for this module is gone, and, through the kernel, when this module dies.
    """
    if not os.path.exists(python):
        raise EngineError(
            "gpufleet_python '%s' does not exist on %s: run bringup.yml (role python_env) or set gpufleet_python"
            % (python, host),
            remedy=REMEDY_BRINGUP,
            kind="python",
        )
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        raise EngineError(
            "gpufleet_python '%s' on %s is not an executable file: set gpufleet_python to a Python interpreter"
            % (python, host),
            remedy=REMEDY_BRINGUP,
            kind="python",
        )
    cmd = [python, "-m", "gpufleet"] + list(args)
    # C locale: the engine parses tool output; UTF-8 stays the encoding of its JSON. GPUFLEET_PARENT_PID: the
    # engine's guard stops everything should this module go without the kernel's signal reaching it.
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONIOENCODING="utf-8", GPUFLEET_PARENT_PID=str(os.getpid()))
    if engine_src:
        env["PYTHONPATH"] = os.pathsep.join([engine_src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # Its own session, so a timeout can kill everything the engine started.
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=_die_with_parent,
    )

    def interrupted(signum, frame):
        raise _Interrupted(signal.Signals(signum).name)

    handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            handlers[sig] = signal.signal(sig, interrupted)
        except ValueError:  # not the main thread: nothing to install
            pass
    deadline = time.monotonic() + timeout_s
    data = input_text.encode("utf-8") if input_text is not None else None
    try:
        while True:
            try:
                out, err = proc.communicate(data, timeout=max(0.01, min(CHECK_EVERY_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                # The input is on its way already: communicate() refuses it a second time and goes on sending it.
                data = None
                if controller_gone():
                    raise _Interrupted("the controller closed the connection")
                if time.monotonic() >= deadline:
                    raise
    except _Interrupted as why:
        # Nobody will read what the engine would say: stop it and everything it started, then go.
        _kill_group(proc)
        raise SystemExit("gpufleet: stopped (%s); the engine and its process group were killed" % why)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # a grandchild in another session still holds the pipes
            out, err = b"", b""
        stderr = out_text(err)
        raise EngineError(
            "command '%s' passed its timeout of %s s on %s and was killed; stderr tail: %s"
            % (" ".join(cmd), timeout_s, host, tail(stderr) or "(empty)"),
            rc=proc.returncode,
            stdout=tail(out_text(out)),
            stderr=tail(stderr),
            cmd=cmd,
            kind="timeout",
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        # Workers the engine started in its own group must not outlive it (the engine may have died first).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.returncode, out_text(out), out_text(err)


def out_text(data):
    return (data or b"").decode("utf-8", errors="replace")


# gpufleet check, bench, counters and finetune exit 1 when a result failed or erred: the document says which.
RESULT_RCS = (0, 1)


def run_json(python, args, timeout_s, host, ok_rcs=(0,), input_text=None, engine_src=None):
    """Run the engine and parse the JSON object it prints; EngineError otherwise."""
    rc, out, err = run_engine(python, args, timeout_s, host, input_text=input_text, engine_src=engine_src)
    cmd = [python, "-m", "gpufleet"] + list(args)
    if _NO_ENGINE.search(err):
        raise EngineError(
            "gpufleet_python '%s' on %s has no gpufleet engine installed (No module named gpufleet): "
            "run bringup.yml (role python_env) or set gpufleet_python" % (python, host),
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
            remedy=REMEDY_BRINGUP,
            kind="engine",
        )
    if rc == 2:
        # Bad input: the engine's message names the variable or file.
        raise EngineError(err.strip() or "gpufleet refused its input (exit 2)", rc=rc, stdout=tail(out),
                          stderr=tail(err), cmd=cmd, remedy=REMEDY_INPUT, kind="input")
    exited = EngineError(
        "'%s' exited %s on %s; stderr tail: %s" % (" ".join(cmd), rc, host, tail(err) or "(empty)"),
        rc=rc,
        stdout=tail(out),
        stderr=tail(err),
        cmd=cmd,
    )
    if rc not in ok_rcs:
        raise exited
    try:
        doc = json.loads(out)
    except ValueError as exc:
        if rc != 0:  # a crash (a traceback exits 1 too), not a document saying a result failed
            raise exited
        raise EngineError(
            "'%s' on %s printed no JSON (%s); stdout starts: %r; stderr tail: %s"
            % (" ".join(cmd), host, exc, out[:200], tail(err) or "(empty)"),
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
            kind="output",
        )
    if not isinstance(doc, dict):
        raise EngineError("'%s' on %s printed JSON that is not an object" % (" ".join(cmd), host), rc=rc,
                          stdout=tail(out), stderr=tail(err), cmd=cmd, kind="output")
    return rc, doc


def node_args(host_name=None, profile=None, thresholds=None):
    """The options every engine command that judges a node takes: the host name, the profile, the thresholds."""
    args = []
    if host_name:
        args += ["--host", host_name]
    if profile:
        args += ["--profile", profile]
    if thresholds:
        args += ["--thresholds", json.dumps(thresholds, sort_keys=True)]
    return args


def check_command(group, host_name=None, profile=None, thresholds=None):
    return ["check", "--group", group, "--json"] + node_args(host_name, profile, thresholds)


def run_check_module(module, group):
    """Body of a check module: run one check group, return its host document.

    A failed check is data (status fail in the document), never a module
    failure; the module fails only when the engine could not answer.
    """
    p = module.params
    host = p["host_name"] or socket.gethostname()
    args = check_command(group, p["host_name"], p["profile"], p["thresholds"])
    try:
        dummy, doc = run_json(p["python"], args, p["timeout_s"], host, ok_rcs=RESULT_RCS)
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    if not isinstance(doc.get("results"), list):
        module.fail_json(msg="gpufleet check on %s printed a document without a results list" % host,
                         stdout=json.dumps(doc)[:TAIL_CHARS])
    # Also as a fact, so later plays (and `ansible -m setup`-style ad hoc use) can read the node's verdicts.
    module.exit_json(changed=False, gpufleet=doc, ansible_facts={"gpufleet_%s" % group: doc})


def benchmark_argument_spec():
    return dict(
        python=dict(type="path", required=True),
        benchmarks=dict(type="list", elements="str", required=True, choices=list(BENCHMARKS)),
        tier=dict(type="str", default="quick", choices=list(BENCHMARK_TIERS)),
        thresholds=dict(type="dict"),
        profile=dict(type="str"),
        timeout_s=dict(type="int", default=900),
        host_name=dict(type="str"),
        nnodes=dict(type="int", default=1),
        node_rank=dict(type="int", default=0),
        master_addr=dict(type="str", default="127.0.0.1"),
        master_port=dict(type="int"),
        train_reference=dict(type="dict"),
        soak_duration_s=dict(type="int"),
    )


# Benchmarks that run across hosts (nnodes > 1), under torchrun.
MULTINODE_BENCHMARKS = ("nccl", "train_gpt2")


def benchmark_input_problem(p):
    """What is wrong with the benchmark module's arguments, or None."""
    if not p["benchmarks"]:
        return "benchmarks is empty; expected one or more of %s" % ", ".join(BENCHMARKS)
    if p["timeout_s"] < 1:
        return "timeout_s = %s; expected a positive number of seconds" % p["timeout_s"]
    if p["nnodes"] < 1:
        return "nnodes = %s; expected 1 or more hosts" % p["nnodes"]
    if not 0 <= p["node_rank"] < p["nnodes"]:
        return "node_rank = %s; expected 0 to nnodes - 1 (%s)" % (p["node_rank"], p["nnodes"] - 1)
    if p["nnodes"] > 1 and [b for b in p["benchmarks"] if b not in MULTINODE_BENCHMARKS]:
        return "nnodes = %s runs across hosts, which only %s do; got benchmarks %s" % (
            p["nnodes"], " and ".join(MULTINODE_BENCHMARKS), p["benchmarks"])
    if p["master_port"] is not None and not 0 < p["master_port"] < 65536:
        return "master_port = %s; expected a TCP port, 1 to 65535" % p["master_port"]
    return None


def torchrun_engine_timeout_s(timeout_s):
    """The engine's own limit for torchrun (NCCL, training, the fine-tune), inside timeout_s.

    The engine kills torchrun first and still reports the log tail; the
    margin covers its start-up and the kill, before this module's own kill.
    """
    return max(1, timeout_s - min(60, max(10, timeout_s // 4)))


def free_port(addr="127.0.0.1"):
    """A TCP port nobody listens on now: single-node NCCL runs on one machine must not share one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def engine_runs(names):
    """The benchmarks of each engine run: one each, but sdc in matmul's run when both are asked for (the engine then
    computes it in the matmul workers, sparing a second start of torch and CUDA on every GPU)."""
    if "matmul" in names and "sdc" in names:
        return [["matmul", "sdc"] if name == "matmul" else [name] for name in names if name != "sdc"]
    return [[name] for name in names]


def bench_command(names, p, master_port=None):
    name = names[0]
    args = ["bench"] + list(names) + ["--tier", p["tier"], "--json"] + node_args(p["host_name"], p["profile"], p["thresholds"])
    if name in ("nccl", "train_gpt2"):  # both run under torchrun
        args += ["--nnodes", str(p["nnodes"]), "--node-rank", str(p["node_rank"]), "--master-addr", p["master_addr"],
                 "--master-port", str(master_port), "--timeout-s", str(torchrun_engine_timeout_s(p["timeout_s"]))]
    if name == "soak" and p["soak_duration_s"]:
        args += ["--duration-s", str(p["soak_duration_s"])]
    if name == "train_gpt2" and p["nnodes"] > 1 and p["train_reference"]:
        args += ["--train-reference", json.dumps(train_reference(p["train_reference"]), sort_keys=True)]
    return args


def train_reference(res):
    """What the engine needs of the node's single-node benchmark.train_gpt2 result: its figure and why not."""
    ref = dict((k, res.get(k)) for k in ("check", "group", "status", "value", "unit", "reason"))
    detail = res.get("detail")
    ref["world_size"] = detail.get("world_size") if isinstance(detail, dict) else None
    return ref


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def result(check, status, reason, group, started, seconds, remedy=None, detail=None, failure_class=None):
    """A result with the keys of gpufleet.schema.result (the engine may not be importable here); the class of a
    result that is not pass or skip: software, the engine's own failure, unless the cause is known."""
    if status not in ("pass", "skip"):
        failure_class = failure_class or "software"
    return dict(check=check, group=group, status=status, value=None, unit=None, threshold=None, reason=reason,
                remedy=remedy, detail=detail or {}, started=started, seconds=seconds, **{"class": failure_class})


def failure_class_of(exc):
    """environment when the node's disk is full (the engine could not write its work files), else software."""
    return "environment" if "No space left on device" in "%s %s" % (exc.msg, exc.stderr or "") else "software"


def host_document(host, started, seconds, results, first=None):
    """A host document; `first` (an engine document) gives engine version, profile and versions."""
    first = first or {}
    return dict(schema_version=first.get("schema_version", SCHEMA_VERSION), host=host,
                engine_version=first.get("engine_version"), profile=first.get("profile"),
                versions=first.get("versions") or {}, started=started, seconds=seconds, results=results)


def start_engine_run(module, name, problem, checks, group, check_mode_msg):
    """What every module that launches an engine run does first: (host, started, t0).

    Bad input fails the module with `problem` (from the module's own checks of its arguments). In check mode
    nothing runs: each of `checks` is a `skip` result saying why, and the module exits.
    """
    host = module.params["host_name"] or socket.gethostname()
    if problem:
        module.fail_json(msg="gpufleet.cluster.%s on %s: %s" % (name, host, problem), remedy=REMEDY_INPUT)
    started, t0 = utc_now(), time.monotonic()
    if module.check_mode:
        results = [result(check, "skip", check_mode_msg, group, started, 0.0) for check in checks]
        module.exit_json(changed=False, skipped=True, msg=check_mode_msg,
                         gpufleet=host_document(host, started, 0.0, results))
    return host, started, t0


def run_engine_results(module, p, args, host, check, group, what, detail, timeout_remedy=REMEDY_TIMEOUT):
    """One engine run for `check`: (its document or None, its results).

    The module fails when the engine cannot run at all (no interpreter, no engine, input it refuses). A run
    killed at p["timeout_s"], crashed, or whose document has no results list is one `error` result carrying
    `detail` and what the run left (command, exit code, output tails), so the node still reaches the report.
    """
    when, t0 = utc_now(), time.monotonic()
    try:
        dummy, doc = run_json(p["python"], args, p["timeout_s"], host, ok_rcs=RESULT_RCS)
    except EngineError as exc:
        if exc.kind in ("python", "engine", "input"):
            module.fail_json(**exc.fail_kwargs())
        remedy = timeout_remedy if exc.kind == "timeout" else exc.remedy
        detail = dict(detail, rc=exc.rc, cmd=exc.cmd, stderr=exc.stderr, stdout=exc.stdout, timeout_s=p["timeout_s"])
        return None, [result(check, "error", exc.msg, group, when, round(time.monotonic() - t0, 2), remedy, detail,
                             failure_class_of(exc))]
    if not isinstance(doc.get("results"), list):
        detail = dict(detail, cmd=[p["python"], "-m", "gpufleet"] + list(args), stdout=json.dumps(doc)[:TAIL_CHARS])
        return None, [result(check, "error", "%s on %s printed a document without a results list" % (what, host), group,
                             when, round(time.monotonic() - t0, 2), REMEDY_RERUN, detail)]
    return doc, doc["results"]


def run_benchmark_module(module):
    """Body of the benchmark module: one engine run per benchmark, one host document for all.

    Each benchmark runs in its own engine process with its own timeout, so a
    benchmark that hangs or crashes becomes an `error` result and the others
    keep what they measured. The module fails only when the engine cannot run
    at all (no interpreter, no engine, input it refuses).
    """
    p = module.params
    # Nothing on the node changes, but benchmarks load its GPUs for minutes: not in a dry run.
    host, started, t0 = start_engine_run(
        module, "benchmark", benchmark_input_problem(p), p["benchmarks"], BENCHMARK_GROUP,
        "benchmarks not run in check mode: they load the GPUs; run without --check to measure")
    docs, results = [], []
    for names in engine_runs(p["benchmarks"]):
        # Inside one node the port only has to be free; across nodes every node dials the master's.
        port = p["master_port"] if p["nnodes"] > 1 or p["master_port"] else free_port()
        what = "gpufleet bench %s" % " ".join(names)
        run_p = dict(p, timeout_s=p["timeout_s"] * len(names))  # each benchmark of the run has its own timeout_s
        doc, name_results = run_engine_results(module, run_p, bench_command(names, p, port), host, names[0],
                                               BENCHMARK_GROUP, what, dict(benchmark=names[0]))
        if doc is None:  # the run's error stands for each of its benchmarks
            name_results += [dict(name_results[0], check=name, detail=dict(name_results[0]["detail"], benchmark=name))
                             for name in names[1:]]
        else:
            docs.append(doc)
        results.extend(name_results)
    doc = host_document(host, started, round(time.monotonic() - t0, 4), results, docs[0] if docs else None)
    module.exit_json(changed=False, gpufleet=doc)


def report_argument_spec():
    return dict(
        run_dir=dict(type="path", required=True),
        expect_hosts=dict(type="list", elements="str", default=[]),
        python=dict(type="path"),
        engine_src=dict(type="path"),
        timeout_s=dict(type="int", default=300),
        db=dict(type="path"),
        baseline=dict(type="str"),
        set_baseline=dict(type="bool", default=False),
        slurm_names=dict(type="dict", default={}),
    )


def failed_hosts(summary):
    """Hosts whose verdict is fail, from the report summary's `nodes` mapping."""
    nodes = summary.get("nodes") or {}
    return sorted(host for host, node in nodes.items() if isinstance(node, dict) and node.get("verdict") == "fail")


def run_report_module(module, python):
    """Body of fleet_report: aggregate RUN_DIR/hosts/*.json; a failed node is data, not a module failure."""
    p = module.params
    args = ["report", p["run_dir"], "--json"]
    for host in p["expect_hosts"]:
        args += ["--expect-host", host]
    if p["db"]:
        args += ["--db", p["db"]]
    if p["baseline"]:
        args += ["--baseline", p["baseline"]]
    if p["set_baseline"]:
        args.append("--set-baseline")
    for host, name in sorted(p["slurm_names"].items()):
        args += ["--slurm-name", "%s=%s" % (host, name)]
    try:
        rc, summary = run_json(python, args, p["timeout_s"], "the controller", ok_rcs=(0, 1), engine_src=p["engine_src"])
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    files = summary.get("files") or {}
    run_dir = p["run_dir"]
    module.exit_json(
        changed=True,
        accepted=rc == 0,
        drain=summary.get("drain") or [],
        baseline=summary.get("baseline"),
        verdict=summary.get("verdict"),
        failed_hosts=failed_hosts(summary),
        summary=summary,
        report_json=files.get("json", os.path.join(run_dir, "report.json")),
        report_md=files.get("md", os.path.join(run_dir, "report.md")),
        report_html=files.get("html", os.path.join(run_dir, "report.html")),
        junit_xml=files.get("junit", os.path.join(run_dir, "junit.xml")),
    )
