"""The site's commands of the ladder's steps: templates such as `ssh {host} nvidia-smi -r -i {gpu_index}` or
`scontrol reboot {slurm_node}`, split like a shell line and filled in word by word, run with a timeout in a process
group of their own, their exit code and output tail recorded.

A value from a document cannot run anything:

    no local shell   the template's words are the argv; a value fills a word, never splits or joins words
    shapes           every value is checked against its shape before anything runs (SHAPES: an index is a whole
                     number, a UUID GPU-<hex>, a serial letters and digits, a node name a host name); a value
                     of another shape stops the command, named with where it came from
    the remote shell ssh joins the words after the destination into one line for the node's shell: each of
                     them is quoted (shlex.quote), so each stays one word there, as it was here

Placeholders: {host} (inventory name), {slurm_node}, {gpu_index}, {gpu_uuid}, {gpu_serial}, {run_id}, {reason}.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import string
import subprocess
from pathlib import PurePath

from gpufleet.base.errors import InputError

PLACEHOLDERS = ("host", "slurm_node", "gpu_index", "gpu_uuid", "gpu_serial", "run_id", "reason")
_NODE = (r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "a host name (letters, digits, '.', '_', '-'; not starting with '-')")
# Each value's shape, and the words that say it. The reason is gpufleet's own (slurm.reason's characters).
SHAPES = {
    "host": _NODE,
    "slurm_node": _NODE,
    "gpu_index": (r"\d{1,4}", "a GPU index, a whole number 0 or more"),
    "gpu_uuid": (r"(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{7,63}", "a GPU UUID (GPU-<hex digits and '-'>)"),
    "gpu_serial": (r"[A-Za-z0-9]{1,64}", "a board serial (letters and digits)"),
    "run_id": (r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", "a run id (letters, digits, '.', '_', '-')"),
    "reason": (r"[A-Za-z0-9._:,;+ /()-]{1,128}", "a gpufleet drain reason"),
}
# ssh's options that take a value (`man ssh`): the first word after them that is no option is the destination.
_SSH_VALUED = set("BbcDEeFIiJLlmOoPpQRSWw")
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
    filled = {p: checked(p, values.get(p), what) for p in PLACEHOLDERS}
    return remote_quoted([word.format_map(filled) for word in argv])


def checked(name: str, value, what: str) -> str:
    """The value as it fills a word: "" for none, else itself when it has its shape; InputError otherwise."""
    if value is None:
        return ""
    text = str(value) if not isinstance(value, bool) else "?"
    pattern, words = SHAPES[name]
    if not re.fullmatch(pattern, text):
        raise InputError(f"{what}: {{{name}}} would be {text!r}; expected {words}. Nothing was run")
    return text


def remote_quoted(argv: list[str]) -> list[str]:
    """argv with every word ssh hands to the node's shell quoted for that shell (shlex.quote); the words before
    the destination, and a command that is no ssh, as they are."""
    at = next((i for i, w in enumerate(argv) if PurePath(w).name == "ssh"), None)
    if at is None:
        return argv
    i = at + 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        if argv[i] == "--":
            i += 1
            break
        flags = argv[i][1:]
        valued = next((k for k, c in enumerate(flags) if c in _SSH_VALUED), None)
        i += 2 if valued is not None and valued == len(flags) - 1 else 1  # -i KEY; -iKEY holds its value
    return argv[: i + 1] + [shlex.quote(w) for w in argv[i + 1 :]]


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
