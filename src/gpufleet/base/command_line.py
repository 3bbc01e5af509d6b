"""What every gpufleet command line shares: the parser that ends each --help with the exit codes, --exit-zero and
the exit status of a host document's results, a JSON object argument, and the host document printed."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

from gpufleet.base import schema
from gpufleet.base.errors import EXIT_CODES, InputError


class Parser(argparse.ArgumentParser):
    """Every gpufleet parser, subcommands included (add_subparsers makes them of the parent's class), ends its
    --help with the same table of exit codes, and a subcommand refuses what it does not know itself, so the refusal
    names it (`gpufleet history: error: unrecognized arguments: ...`), not the top parser. `refused`: argparse's last
    refusal of a command line, which --json also says as a JSON line (cli.main)."""

    refused: str | None = None

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.subcommand = " " in self.prog  # "gpufleet history": a subcommand's parser

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.subcommand and not self._subparsers:  # the leaf's own: said with its name
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message):
        Parser.refused = f"{self.prog}: error: {message}"
        super().error(message)


def ending_json(code: int, message: str | None, status: str = "refused") -> str:
    """The JSON line a --json command ends with when it prints none of its own: refused (exit 2: argparse's refusal,
    or bad input or what could not run, InputError), interrupted (130), or done without a document. The fields
    of `gpufleet fleet --json`'s line, so a wrapper reads every ending alike."""
    return json.dumps(
        {
            "exit": code,
            "status": status,
            "rc": None,
            "interrupted": code == 130,
            "nodes": {},
            "message": message,
            "why": {},
        },
        sort_keys=True,
    )


class Written:
    """A command's stdout, which says whether anything was written to it: --json prints the ending line only where
    the command printed nothing of its own (cli.main)."""

    def __init__(self, stream):
        self.stream, self.written = stream, False

    def write(self, text):
        self.written = self.written or bool(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _QuietPipe(io.RawIOBase):
    """stdout's file descriptor as a raw stream whose writes, once the reader is gone (EPIPE: piped into `head` or
    `true`), are dropped instead of raising BrokenPipeError: the command goes on to its end and exits with its own
    code, what it would have printed unread."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd, self.gone = fd, False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data) -> int:
        if not self.gone:
            try:
                return os.write(self.fd, data)
            except BrokenPipeError:
                self.gone = True
        return len(data)


@contextlib.contextmanager
def quiet_closed_stdout():
    """sys.stdout, for the command's life, one whose reader may go away quietly (_QuietPipe); left as it is where it
    is no file descriptor (a test's capture)."""
    before = sys.stdout
    try:
        fd = before.fileno()
        before.flush()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_QuietPipe(fd)),
        encoding=before.encoding,
        errors=before.errors,
        line_buffering=before.line_buffering,
        write_through=True,
    )
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = before


def results_exit(results: list[dict], exit_zero: bool = False) -> int:
    """1 when a result failed or erred (the node would not be accepted), else 0; always 0 with --exit-zero."""
    return 1 if not exit_zero and schema.verdict(results) == schema.FAIL else 0


def add_exit_zero(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 when the command ran, whatever its results (default: 1 when a result failed or erred)",
    )


def add_document_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of every command that prints a host document: whose, by which profile, and how."""
    p.add_argument("--host", help="host name to record (default: this host's name)")
    p.add_argument("--profile", help="force a profile by name instead of matching the GPU name")
    p.add_argument("--profile-dir", help="directory of profile YAML files")
    p.add_argument("--thresholds", help="JSON object of threshold overrides (gpufleet_thresholds)")
    p.add_argument("--json", action="store_true", help="print the host document as JSON")
    add_exit_zero(p)


def json_arg(text: str | None, what: str) -> dict:
    if not text:
        return {}
    try:
        val = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not valid JSON ({exc.msg} at char {exc.pos}); expected a JSON object") from None
    if val is None:
        return {}
    if not isinstance(val, dict):
        raise InputError(f"{what} must be a JSON object, got {type(val).__name__}")
    return val


def print_doc(doc: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc, sort_keys=True))
        return
    for r in doc["results"]:
        print(f"{r['status']:5}  {r['check']:24} {r['reason']}")
    print(f"verdict: {schema.verdict(doc['results'])}")
