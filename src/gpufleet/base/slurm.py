"""Slurm through its own command line: nodes read back (`scontrol show node -o`), drained with a reason, resumed;
the configuration and partitions read (`scontrol show config`, `show partition -o`); batch jobs submitted
(`sbatch`), listed (`squeue`) and read back (`scontrol show job -o`, else `sacct` once slurmctld forgot them).

Every reason gpufleet writes starts with PREFIX ("gpufleet:"): a later run resumes only nodes whose reason starts
so, and never one an administrator drained or Slurm itself set down for a reason of its own. Reasons are kept to
REASON_MAX_CHARS: slurmctld stores a node's reason as given, but `sinfo -R` shows the first 20 characters by
default and `scontrol show node` prints it on one line; 128 keeps the whole reason readable everywhere (and the
run, class and first failing check come first, so a cut one still says what matters).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from gpufleet.base.errors import InputError

PREFIX = "gpufleet:"
# Drained by gpufleet until a person or an acceptance run clears it, never resumed by a run's verdict alone: a node
# handed over for repair at the top of the remediation ladder, and one sent back through `gpufleet fleet accept`
# (a GPU replaced, an RMA closed), which the replacement flow takes over and resumes once accepted.
RMA_PREFIX = f"{PREFIX} RMA"
REACCEPT_PREFIX = f"{PREFIX} REACCEPT"
REASON_MAX_CHARS = 128
# Characters kept in a reason: no '=' (scontrol's key=value output), nothing a shell expands inside quotes.
_REASON_CHARS = re.compile(r"[^A-Za-z0-9._:,;+ /()-]")
_STAMP = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]$")  # what Slurm appends to a reason: [root@2026-11-27T12:52:32]
_FIELD = re.compile(r" (?=[A-Za-z_][A-Za-z0-9_:/]*=)")  # keys such as AllocNode:Sid, CPUs/Task
# Where scontrol is when the caller's PATH lacks it (slurmd runs a HealthCheckProgram with a bare environment).
_SEARCH_PATH = "/usr/bin:/usr/local/bin:/opt/slurm/bin:/usr/sbin"
TIMEOUT_S = 60


def reason(text: str) -> str:
    """`gpufleet: <text>`, an arrow written `to`, characters outside a plain set replaced by '_', cut to
    REASON_MAX_CHARS."""
    full = _REASON_CHARS.sub("_", f"{PREFIX} {text}".replace(" -> ", " to ").replace("->", " to "))
    return full if len(full) <= REASON_MAX_CHARS else full[: REASON_MAX_CHARS - 3] + "..."


def bare_reason(node_reason: str | None) -> str | None:
    """The reason as it was given: without the ' [user@time]' Slurm appends."""
    return _STAMP.sub("", node_reason) if node_reason else node_reason


def is_own(node_reason: str | None) -> bool:
    """Whether gpufleet wrote this reason (Slurm may append ' [user@time]')."""
    return bool(node_reason) and node_reason.startswith(PREFIX)


def is_rma(node_reason: str | None) -> bool:
    return bool(node_reason) and node_reason.startswith(RMA_PREFIX)


def is_held(node_reason: str | None) -> bool:
    """Drained for repair or for re-acceptance: left so until a person or the replacement flow clears it."""
    return bool(node_reason) and node_reason.startswith((RMA_PREFIX, REACCEPT_PREFIX))


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
    """The output of Slurm's command `name`; InputError naming the command and its message when it fails."""
    cmd = [tool_path(name), *args]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, input=stdin, env=dict(os.environ, LC_ALL="C")
        )
    except subprocess.TimeoutExpired:
        raise InputError(f"`{' '.join(cmd)}` did not answer within {TIMEOUT_S} s: is slurmctld reachable?") from None
    if done.returncode != 0:
        raise InputError(
            f"`{' '.join(cmd)}` failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return done.stdout


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
    "comment"}]; node is where it runs, else the node it asked for; reservation None when it runs in none."""
    out = run_tool("squeue", "-h", "-a", "--name", job_name, "-o", "%i|%T|%N|%n|%v|%k")
    jobs = []
    for line in out.splitlines():
        if line.count("|") >= 5:
            job_id, state, node, asked, resv, comment = line.split("|", 5)
            jobs.append(
                {
                    "job_id": job_id,
                    "state": state,
                    "node": node or asked,
                    "reservation": None if resv in ("", "(null)") else resv,
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
    still holds the job (MinJobAge), else sacct where accounting runs; None when neither knows it."""
    try:
        shown = fields(scontrol("show", "job", "-o", job_id))
    except InputError:
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
    except InputError:
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
