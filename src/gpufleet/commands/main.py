"""gpufleet command line: the same engine the Ansible modules run.

The commands, grouped as `gpufleet --help` lists them, are COMMAND_GROUPS below; each command's --help says the
rest. The playbooks' and modules' own commands (INTERNAL) run as any other but are left out of that list.

Each command lives in a family (FAMILIES): a module that adds its parsers (`add_parsers(sub)`) and runs them. A
command loads its own family alone: a node starts several engine processes a run, and a `gpufleet check` that
loaded the controller's report, store and runner too would pay for them each time. `gpufleet --help` loads all.

Exit codes: errors.EXIT_CODES, at the end of every command's --help.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

from gpufleet import __version__
from gpufleet.base import guard
from gpufleet.base.command_line import Parser, ending_json, quiet_closed_stdout, Written
from gpufleet.base.errors import InputError

# Each family's module and the commands it adds (tests/test_cli_conventions.py holds the two to each other).
FAMILIES = {
    "gpufleet.commands.one_node": ("collect", "check", "bench", "counters", "profiles"),
    "gpufleet.commands.run": ("run", "lock"),
    "gpufleet.commands.report": ("report",),
    "gpufleet.finetune.command": ("finetune",),
    "gpufleet.views": ("status", "hw"),
    "gpufleet.commands.records": ("record", "history", "baseline", "store", "versions", "slurm", "references"),
    "gpufleet.commands.fleet": ("fleet",),
    "gpufleet.commands.service": ("slurm-sweep", "ladder", "evidence"),
    "gpufleet.commands.certify": ("keygen", "certify", "verify"),
    "gpufleet.node.stage": ("node-stage",),
}
# `gpufleet slurm sweep ...` is the parser's `slurm-sweep` (`gpufleet slurm RUN_DIR` takes a folder there).
SLURM_SWEEP = "slurm-sweep"

# The commands as `gpufleet --help` lists them: each group, then its commands in order. A new command is its name on
# one of these lines (and its parser where it lives); one in no group is listed under "more" and fails
# tests/test_cli_conventions.py.
COMMAND_GROUPS = {
    "the fleet, on the controller": (
        "fleet",
        "report",
        "history",
        "baseline",
        "store",
        "versions",
        "slurm",
        "profiles",
    ),
    "the fleet in service, on the controller": ("slurm-sweep", "ladder", "evidence"),
    "the acceptance certificates": ("keygen", "certify", "verify"),
    "one node, on the node": ("check", "bench", "counters", "status", "hw", "collect", "finetune"),
}
# The playbooks' and modules' own steps: they run as any command but are left out of --help.
INTERNAL = ("run", "lock", "record", "references", "node-stage")
HELP_COLUMNS = 100


class Commands:
    """The subcommands' action, keeping each command's one-line help for the grouped list of `gpufleet --help`
    instead of argparse's one flat list."""

    def __init__(self, action: argparse._SubParsersAction):
        self.action = action
        self.helps: dict[str, str] = {}

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        self.helps[name] = kwargs.pop("help", "")
        return self.action.add_parser(name, **kwargs)

    def unplaced(self) -> list[str]:
        """Commands in no group of COMMAND_GROUPS and not INTERNAL."""
        return sorted(set(self.helps) - set(INTERNAL) - {n for names in COMMAND_GROUPS.values() for n in names})

    def listing(self) -> str:
        groups = {**COMMAND_GROUPS, **({"more": tuple(self.unplaced())} if self.unplaced() else {})}
        width = max(len(n) for names in groups.values() for n in names)
        lines = []
        for group, names in groups.items():
            lines.append(f"{group}:")
            for name in (n for n in names if n in self.helps):
                lines += textwrap.wrap(
                    self.helps[name],
                    HELP_COLUMNS,
                    initial_indent=f"  {name:<{width}}  ",
                    subsequent_indent=" " * (width + 4),
                )
        return "\n".join(lines)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `command`, only those of its family. Each command (a leaf of the tree of
    subcommands) knows its own name (`command_name`, for its messages) and takes --json."""
    p = Parser(prog="gpufleet", usage="gpufleet [-h] [--version] COMMAND ...")
    p.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    sub = Commands(
        p.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="gpufleet")
    )
    for module, names in FAMILIES.items():
        if command is None or command in names:
            importlib.import_module(module).add_parsers(sub)
    for leaf in leaves(p):
        leaf.set_defaults(command_name=leaf.prog)
        if "--json" not in leaf._option_string_actions:  # prints JSON alone: --json asks for nothing more
            leaf.add_argument("--json", action="store_true", help="one JSON line on stdout (this command's output)")
    summary = __doc__.split("\n\n")[0]
    p.description = f"{summary}\n\n{sub.listing()}\n\nEach command's --help says more."
    return p


def leaves(parser: argparse.ArgumentParser):
    """The parsers of the commands under `parser`: those with no subcommand of their own."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for child in dict.fromkeys(action.choices.values()):  # an alias names the same parser twice
            yield from leaves(child)


def route(argv: list[str]) -> list[str]:
    return [SLURM_SWEEP, *argv[2:]] if argv[:2] == ["slurm", "sweep"] else argv


def main(argv: list[str] | None = None) -> int:
    """One convention for every command, kept here and nowhere else: with --json, exactly one JSON line on stdout
    whatever the ending (the command's own, else command_line.ending_json's), but a fault of gpufleet's own, which
    ends in its traceback; an error said on stderr in one line that names the command; a reader of stdout that goes
    away (piped into head) ends nothing early and prints no traceback."""
    argv = route(sys.argv[1:] if argv is None else list(argv))
    as_json = "--json" in argv
    known = {name for names in FAMILIES.values() for name in names}
    Parser.refused = None
    with quiet_closed_stdout():
        try:
            args = build_parser(argv[0] if argv and argv[0] in known else None).parse_args(argv)
        except SystemExit as exc:  # argparse's refusal, said on stderr; with --json also the line that ends every run
            if exc.code == 2 and as_json and Parser.refused:
                print(ending_json(2, Parser.refused))
            raise
        out = sys.stdout = Written(sys.stdout)
        code, message, status = None, None, "done"
        try:
            guard.start_from_env()  # stop what this command starts should the run that asked for it be gone
            code = args.func(args)
        except InputError as exc:
            code, message, status = 2, f"{args.command_name}: {exc}", "refused"
            print(message, file=sys.stderr)
        except KeyboardInterrupt:
            code, message, status = 130, f"{args.command_name}: interrupted", "interrupted"
            print(message, file=sys.stderr)
        finally:
            sys.stdout = out.stream
            # A fault of gpufleet's own (code None) ends in its traceback alone: a line here would read as a
            # document to what parses the output (the modules take a document from an exit 1).
            if args.json and not out.written and code is not None:
                print(ending_json(code, message, status))
        return code


if __name__ == "__main__":
    sys.exit(main())
