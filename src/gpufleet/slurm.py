"""Slurm through its own command line: nodes read back (`scontrol show node -o`), drained with a reason, resumed.

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

from gpufleet.errors import InputError

PREFIX = "gpufleet:"
REASON_MAX_CHARS = 128
# Characters kept in a reason: no '=' (scontrol's key=value output), nothing a shell expands inside quotes.
_REASON_CHARS = re.compile(r"[^A-Za-z0-9._:,;+ /()-]")
_FIELD = re.compile(r" (?=[A-Za-z_]+=)")
# Where scontrol is when the caller's PATH lacks it (slurmd runs a HealthCheckProgram with a bare environment).
_SEARCH_PATH = "/usr/bin:/usr/local/bin:/opt/slurm/bin:/usr/sbin"
TIMEOUT_S = 60


def reason(text: str) -> str:
    """`gpufleet: <text>`, characters outside a plain set replaced by '_', cut to REASON_MAX_CHARS."""
    full = _REASON_CHARS.sub("_", f"{PREFIX} {text}")
    return full if len(full) <= REASON_MAX_CHARS else full[:REASON_MAX_CHARS - 3] + "..."


def is_own(node_reason: str | None) -> bool:
    """Whether gpufleet wrote this reason (Slurm may append ' [user@time]')."""
    return bool(node_reason) and node_reason.startswith(PREFIX)


def names_arg(pairs: list[str] | None) -> dict | None:
    """--slurm-name HOST=NAME (repeatable) as {host: name}; None when none is given."""
    bad = [pair for pair in pairs or [] if "=" not in pair]
    if bad:
        raise InputError(f"--slurm-name {bad[0]!r}: expected HOST=SLURM_NAME")
    return dict(pair.split("=", 1) for pair in pairs or []) or None


def scontrol_path() -> str:
    found = shutil.which("scontrol") or shutil.which("scontrol", path=_SEARCH_PATH)
    if not found:
        raise InputError("scontrol not found on PATH or in /usr/bin, /usr/local/bin, /opt/slurm/bin: install Slurm's client "
                         "commands (Debian: apt-get install slurm-client) or put scontrol on PATH")
    return found


def scontrol(*args: str) -> str:
    """scontrol's output; InputError naming the command and its message when it fails."""
    cmd = [scontrol_path(), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(os.environ, LC_ALL="C"))
    except subprocess.TimeoutExpired:
        raise InputError(f"`{' '.join(cmd)}` did not answer within {TIMEOUT_S} s: is slurmctld reachable?") from None
    if done.returncode != 0:
        raise InputError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


def parse_nodes(text: str) -> dict[str, dict]:
    """`scontrol show node -o` -> {name: {"state", "base", "flags", "reason", "partitions"}}; `base` is the state
    without flags and suffixes (IDLE, ALLOCATED, MIXED, DOWN, ...), `flags` the rest (DRAIN, NOT_RESPONDING, ...)."""
    nodes = {}
    for line in text.splitlines():
        fields = {k: v.strip() for k, v in (f.split("=", 1) for f in _FIELD.split(line.strip()) if "=" in f)}
        name = fields.get("NodeName")
        if not name:
            continue
        state = fields.get("State", "")
        base, *flags = state.split("+")
        if base and base[-1] in "*~#!%$@^-":  # * not responding, ~ powered off, ...: a flag, not a state
            flags.append({"*": "NOT_RESPONDING"}.get(base[-1], base[-1]))
            base = base.rstrip("*~#!%$@^-")
        nodes[name] = {"state": state, "base": base, "flags": flags,
                       "reason": None if fields.get("Reason") in (None, "", "(null)") else fields["Reason"],
                       "partitions": [p for p in fields.get("Partitions", "").split(",") if p]}
    return nodes


def show_nodes() -> dict[str, dict]:
    """Every node Slurm knows, read back now."""
    return parse_nodes(scontrol("show", "node", "-o"))


def out_of_service(node: dict) -> bool:
    """Drained, draining or down: taken out of service by someone (gpufleet, an administrator, Slurm)."""
    return "DRAIN" in node["flags"] or node["base"] in ("DOWN", "FAIL") or "FAIL" in node["flags"]


def drain(name: str, why: str) -> None:
    """Drain NAME with `why` as the reason (already made with reason())."""
    scontrol("update", f"nodename={name}", "state=drain", f"reason={why}")


def resume(name: str) -> None:
    scontrol("update", f"nodename={name}", "state=resume")
