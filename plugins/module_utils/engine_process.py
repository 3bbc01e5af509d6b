# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Run the gpufleet engine (`python -m gpufleet ...`) for the gpufleet.cluster modules, supervised.

The engine runs under gpufleet_python, which may differ from the interpreter Ansible runs the module with. The
module bodies are beside this file (check_module, benchmark_module, report_module, engine_results); what they copy
from the engine is in engine_schema.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time


# Enough stderr to show a traceback's last frames, not a whole log.
TAIL_CHARS = 3000
# How long a process group gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 5
# How often a waiting module looks whether its controller is still there.
CHECK_EVERY_S = 1.0
PR_SET_PDEATHSIG = 1


REMEDY_BRINGUP = (
    "run bringup.yml (role python_env) or set gpufleet_python to an interpreter that has the gpufleet engine"
)
REMEDY_INPUT = "fix the variable or file the message names and run the playbook again"
REMEDY_RERUN = "read the stderr tail, fix the node and run the playbook again"


_NO_ENGINE = re.compile(r"No module named '?gpufleet'?\s*$", re.MULTILINE)

# gpufleet_node_env: what the engine and everything it starts get in their environment. It reaches this module as
# its input (option node_env), never as Ansible's `environment`, which writes every value into the module's command
# line (`/bin/sh -c 'NAME=value python ...'`), readable by any user of the node in /proc/<pid>/cmdline. Its values
# leave the module's parameters as soon as they are taken, so its result (invocation.module_args, printed at -vvv)
# names the variables only. Not no_log: Ansible would then mask every occurrence of each value in the whole result,
# a "1" or "eth0" included, which would mangle the host document.
NODE_ENV = {}
WITHHELD = "(withheld)"


# The module's payload (Ansible's AnsiballZ_<module>.py in its temporary folder, written there unless the connection
# pipelines) holds every argument, node_env's values too. The module removes its own as soon as it has its arguments,
# and any a killed run left: a payload of a gpufleet module no process runs, left for STALE_PAYLOAD_S. A younger one
# may be another run's in the instant between being copied and started.
PAYLOAD_MARK = b"ansible_collections.gpufleet.cluster.plugins.modules."
STALE_PAYLOAD_S = 600
_FORGOTTEN = []


def _gpufleet_payloads(folder):
    """The paths of the AnsiballZ payloads of gpufleet modules in `folder`."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith("AnsiballZ_") and n.endswith(".py")]
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                if PAYLOAD_MARK in f.read():
                    found.append(path)
        except OSError:
            continue
    return found


def _command_lines():
    """The command line of every process of this node, as text."""
    lines = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:  # gone meanwhile, or not a process
            continue
    return lines


def _age_s(path):
    try:
        return time.time() - os.path.getmtime(path)
    except OSError:
        return 0.0


def forget_payload():
    """Remove this module's payload from the node, then those of gpufleet modules a killed run left in Ansible's
    temporary folders (ansible-tmp-* under remote_tmp), each with its folder once that is empty. Once a module."""
    if _FORGOTTEN:
        return
    _FORGOTTEN.append(True)
    try:
        from ansible.module_utils import basic

        args = json.loads(getattr(basic, "_ANSIBLE_ARGS", None) or b"{}").get("ANSIBLE_MODULE_ARGS") or {}
    except (ImportError, ValueError, AttributeError):
        return
    own = args.get("_ansible_tmpdir")
    for path in _gpufleet_payloads(own) if own else []:
        try:
            os.remove(path)
        except OSError:  # another user's folder (become): Ansible removes it when the module ends
            pass
    root = os.path.expanduser(os.path.expandvars(args.get("_ansible_remote_tmp") or "~/.ansible/tmp"))
    try:
        folders = [os.path.join(root, n) for n in os.listdir(root) if n.startswith("ansible-tmp-")]
    except OSError:
        return
    stale = [p for f in folders if f != own for p in _gpufleet_payloads(f) if _age_s(p) >= STALE_PAYLOAD_S]
    running = _command_lines() if stale else []
    for path in stale:
        if any(path in line for line in running):  # a module still running (its own removal was refused)
            continue
        try:
            os.remove(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def add_node_env(params, env=None):
    """Take params["node_env"] (or `env`) into the environment of the engine processes this module starts; the
    values in params are replaced by WITHHELD. The module's payload, which holds them, is removed first."""
    forget_payload()
    env = params.get("node_env") if env is None else env
    for name, value in (env or {}).items():
        NODE_ENV[str(name)] = str(value)
    if env is params.get("node_env") and params.get("node_env"):
        params["node_env"] = dict((name, WITHHELD) for name in params["node_env"])


