"""The node's steps, each in an engine process of its own: what the node stage (node/stage.py) and `gpufleet bench
--each-timeout-s` (the benchmark module's engine run) run their steps with.

    step(python, argv, timeout_s, shown)     one `python -m gpufleet ARGV` in a session of its own, killed with what
                                             it started at timeout_s: (its document, None, what it left) or (None,
                                             why it gave none, what it left)
    run(...)                                 a step's results: its document's, or an `error` result for each check it
                                             stood for, of its group (a killed, crashed or silent step)
    engine_runs(names)                       the benchmarks of each engine process (sdc in matmul's)
    benchmarks(python, names, ...)           each engine run of the benchmarks as a step of its own timeout
    document(host, docs, results, ...)       the host document of several steps

A step that hangs, crashes or is killed is an `error` result, and the others keep what they measured. Each step
carries the node lock its run holds (lock.ENV, in the environment) and names this process as its parent
(GPUFLEET_PARENT_PID): it stops when the run loses the node or this process goes (guard.py), and this process
stops it, and everything it started, when it is stopped itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

from gpufleet import __version__
from gpufleet.base import guard, registry, schema
from gpufleet.bench import launch

TAIL_CHARS = 3000  # enough stderr to show a traceback's last frames, not a whole log
REMEDY_RERUN = "read the stderr tail, fix the node and run again"
REMEDY_TIMEOUT = (
    "the benchmark hung or needs longer than its timeout (gpufleet_benchmark_timeout_s): read the stderr tail and the "
    "node's gpu_health results, then run again, with a longer timeout if the depth needs it"
)


def step(python: str, argv: list[str], timeout_s: float, shown: str) -> tuple[dict | None, str | None, dict]:
    """One step in an engine process of its own, killed with its process group at `timeout_s`; `shown`, the step in
    words (`gpufleet bench soak`). Its output goes to files, never a pipe a worker it left behind could hold open."""
    cmd = [python, "-m", "gpufleet", *argv]
    env = dict(os.environ, GPUFLEET_PARENT_PID=str(os.getpid()), LC_ALL="C", LANG="C", PYTHONIOENCODING="utf-8")
    timed_out = False
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out_f,
                stderr=err_f,
                env=env,
                start_new_session=True,
                preexec_fn=guard.die_with_parent,
            )
        except OSError as exc:
            return None, f"{python} could not start `{shown}`: {exc.strerror}", {"cmd": shown}
        guard.track(proc)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            launch.kill_group(proc)
            timed_out = True
        finally:
            guard.untrack(proc)
            try:  # what it started in its own group must not outlive it
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        out, err = (_text(f) for f in (out_f, err_f))
    rc = proc.returncode
    left = {"rc": rc, "cmd": shown, "stderr": _tail(err), "stdout": _tail(out), "timeout_s": timeout_s}
    if timed_out:
        return None, f"`{shown}` passed its timeout of {timeout_s:g} s and was killed; stderr tail: {_last(err)}", left
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        return None, f"`{shown}` was killed by {name} (exit {rc}); stderr tail: {_last(err)}", left
    if "No module named gpufleet" in err or "No module named 'gpufleet'" in err:
        return None, f"{python} has no gpufleet engine (No module named gpufleet)", left
    if rc == 2:
        return None, err.strip().splitlines()[-1] if err.strip() else f"`{shown}` refused its input (exit 2)", left
    try:
        doc = json.loads(out) if rc in (0, 1) else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        return doc, None, left
    why = "printed no document with a results list" if rc in (0, 1) else f"exited {rc}"
    return None, f"`{shown}` {why}; stderr tail: {_last(err)}", left


def _text(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def _tail(text: str) -> str:
    text = (text or "").strip()
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _last(text: str) -> str:
    return _tail(text)[-600:] or "(empty)"


def run(
    python: str, what: list[str], more: list[str], timeout_s: float, checks: list[str], group: str, remedy: str
) -> tuple[dict | None, list]:
    """A step (`gpufleet WHAT MORE...`): (its document, its results); a step that gave none, (None, an `error` of
    each of `checks`, environment when the node's disk is full)."""
    started, t0 = schema.utc_now(), time.monotonic()
    doc, why, left = step(python, [*what, *more], timeout_s, " ".join(["gpufleet", *what]))
    if doc is not None:
        return doc, doc["results"]
    full = "No space left on device" in why + (left.get("stderr") or "")
    return None, [
        schema.result(
            check,
            schema.ERROR,
            why,
            group=group,
            remedy=remedy,
            detail=dict(left, benchmark=check) if group == registry.BENCHMARK_GROUP else left,
            failure_class=registry.ENVIRONMENT if full else None,
            started=started,
            seconds=round(time.monotonic() - t0, 2),
        )
        for check in checks
    ]


def engine_runs(names: list[str]) -> list[list[str]]:
    """The benchmarks of each engine process: one each, but sdc in matmul's when both run (the engine then computes
    it in the matmul workers, sparing a second start of torch and CUDA on every GPU: benchmarks.matmul.matmul_measure.run_matmul)."""
    if "matmul" in names and "sdc" in names:
        return [["matmul", "sdc"] if name == "matmul" else [name] for name in names if name != "sdc"]
    return [[name] for name in names]


def benchmarks(
    python: str, names: list[str], each_timeout_s: float, more: list[str], soak_duration_s: float | None = None
) -> tuple[list, list]:
    """Each engine run of the benchmarks a step of its own (`gpufleet bench RUN MORE...`), with each of its
    benchmarks' timeout, the soak its duration beyond it, and torchrun stopped a little before (launch.limit_within):
    (their documents, their results)."""
    docs, results = [], []
    for names_run in engine_runs(names):
        timeout_s = each_timeout_s * len(names_run) + ((soak_duration_s or 0) if "soak" in names_run else 0)
        limit = ["--timeout-s", str(launch.limit_within(timeout_s))] if "--timeout-s" not in more else []
        doc, res = run(
            python,
            ["bench", *names_run],
            [*more, *limit],
            timeout_s,
            names_run,
            registry.BENCHMARK_GROUP,
            REMEDY_TIMEOUT,
        )
        docs += [doc] if doc else []
        results += res
    return docs, results


def document(host: str, docs: list, results: list, started: str, t0: float) -> dict:
    """The host document of several steps' results: engine, profile, versions and the machine from the first step's
    document."""
    first = docs[0] if docs else {}
    return {
        "schema_version": first.get("schema_version", schema.SCHEMA_VERSION),
        "host": host,
        "engine_version": first.get("engine_version", __version__),
        "profile": first.get("profile"),
        "versions": first.get("versions") or {},
        "machine": first.get("machine") or {},
        "started": started,
        "seconds": round(time.monotonic() - t0, 4),
        "results": list(results),
    }
