"""The site's commands of the ladder's steps: templates such as `ssh {host} nvidia-smi -r -i {gpu_index}` or
`scontrol reboot {slurm_node}`, split like a shell line and filled in word by word (no shell: a node name cannot
run anything), run with a timeout in a process group of their own, their exit code and output tail recorded.

Placeholders: {host} (inventory name), {slurm_node}, {gpu_index}, {gpu_uuid}, {gpu_serial}, {run_id}, {reason}.
"""

from __future__ import annotations

import os
import shlex
import signal
import string
import subprocess

from gpufleet.errors import InputError

PLACEHOLDERS = ("host", "slurm_node", "gpu_index", "gpu_uuid", "gpu_serial", "run_id", "reason")
TIMEOUT_S = 600
OUTPUT_TAIL_CHARS = 2000


def parse(pairs: list[str] | None, known: tuple[str, ...], what: str = "--command") -> dict[str, str]:
    """STEP=TEMPLATE pairs as {step: template}, each template's placeholders checked."""
    out = {}
    for pair in pairs or []:
        step, sep, template = pair.partition("=")
        if not sep or step not in known or not template.strip():
            raise InputError(f"{what} {pair!r}: expected STEP=COMMAND with STEP one of {', '.join(known)}")
        words(template, {}, check_only=True, what=f"{what} {step}")
        out[step] = template
    return out


def words(template: str, values: dict, *, check_only: bool = False, what: str = "the command") -> list[str]:
    """The template as argv, each word's placeholders filled from `values`."""
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise InputError(f"{what} {template!r} does not split like a shell line: {exc}") from None
    for word in argv:
        unknown = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None and f not in PLACEHOLDERS]
        if unknown:
            raise InputError(
                f"{what} {template!r}: unknown placeholder {{{unknown[0]}}}; expected some of "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            )
    if check_only:
        return argv
    filled = {p: "" if values.get(p) is None else str(values[p]) for p in PLACEHOLDERS}
    return [word.format_map(filled) for word in argv]


def run(argv: list[str], timeout_s: float = TIMEOUT_S) -> dict:
    """{"argv", "rc", "output"}: rc None when it could not start or ran past its timeout (then killed)."""
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=dict(os.environ, LC_ALL="C"),
        )
    except OSError as exc:
        return {"argv": argv, "rc": None, "output": f"could not start {argv[0]}: {exc.strerror or exc}"}
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"argv": argv, "rc": None, "output": f"killed after {timeout_s:g} s: {(out or '')[-OUTPUT_TAIL_CHARS:]}"}
    return {"argv": argv, "rc": proc.returncode, "output": (out or "")[-OUTPUT_TAIL_CHARS:]}


def run_capture(argv: list[str], timeout_s: float = TIMEOUT_S) -> dict:
    """{"argv", "rc", "raw" (its whole standard output, bytes), "output" (the tail of its error output)}."""
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(os.environ, LC_ALL="C"),
        )
    except OSError as exc:
        return {"argv": argv, "rc": None, "raw": b"", "output": f"could not start {argv[0]}: {exc.strerror or exc}"}
    try:
        raw, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"argv": argv, "rc": None, "raw": b"", "output": f"killed after {timeout_s:g} s"}
    return {
        "argv": argv,
        "rc": proc.returncode,
        "raw": raw,
        "output": err.decode(errors="replace")[-OUTPUT_TAIL_CHARS:],
    }
