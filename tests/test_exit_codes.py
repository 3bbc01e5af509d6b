"""One table of exit codes: at the end of every gpufleet parser's --help, and the same in docs/operations.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.commands import main as cli
from gpufleet.base import command_line
from gpufleet.base.errors import EXIT_CODES
from gpufleet.finetune import command as finetune_cli

OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def _parsers(parser: argparse.ArgumentParser, name: str = "gpufleet"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_parser_ends_its_help_with_the_table():
    parsers = dict(_parsers(cli.build_parser()))
    assert {
        "gpufleet check",
        "gpufleet bench",
        "gpufleet counters",
        "gpufleet status",
        "gpufleet report",
        "gpufleet fleet run",
        "gpufleet fleet resume",
        "gpufleet baseline set",
        "gpufleet lock acquire",
    } <= set(parsers)
    for name, parser in parsers.items():
        assert parser.format_help().rstrip().endswith(EXIT_CODES), name


def test_python_m_gpufleet_finetune_shows_it_too(capsys):
    try:
        finetune_cli.main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.rstrip().endswith(EXIT_CODES)


def test_the_operations_guide_shows_the_same_table():
    assert "```text\n" + EXIT_CODES + "\n```" in OPERATIONS.read_text()


def test_results_exit():
    passed = [{"status": "pass"}, {"status": "warn"}, {"status": "skip"}]
    assert command_line.results_exit(passed) == 0
    assert command_line.results_exit(passed + [{"status": "error"}]) == 1
    assert command_line.results_exit(passed + [{"status": "fail"}]) == 1
    assert command_line.results_exit(passed + [{"status": "fail"}], exit_zero=True) == 0