def node_env_argument_spec():
    return dict(node_env=dict(type="dict", default={}))


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
        kwargs = dict(
            msg=self.msg, rc=self.rc, stdout=self.stdout, stderr=self.stderr, cmd=self.cmd, remedy=self.remedy
        )
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


def _stop_own_group(signum, frame):
    """What ansible-core 2.19 and later do in a worker on SIGINT and SIGTERM: the signal to its whole group, then out."""
    signal.signal(signum, signal.SIG_DFL)
    try:
        os.killpg(os.getpid(), signum)
    finally:
        os._exit(1)


def stop_with_controller():
    """In a task's worker on the controller (an action plugin): the kernel sends the worker SIGTERM when the
    ansible-playbook process that forked it dies, kill -9 included (PR_SET_PDEATHSIG), and Ansible's handler in the
    worker then kills the worker's process group: the ssh client, or the module's own process on a local
    connection. The node sees its connection close and stops what the task started there (controller_gone), so a
    run whose controller is gone measures no more, nor writes a document. Already gone (the worker's parent is no
    longer the process that forked it): the same, at once. Nothing outside a worker (no multiprocessing parent).

    ansible-core before 2.19 has no such handler, and its worker shares ansible-playbook's process group: there the
    worker gets a session of its own and the handler here, or an interrupted run's ssh client (and with it the
    node's engine) would outlive it (tests/test_faults.py, tests/test_orphans.py)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    if os.getpgid(0) != os.getpid():  # not its own group's leader: an ansible-core before 2.19
        os.setsid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _stop_own_group)
    _die_with_parent()
    if os.getppid() != parent.pid:
        os.kill(os.getpid(), signal.SIGTERM)


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
    env = dict(os.environ, **NODE_ENV)
    env.update(LC_ALL="C", LANG="C", PYTHONIOENCODING="utf-8", GPUFLEET_PARENT_PID=str(os.getpid()))
    if engine_src:
        env["PYTHONPATH"] = os.pathsep.join([engine_src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # The input comes from a file, not a pipe: communicate() called again after a timeout does not go on
    # sending what a pipe had not taken yet, and an engine slow to start would wait for the rest of it forever.
    stdin = subprocess.DEVNULL
    if input_text is not None:
        stdin = tempfile.TemporaryFile()
        stdin.write(input_text.encode("utf-8"))
        stdin.seek(0)
    # Its own session, so a timeout can kill everything the engine started.
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        if input_text is not None:
            stdin.close()

    def interrupted(signum, frame):
        raise _Interrupted(signal.Signals(signum).name)

    handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            handlers[sig] = signal.signal(sig, interrupted)
        except ValueError:  # not the main thread: nothing to install
            pass
    deadline = time.monotonic() + timeout_s
    exited_at = None
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=max(0.01, min(CHECK_EVERY_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if controller_gone():
                    raise _Interrupted("the controller closed the connection")
                if time.monotonic() >= deadline:
                    raise
                if proc.poll() is not None:
                    # The engine is gone (killed, say) but workers it started still hold its output open: they must
                    # not outlive it, nor keep this module waiting until its timeout.
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at >= KILL_GRACE_S:
                        try:
                            os.killpg(proc.pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
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
        raise EngineError(
            err.strip() or "gpufleet refused its input (exit 2)",
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
            remedy=REMEDY_INPUT,
            kind="input",
        )
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
        raise EngineError(
            "'%s' on %s printed JSON that is not an object" % (" ".join(cmd), host),
            rc=rc,
            stdout=tail(out),
            stderr=tail(err),
            cmd=cmd,
            kind="output",
        )
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
