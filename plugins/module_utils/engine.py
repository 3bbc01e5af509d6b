# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Run the gpufleet engine for the gpufleet.cluster modules.

The modules stay thin: they declare their arguments and documentation and
call run_check_module() or run_report_module(). The engine itself
(`python -m gpufleet ...`) runs under gpufleet_python, which may differ from
the interpreter Ansible runs the module with.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess

CHECK_GROUPS = ("gpu_inventory", "gpu_health", "host_hygiene")

# Enough stderr to show a traceback's last frames, not a whole log.
TAIL_CHARS = 3000
# How long a process group gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 5

REMEDY_BRINGUP = "run bringup.yml (role python_env) or set gpufleet_python to an interpreter that has the gpufleet engine"
REMEDY_INPUT = "fix the variable or file the message names and run the playbook again"
REMEDY_RERUN = "read the stderr tail, fix the node and run the playbook again"

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

    def __init__(self, msg, rc=None, stdout="", stderr="", cmd=None, remedy=REMEDY_RERUN):
        super().__init__(msg)
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


def run_engine(python, args, timeout_s, host):
    """Run `python -m gpufleet ARGS`; return (rc, stdout, stderr).

    Raises EngineError when python is missing or the command passes timeout_s.
    """
    if not os.path.exists(python):
        raise EngineError(
            "gpufleet_python '%s' does not exist on %s: run bringup.yml (role python_env) or set gpufleet_python"
            % (python, host),
            remedy=REMEDY_BRINGUP,
        )
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        raise EngineError(
            "gpufleet_python '%s' on %s is not an executable file: set gpufleet_python to a Python interpreter"
            % (python, host),
            remedy=REMEDY_BRINGUP,
        )
    cmd = [python, "-m", "gpufleet"] + list(args)
    # C locale: the engine parses tool output; UTF-8 stays the encoding of its JSON.
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONIOENCODING="utf-8")
    # Its own session, so a timeout can kill everything the engine started.
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
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
        )
    return proc.returncode, out_text(out), out_text(err)


def out_text(data):
    return (data or b"").decode("utf-8", errors="replace")


def run_json(python, args, timeout_s, host, ok_rcs=(0,)):
    """Run the engine and parse the JSON object it prints; EngineError otherwise."""
    rc, out, err = run_engine(python, args, timeout_s, host)
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
        )
    if rc == 2:
        # Bad input: the engine's message names the variable or file.
        raise EngineError(err.strip() or "gpufleet refused its input (exit 2)", rc=rc, stdout=tail(out),
                          stderr=tail(err), cmd=cmd, remedy=REMEDY_INPUT)
    if rc not in ok_rcs:
        raise EngineError(
            "'%s' exited %s on %s; stderr tail: %s" % (" ".join(cmd), rc, host, tail(err) or "(empty)"),
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
        )
    try:
        doc = json.loads(out)
    except ValueError as exc:
        raise EngineError(
            "'%s' on %s printed no JSON (%s); stdout starts: %r; stderr tail: %s"
            % (" ".join(cmd), host, exc, out[:200], tail(err) or "(empty)"),
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
        )
    if not isinstance(doc, dict):
        raise EngineError("'%s' on %s printed JSON that is not an object" % (" ".join(cmd), host), rc=rc,
                          stdout=tail(out), stderr=tail(err), cmd=cmd)
    return rc, doc


def check_command(group, host_name=None, profile=None, thresholds=None):
    args = ["check", "--group", group, "--json"]
    if host_name:
        args += ["--host", host_name]
    if profile:
        args += ["--profile", profile]
    if thresholds:
        args += ["--thresholds", json.dumps(thresholds, sort_keys=True)]
    return args


def run_check_module(module, group):
    """Body of a check module: run one check group, return its host document.

    A failed check is data (status fail in the document), never a module
    failure; the module fails only when the engine could not answer.
    """
    p = module.params
    host = p["host_name"] or socket.gethostname()
    args = check_command(group, p["host_name"], p["profile"], p["thresholds"])
    try:
        dummy, doc = run_json(p["python"], args, p["timeout_s"], host)
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    if not isinstance(doc.get("results"), list):
        module.fail_json(msg="gpufleet check on %s printed a document without a results list" % host,
                         stdout=json.dumps(doc)[:TAIL_CHARS])
    module.exit_json(changed=False, gpufleet=doc)


def report_argument_spec():
    return dict(
        run_dir=dict(type="path", required=True),
        expect_hosts=dict(type="list", elements="str", default=[]),
        python=dict(type="path"),
        timeout_s=dict(type="int", default=300),
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
    try:
        rc, summary = run_json(python, args, p["timeout_s"], "the controller", ok_rcs=(0, 1))
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    files = summary.get("files") or {}
    run_dir = p["run_dir"]
    module.exit_json(
        changed=True,
        accepted=rc == 0,
        verdict=summary.get("verdict"),
        failed_hosts=failed_hosts(summary),
        summary=summary,
        report_json=files.get("json", os.path.join(run_dir, "report.json")),
        report_md=files.get("md", os.path.join(run_dir, "report.md")),
        report_html=files.get("html", os.path.join(run_dir, "report.html")),
        junit_xml=files.get("junit", os.path.join(run_dir, "junit.xml")),
    )
