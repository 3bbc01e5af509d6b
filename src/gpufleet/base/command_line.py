"""What every gpufleet command line shares: the parser that ends each --help with the exit codes, --exit-zero and
the exit status of a host document's results, a JSON object argument, and the host document printed."""

from __future__ import annotations

import argparse
import json

from gpufleet.base import schema
from gpufleet.base.errors import EXIT_CODES, InputError


class Parser(argparse.ArgumentParser):
    """Every gpufleet parser, subcommands included (add_subparsers makes them of the parent's class), ends its
    --help with the same table of exit codes. `refused`: argparse's last refusal of a command line, which --json
    also says as a JSON line (cli.main)."""

    refused: str | None = None

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        Parser.refused = f"{self.prog}: error: {message}"
        super().error(message)


def refused_json(message: str) -> str:
    """The JSON line a --json command ends with when its input is refused before anything ran (exit 2): the fields
    of `gpufleet fleet --json`'s line, so a wrapper reads every ending alike."""
    return json.dumps(
        {"exit": 2, "status": "refused", "rc": None, "interrupted": False, "nodes": {}, "message": message, "why": {}},
        sort_keys=True,
    )


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
