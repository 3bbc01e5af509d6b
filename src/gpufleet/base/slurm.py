"""Slurm through its own command line: nodes read back (`scontrol show node -o`), drained with a reason, resumed;
the configuration and partitions read (`scontrol show config`, `show partition -o`); batch jobs submitted
(`sbatch`), listed (`squeue`) and read back (`scontrol show job -o`, else `sacct` once slurmctld forgot them).

Every reason gpufleet writes starts with PREFIX ("gpufleet "), then what `sinfo -R` must show in its default
column of 20 characters: the class and the check (`gpufleet hw xid +2 more; run 20261124T081500Z`), the run id
last. A later run resumes only nodes whose reason starts so (or with "gpufleet:", the form before this one), never
one an administrator drained or Slurm itself set down for a reason of its own. Reasons are kept to
REASON_MAX_CHARS: slurmctld stores a node's reason as given, but `scontrol show node` prints it on one line; a cut
one keeps its run id and ends its text in `...`.

A command that could not reach slurmctld (it is down or restarting, munge is down, the network is cut) raises
Unreachable, an InputError of its own: what the scheduler could not do is never the node's fault, and the caller
may wait for the controller and try again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from gpufleet.base import failure_class
from gpufleet.base.errors import InputError

PREFIX = "gpufleet"
_OWN = ("gpufleet ", "gpufleet:")  # this form, and the one before it ("gpufleet: <run> <class>: <check>")
# Drained by gpufleet until a person or an acceptance run clears it, never resumed by a run's verdict alone: a node
# handed over for repair at the top of the remediation ladder, and one sent back through `gpufleet fleet accept`
# (a GPU replaced, an RMA closed), which the replacement flow takes over and resumes once accepted.
RMA = "RMA"
REACCEPT = "REACCEPT"
REASON_MAX_CHARS = 128
# The class in a reason, short enough that `sinfo -R` shows the check after it (failure_class.CLASSES).
CLASS_WORDS = {
    failure_class.HARDWARE: "hw",
    failure_class.SOFTWARE: "sw",
    failure_class.ENVIRONMENT: "env",
    failure_class.CONFIGURATION: "cfg",
}
# Characters kept in a reason: no '=' (scontrol's key=value output), nothing a shell expands inside quotes.
_REASON_CHARS = re.compile(r"[^A-Za-z0-9._:,;+ /()-]")
_STAMP = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]$")  # what Slurm appends to a reason: [root@2026-11-27T12:52:32]
_RUN = re.compile(r"; run [A-Za-z0-9._:-]+$")  # the run id a reason ends with
_FIELD = re.compile(r" (?=[A-Za-z_][A-Za-z0-9_:/]*=)")  # keys such as AllocNode:Sid, CPUs/Task
# Where scontrol is when the caller's PATH lacks it (slurmd runs a HealthCheckProgram with a bare environment).
_SEARCH_PATH = "/usr/bin:/usr/local/bin:/opt/slurm/bin:/usr/sbin"
TIMEOUT_S = 60
# The first line of a sweep job's node stage on stderr (node/stage.py; the job's output file): a job that ended
# without it ended before its node was measured at all (service/sweep_end.py).
STAGE_STARTED = "gpufleet node-stage: started"
# What Slurm's commands say when slurmctld cannot be reached (22.05: slurm_errno messages; munge's when munged is
# down): the scheduler's trouble, not the command's input.
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were transmitted or received"
    r"|Communication connection failure|Connection refused|Protocol authentication error|Munge encode failed"
    r"|Munge decode failed|Slurm backup controller in standby mode|Slurm controller not responding"
    r"|Unable to establish connection|Transport endpoint is not connected",
    re.I,
)


class Unreachable(InputError):
    """slurmctld did not answer a command (down, restarting, munge down, the network cut): try again later."""


def reason(text: str, run_id: str | None = None, *, by: str | None = None) -> str:
    """`gpufleet <text>; run <run_id>` (or `; <by>`: who drained it, where no run did), an arrow written `to`,
    characters outside a plain set replaced by '_', cut to REASON_MAX_CHARS in the text (ending `...`), never in
    its end. `text` starts with what `sinfo -R` shows by default (20 characters): the class and check (`hw xid`), or
    RMA, REACCEPT."""
    clean = lambda words: _REASON_CHARS.sub("_", words.replace(" -> ", " to ").replace("->", " to "))  # noqa: E731
    end = f"; run {run_id}" if run_id else f"; {by}" if by else ""
    head, tail = clean(f"{PREFIX} {text}"), clean(end)
    room = REASON_MAX_CHARS - len(tail)
    return (head if len(head) <= room else head[: room - 3] + "...") + tail


def class_word(cls: str | None) -> str:
    """A failure class as a reason names it (hw, sw, env, cfg); `failed` when none is known."""
    return CLASS_WORDS.get(cls or "", "failed")


def bare_reason(node_reason: str | None) -> str | None:
    """The reason as it was given: without the ' [user@time]' Slurm appends."""
    return _STAMP.sub("", node_reason) if node_reason else node_reason


def cause_of(node_reason: str | None) -> str | None:
    """The reason without Slurm's stamp and without the run id it ends with: two drains for the same cause by two
    runs say the same."""
    return _RUN.sub("", bare_reason(node_reason)) if node_reason else node_reason


def is_own(node_reason: str | None) -> bool:
    """Whether gpufleet wrote this reason (Slurm may append ' [user@time]')."""
    return bool(node_reason) and node_reason.startswith(_OWN)


def _is(node_reason: str | None, *words: str) -> bool:
    return bool(node_reason) and node_reason.startswith(
        tuple(f"{own}{' ' * own.endswith(':')}{w} " for own in _OWN for w in words)
    )


def is_rma(node_reason: str | None) -> bool:
    return _is(node_reason, RMA)


def is_held(node_reason: str | None) -> bool:
    """Drained for repair or for re-acceptance: left so until a person or the replacement flow clears it."""
    return _is(node_reason, RMA, REACCEPT)


def names_arg(pairs: list[str] | None) -> dict | None:
    """--slurm-name HOST=NAME (repeatable) as {host: name}; None when none is given."""
    bad = [pair for pair in pairs or [] if "=" not in pair]
    if bad:
        raise InputError(f"--slurm-name {bad[0]!r}: expected HOST=SLURM_NAME")
    return dict(pair.split("=", 1) for pair in pairs or []) or None


def tool_path(name: str = "scontrol") -> str:
    path = shutil.which(name) or shutil.which(name, path=_SEARCH_PATH)
    if not path:
        raise InputError(
            f"{name} not found on PATH or in /usr/bin, /usr/local/bin, /opt/slurm/bin: install Slurm's client "
            "commands (Debian: apt-get install slurm-client) or put them on PATH"
        )
    return path


def run_tool(name: str, *args: str, stdin: str | None = None) -> str:
    """The output of Slurm's command `name`; InputError naming the command and its message when it fails,
    Unreachable when slurmctld did not answer."""
    cmd = [tool_path(name), *args]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, input=stdin, env=dict(os.environ, LC_ALL="C")
        )
    except subprocess.TimeoutExpired:
        raise Unreachable(f"`{' '.join(cmd)}` did not answer within {TIMEOUT_S} s: is slurmctld reachable?") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        error = Unreachable if _UNREACHABLE.search(said) else InputError
        raise error(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {said}")
    return done.stdout


# What slurmstepd writes into a job's output when Slurm ends it (22.05): `*** JOB 5 ON sn1 CANCELLED AT <time> DUE
# TO TIME LIMIT ***`; without a cause, a scancel.
_ENDED = re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))?(?:,[^*]*)? \*\*\*")
_ENDED_STATES = {None: "CANCELLED", "TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED"}


def ended_as(text: str | None) -> str | None:
    """The job state Slurm's own line in a job's output says it ended in (TIMEOUT, NODE_FAIL, PREEMPTED, CANCELLED),
    or None: what the job wrote still tells it once slurmctld forgot the job."""
    found = _ENDED.findall(text or "")
    return _ENDED_STATES.get(found[-1] or None, "CANCELLED") if found else None


def unreachable_in(text: str | None) -> str | None:
    """The first line of `text` (a job's output) in which a Slurm command says it could not reach slurmctld."""
    return next((line.strip() for line in (text or "").splitlines() if _UNREACHABLE.search(line)), None)


def scontrol(*args: str) -> str:
    return run_tool("scontrol", *args)


def fields(line: str) -> dict[str, str]:
    """One line of `scontrol show ... -o` as {key: value}; a value with spaces (Reason, Comment) runs to the next key."""
    return {k: v.strip() for k, v in (f.split("=", 1) for f in _FIELD.split(line.strip()) if "=" in f)}


def parse_nodes(text: str) -> dict[str, dict]:
    """`scontrol show node -o` -> {name: {"state", "base", "flags", "reason", "partitions"}}; `base` is the state
    without flags and suffixes (IDLE, ALLOCATED, MIXED, DOWN, ...), `flags` the rest (DRAIN, NOT_RESPONDING, ...)."""
    nodes = {}
    for line in text.splitlines():
        shown = fields(line)
        name = shown.get("NodeName")
        if not name:
            continue
        state = shown.get("State", "")
        base, *flags = state.split("+")
        if base and base[-1] in "*~#!%$@^-":  # * not responding, ~ powered off, ...: a flag, not a state
            flags.append({"*": "NOT_RESPONDING"}.get(base[-1], base[-1]))
            base = base.rstrip("*~#!%$@^-")
        gpus = re.search(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", shown.get("Gres", ""))
        nodes[name] = {
            "state": state,
            "base": base,
            "flags": flags,
            "reason": None if shown.get("Reason") in (None, "", "(null)") else shown["Reason"],
            "partitions": [p for p in shown.get("Partitions", "").split(",") if p],
            "gpus": int(gpus.group(1)) if gpus else None,
        }
    return nodes


def show_nodes() -> dict[str, dict]:
    """Every node Slurm knows, read back now."""
    return parse_nodes(scontrol("show", "node", "-o"))


def out_of_service(node: dict) -> bool:
    """Drained, draining or down: taken out of service by someone (gpufleet, an administrator, Slurm)."""
    return "DRAIN" in node["flags"] or node["base"] in ("DOWN", "FAIL") or "FAIL" in node["flags"]


def in_service(node: dict) -> bool:
    """Slurm gives the node to jobs: not out of service, responding, and in no maintenance reservation (where a
    re-test runs, service/retest.py)."""
    return not out_of_service(node) and not {"NOT_RESPONDING", "MAINTENANCE"} & set(node["flags"])


def drain(name: str, why: str) -> None:
    """Drain NAME with `why` as the reason (already made with reason())."""
    scontrol("update", f"nodename={name}", "state=drain", f"reason={why}")


def resume(name: str) -> None:
    scontrol("update", f"nodename={name}", "state=resume")


def config() -> dict[str, str]:
    """`scontrol show config` as {key: value}."""
    out = {}
    for line in scontrol("show", "config").splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def partitions() -> dict[str, dict]:
    """{name: {"priority_tier": int, "preempt_mode": str, "state": str}} from `scontrol show partition -o`."""
    out = {}
    for line in scontrol("show", "partition", "-o").splitlines():
        shown = fields(line)
        if shown.get("PartitionName"):
            tier = shown.get("PriorityTier", "1")
            out[shown["PartitionName"]] = {
                "priority_tier": int(tier) if tier.isdigit() else 1,
                "preempt_mode": shown.get("PreemptMode", ""),
                "state": shown.get("State", ""),
            }
    return out


def submit(options: list[str], script: str) -> str:
    """`sbatch --parsable OPTIONS` with the batch script on stdin; the job id."""
    return run_tool("sbatch", "--parsable", *options, stdin=script).strip().split(";")[0]


def queued(job_name: str) -> list[dict]:
    """The jobs of that name slurmctld holds now, pending or running: [{"job_id", "state", "node", "reservation",
    "start", "elapsed_s", "slurm_reason", "comment"}]; node is where it runs, else the node it asked for; reservation
    None when it runs in none; start and elapsed_s once it started."""
    out = run_tool("squeue", "-h", "-a", "--name", job_name, "-o", "%i|%T|%N|%n|%v|%S|%M|%r|%k")
    jobs = []
    for line in out.splitlines():
        if line.count("|") >= 8:
            job_id, state, node, asked, resv, start, used, why, comment = line.split("|", 8)
            jobs.append(
                {
                    "job_id": job_id,
                    "state": state,
                    "node": node or asked,
                    "reservation": None if resv in ("", "(null)") else resv,
                    "start": _time(start),
                    "elapsed_s": duration_s(used),
                    "slurm_reason": None if why in ("", "None", "(null)") else why,
                    "comment": comment,
                }
            )
    return jobs


def reserve(name: str, node: str, user: str) -> None:
    """A maintenance reservation NAME of NODE for USER alone, from now on and without end: only that user's jobs
    that ask for it (sbatch --reservation=NAME) may run there."""
    scontrol(
        "create",
        "reservation",
        f"reservationname={name}",
        f"nodes={node}",
        f"users={user}",
        "starttime=now",
        "duration=infinite",
        "flags=maint",
    )


def unreserve(name: str) -> None:
    scontrol("delete", f"reservationname={name}")


def reservations() -> dict[str, dict]:
    """{name: {"nodes": str, "users": str, "flags": [str]}} from `scontrol show reservation -o`."""
    out = {}
    for line in scontrol("show", "reservation", "-o").splitlines():
        shown = fields(line)
        if shown.get("ReservationName"):
            out[shown["ReservationName"]] = {
                "nodes": shown.get("Nodes", ""),
                "users": shown.get("Users", ""),
                "flags": [f for f in shown.get("Flags", "").split(",") if f],
            }
    return out


def job(job_id: str) -> dict | None:
    """What Slurm says of one job: {"state", "start", "end", "elapsed_s", "slurm_reason"}; slurmctld while it
    still holds the job (MinJobAge), else sacct where accounting runs; None when neither knows it. Unreachable when
    slurmctld did not answer: then nothing can be told of the job."""
    try:
        shown = fields(scontrol("show", "job", "-o", job_id))
    except Unreachable:
        raise
    except InputError:  # Invalid job id specified: slurmctld no longer holds it
        shown = {}
    if shown.get("JobState"):
        return {
            "state": shown["JobState"],
            "start": _time(shown.get("StartTime")),
            "end": _time(shown.get("EndTime")),
            "elapsed_s": duration_s(shown.get("RunTime")),
            "slurm_reason": None if shown.get("Reason") in (None, "None", "(null)") else shown["Reason"],
        }
    try:
        line = run_tool("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,Start,End,ElapsedRaw").splitlines()
    except InputError:  # no accounting here, or slurmdbd down: nothing more to learn
        return None
    if not line:
        return None
    state, start, end, elapsed = (line[0].split("|") + [""] * 4)[:4]
    return {
        "state": state.split()[0],
        "start": _time(start),
        "end": _time(end),
        "elapsed_s": float(elapsed) if elapsed.isdigit() else None,
        "slurm_reason": None,
    }


def cancel(job_id: str) -> None:
    run_tool("scancel", job_id)


def _time(text: str | None) -> str | None:
    """Slurm's local time (2026-11-26T13:08:50) as gpufleet's UTC time; None for Unknown or None."""
    if not text or not text[:1].isdigit():
        return None
    try:
        local = time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(local))


def duration_s(text: str | None) -> float | None:
    """[D-]HH:MM:SS (or MM:SS) as seconds."""
    parts = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text or "")
    if not parts:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in parts.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
