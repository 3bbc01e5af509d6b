"""The command line keeps its ecosystem's conventions: `gpufleet --version`; the commands grouped in --help, the
playbooks' own left out of it; `--json` prints the JSON alone on stdout, everything else on stderr, with one exit
field (`gpufleet fleet --json`: tests/test_runner_fleet.py); the views exit by one rule (errors.EXIT_CODES: 1 when
no GPU could be read)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cli_cells
import file_faults
from gpufleet.commands import main as cli
from gpufleet import version

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"


def gpufleet(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_version_is_galaxy_ymls():
    done = gpufleet("--version")
    assert done.returncode == 0 and done.stdout == f"gpufleet {version.read()}\n", done
    assert version.read() != version.UNKNOWN


def registered() -> set[str]:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    return set(sub.choices)


@pytest.mark.slow
def test_help_groups_every_command_and_leaves_the_internal_ones_out():
    grouped = [n for names in cli.COMMAND_GROUPS.values() for n in names]
    assert len(grouped) == len(set(grouped)) and not set(grouped) & set(cli.INTERNAL)
    assert registered() == set(grouped) | set(cli.INTERNAL)
    text = gpufleet("--help").stdout
    listing = text[text.index(next(iter(cli.COMMAND_GROUPS))) : text.index("options:")]
    listed = [line.split()[0] for line in listing.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert listed == grouped, listing
    for group in cli.COMMAND_GROUPS:
        assert f"\n{group}:\n" in text
    for name in cli.INTERNAL:
        assert name not in listed
        assert gpufleet(name, "--help").returncode == 0  # hidden, not gone: the playbooks run them
    fleet = gpufleet("fleet", "--help").stdout
    assert "locate-step" not in fleet and "locate " in fleet
    assert gpufleet("fleet", "locate-step", "--help").returncode == 0


# The controller's packages and command lines: a node's command loads none of them.
CONTROLLER = (
    "report",
    "runner",
    "service",
    "fleet",
    "commands.fleet",
    "commands.records",
    "commands.report",
    "commands.service",
)


def test_each_family_adds_the_commands_it_is_listed_with_and_a_node_command_loads_its_own_alone():
    """cli.FAMILIES is what main() loads a command's parser from: a command listed with the wrong module would not
    parse. A node's `gpufleet check` or `gpufleet lock` loads none of the controller's packages (each engine process
    on a node pays for what it imports)."""
    for module, names in cli.FAMILIES.items():
        sub = next(a for a in cli.build_parser(names[0])._actions if a.dest == "command")
        assert set(sub.choices) == set(names), module
    assert cli.route(["slurm", "sweep", "--tier", "quick"])[0] in cli.FAMILIES["gpufleet.commands.service"]
    probe = (
        "import sys; from gpufleet.commands import main as cli; cli.build_parser(sys.argv[1]); "
        "print(' '.join(m for m in sys.modules if m.startswith('gpufleet.')))"
    )
    for command in ("check", "bench", "counters", "lock"):
        done = subprocess.run([sys.executable, "-c", probe, command], capture_output=True, text=True, timeout=120)
        loaded = done.stdout.split()
        assert done.returncode == 0 and "gpufleet.commands.main" in loaded, done.stderr
        controller = [
            m for m in loaded if any(m.split(".")[1 : 1 + p.count(".") + 1] == p.split(".") for p in CONTROLLER)
        ]
        assert not controller, f"`gpufleet {command}` loads {controller}"


def test_a_command_in_no_group_is_still_listed_and_named():
    sub = cli.Commands(cli.Parser(prog="t").add_subparsers())
    sub.add_parser("check", help="x")
    sub.add_parser("sweep", help="a new command")
    assert sub.unplaced() == ["sweep"]
    assert re.search(r"more:\n  sweep +a new command$", sub.listing()), sub.listing()


def recording_without_gpus(path: Path) -> Path:
    readings = json.loads(READINGS.read_text())
    readings["nvml"] = {"available": False, "error": "no NVIDIA driver: libnvidia-ml.so not found", "gpus": []}
    path.write_text(json.dumps(readings))
    return path


@pytest.mark.parametrize("view", ["status", pytest.param("hw", marks=pytest.mark.slow)])  # hw reads this host: seconds
def test_the_views_exit_by_one_rule(tmp_path, view):
    """0 with GPUs read; 1 when none could be read, the JSON still printed and the reason on stderr or in it."""
    done = gpufleet(view, "--readings", str(READINGS), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["view"] == view, done.stderr
    done = gpufleet(view, "--readings", str(recording_without_gpus(tmp_path / "none.json")), "--json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert "libnvidia-ml.so not found" in done.stderr + json.dumps(doc)


def only_json(done: subprocess.CompletedProcess) -> dict:
    """stdout is one JSON document and nothing else."""
    assert done.stdout.strip(), f"nothing on stdout; stderr: {done.stderr}"
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not JSON alone ({exc}): {done.stdout[:2000]}") from None


@pytest.mark.slow
def test_json_is_alone_on_stdout(tmp_path):
    run_dir = tmp_path / "reports" / "r1"
    (run_dir / "hosts").mkdir(parents=True)
    for host in ("n1", "n2"):
        done = gpufleet(
            "check",
            "--readings",
            str(READINGS),
            "--group",
            "gpu_inventory",
            "--host",
            host,
            "--json",
            "--thresholds",
            '{"gpus_expected": 1}',
        )
        assert only_json(done)["host"] == host
        (run_dir / "hosts" / f"{host}.json").write_text(done.stdout)
    commands = [
        ("counters", "--phase", "before", "--readings", str(READINGS), "--json"),
        ("report", str(run_dir), "--json"),
        ("history", "n1", "--reports-dir", str(run_dir.parent), "--json"),
        ("baseline", "show", "--reports-dir", str(run_dir.parent), "--json"),
        ("versions", str(run_dir), "--json"),
        ("store", "rebuild", "--reports-dir", str(run_dir.parent), "--json"),
    ]
    for argv in commands:
        done = gpufleet(*argv, cwd=tmp_path)
        assert done.returncode in (0, 1), (argv, done.stderr)
        doc = only_json(done)
        assert not isinstance(doc, dict) or "rc" not in doc, (argv, doc)


# ---------------------------------------------------------------- one convention for every command (commands/main.py)

NOWHERE = "{nowhere}"  # where every path a command is given lies: under a file, so nothing can be made there


def command_lines() -> list:
    """Every command of the parser (a leaf of its tree), as typed after `gpufleet`, with a value for each argument it
    requires (and for each option whose default is an absolute path, so that nothing of this machine's is used): a
    choice's first, "1" for a number, else a path under NOWHERE (nowhere()). A new command joins by itself."""
    out = []
    for leaf in cli.leaves(cli.build_parser()):
        words = leaf.prog.split()[1:]
        for a in leaf._actions:
            system_path = isinstance(a.default, str) and a.default.startswith("/")  # the node lock's, say: not here
            if isinstance(a, argparse._HelpAction) or (a.option_strings and not (a.required or system_path)):
                continue
            if a.nargs == "?":
                continue
            value = str(a.choices[0] if a.choices else 1 if a.type in (int, float) else f"{NOWHERE}/{a.dest}")
            words += [a.option_strings[0], value] if a.option_strings else [value]
        out.append(pytest.param(leaf.prog, words, id=leaf.prog.removeprefix("gpufleet ")))
    return out


def nowhere(words: list[str], tmp_path: Path) -> list[str]:
    (tmp_path / "a-file").write_text("not a folder\n")
    return [w.replace(NOWHERE, str(tmp_path / "a-file")) for w in words]


@pytest.mark.parametrize("prog, words", command_lines())
def test_an_unknown_option_is_refused_naming_the_command_and_with_json_in_one_json_line(tmp_path, prog, words):
    words = nowhere(words, tmp_path)
    cut = len(prog.split()) - 1  # the option right after the command's own words, before a REMAINDER takes it
    done = cli_cells.run(
        [*words[:cut], "--no-such-option", *words[cut:], "--json"], cwd=tmp_path, folder=tmp_path / "io"
    )
    assert done.rc == 2 and "Traceback" not in done.err, done
    assert done.err.splitlines()[-1] == f"{prog}: error: unrecognized arguments: --no-such-option", done.err
    [line] = done.out.splitlines()
    assert json.loads(line)["exit"] == 2 and json.loads(line)["message"] == done.err.splitlines()[-1]


@pytest.mark.parametrize("prog, words", command_lines())
def test_every_command_ends_in_one_json_line_and_quietly_when_its_reader_is_gone(tmp_path, prog, words):
    """Every command with --json prints exactly one JSON line on stdout, however it ends (here mostly its own refusal
    of a path that does not exist: exit 2, one line on stderr naming the command); the same command with its stdout
    a pipe nobody reads (`| head`, `| true`) ends with the same exit code and no traceback."""
    words = nowhere(words, tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    cut = len(prog.split()) - 1  # --json right after the command's own words, before a REMAINDER takes it
    done = cli_cells.run(
        [*words[:cut], "--json", *words[cut:]], cwd=tmp_path, folder=tmp_path / "io", env=env, timeout_s=300
    )
    said = f"{done.argv}: rc {done.rc}\nstdout {done.out[-2000:]}\nstderr {done.err[-2000:]}"
    assert not done.timed_out and "Traceback" not in done.err, said
    lines = [line for line in done.out.splitlines() if line.strip()]
    assert len(lines) == 1 and isinstance(json.loads(lines[0]), dict), said
    if done.rc == 2:
        assert done.err.splitlines()[-1].startswith(f"{prog}: "), said
        assert json.loads(lines[0])["exit"] == 2, said
    closed = cli_cells.run(words, cwd=tmp_path, folder=tmp_path / "closed", env=env, timeout_s=300, stdout_closed=True)
    assert closed.rc == done.rc and "Traceback" not in closed.err and "BrokenPipe" not in closed.err, (said, closed)


@pytest.mark.parametrize("command", sorted(file_faults.COMMANDS))
def test_a_command_whose_reader_is_gone_ends_as_it_would_have_and_quietly(every_file, tmp_path, command):
    """Each command of the file-fault matrix on a reports folder holding every file, so that it has something to
    print, with its stdout a pipe whose reader is gone (`gpufleet history n0 | head -0`, `| true`), as text and with
    --json: the exit code it has with its stdout read, no traceback, no BrokenPipeError (`history` ended in one, exit
    1; `report`, `baseline show` and `store rebuild` in one at their exit)."""
    said, codes = [], {}
    for form, closed in (("text", False), ("text", True), ("json", True), ("json", False)):
        base = tmp_path / f"base-{form}-{closed}"
        shutil.copytree(every_file, base, symlinks=True)
        words = [w for w in file_faults.argv(command, base) if form == "json" or w != "--json"]
        cell = cli_cells.run(words, cwd=file_faults.REPO, folder=tmp_path / f"io-{form}-{closed}",
                             stdin=file_faults.stdin_of(command), stdout_closed=closed)  # fmt: skip
        said.append(f"{cell.argv}{' | true' if closed else ''}: rc {cell.rc}\nstdout {cell.out[-500:]}\n"
                    f"stderr {cell.err[-2000:]}")  # fmt: skip
        assert not cell.timed_out and "Traceback" not in cell.err and "BrokenPipe" not in cell.err, said[-1]
        assert closed or cell.out.strip(), f"printed nothing to lose: {said[-1]}"
        codes[form, closed] = cell.rc
    assert codes["text", True] == codes["text", False] and codes["json", True] == codes["json", False], said


def test_history_through_the_installed_command_ends_quietly_when_its_reader_is_gone(every_file, tmp_path):
    """The same as a user meets it: the installed `gpufleet history` in an interpreter of its own (whose exit flushes
    stdout), its stdout a pipe whose reader is gone."""
    argv = [
        str(Path(sys.executable).parent / "gpufleet"),
        "history",
        "n0",
        "--reports-dir",
        str(every_file / "reports"),
    ]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert done.returncode == 0 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done


def test_a_check_changes_nothing_anywhere(every_file, tmp_path):
    """Every command that takes --check (documented: says what it would do, changes nothing), run with it on a reports
    folder holding every file: not a byte of the folder changes (`gpufleet slurm RUN --check` appended to slurm.json)."""
    base = every_file
    checking = [leaf.prog for leaf in cli.leaves(cli.build_parser()) if "--check" in leaf._option_string_actions]
    assert "gpufleet slurm" in checking
    lines = {"gpufleet slurm": ["slurm", "{run}", "--check"]}
    assert set(checking) <= set(lines), f"a command with --check to run here: {set(checking) - set(lines)}"
    before = file_faults.tree(base)
    for prog in checking:
        for action in ("none", "drain"):
            argv = [a.replace("{run}", str(base / "reports" / file_faults.RUN)) for a in lines[prog]]
            done = cli_cells.run([*argv, "--action", action, "--json"], cwd=tmp_path, folder=tmp_path / "io")
            assert done.rc in (0, 1, 2) and "Traceback" not in done.err, done
            assert file_faults.tree(base) == before, f"{prog} --check changed the folder"
