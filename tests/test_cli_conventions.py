"""The command line keeps its ecosystem's conventions: `gpufleet --version`; the commands grouped in --help, the
playbooks' own left out of it; `--json` prints the JSON alone on stdout, everything else on stderr, with one exit
field (`gpufleet fleet --json`: tests/test_runner_fleet.py); the views exit by one rule (errors.EXIT_CODES: 1 when
no GPU could be read)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
