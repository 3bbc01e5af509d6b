"""The README's command, `ansible-playbook validate.yml -i inventory/local` and nothing more, checks the node on every
ansible-core the collection claims: meta/runtime.yml's `requires_ansible` to the upper bound of pyproject.toml's
extras (the rest of the suite runs the test venv's).

Each version comes from the Makefile and is kept between runs, with two venvs made in all: the lowest (2.16.0, on
Python 3.11) and the highest (2.20, on Python 3.12) in a venv of their own with the controller extra; the others
ansible-core alone over one of them (PYTHONPATH), as `ansible-playbook --version` then says: the newest of each minor
between (2.17, 2.18, 2.19) over the lowest, Ubuntu 24.04's own (2.16.3) over the highest, on the Python 3.12 Ubuntu
24.04 ships. Each run goes through every play from a folder that is the checkout as seen from its root (its reports/
the test's own; the node lock at its default path, one run at a time on this machine), and holds to:

- no traceback and no warning of the version's (a deprecation, a conditional of text, an option it drops);
- exit 2, the one failure the node's not being accepted for want of an NVIDIA driver (no GPU here);
- every check group answering in report.json, and no `engine` error (the node stage refused nothing it was given);
- the engine's own choice of benchmarks: every one of the default tier asked for, each saying torch is missing (no
  torch in these venvs), where a run that lost the engine's defaults, as gpufleet_benchmarks '' did on 2.16 to 2.18,
  has none.

tests/test_templates_every_core.py holds every template to what renders alike on all of them.
"""

from __future__ import annotations

import fcntl
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from gpufleet.base import registry
from playbooks import playbook_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NONE_FOUND = 3  # a Makefile recipe's exit when no Python can run that ansible-core (scripts/find_python.py)
# validate.yml's default node lock, which these runs keep: one at a time on this machine, whichever checkout runs it.
NODE_LOCK_TURN = Path("/run/lock/gpufleet-tests-default-node-lock.lock")
# What the documented command reads from the checkout's root.
CHECKOUT_ROOT = ("ansible.cfg", "validate.yml", "playbooks", "inventory", "collections")


def claimed() -> dict[str, str]:
    """{"lowest": "2.16.0", "highest": "2.20"}: meta/runtime.yml's lower bound, pyproject's upper bound less one minor,
    both extras claiming the same range."""
    lowest = re.fullmatch(
        r">=\s*([0-9.]+)", yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    )
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ranges = {spec for name in ("controller", "test") for spec in extras[name] if spec.startswith("ansible-core")}
    assert len(ranges) == 1, f"the controller and test extras claim different ansible-core ranges: {ranges}"
    bounds = re.fullmatch(r"ansible-core>=(\d+)\.(\d+),<(\d+)\.(\d+)", ranges.pop())
    assert lowest and bounds, "meta/runtime.yml or pyproject.toml no longer says its ansible-core range as >=X.Y"
    assert lowest.group(1).startswith(f"{bounds.group(1)}.{bounds.group(2)}"), "runtime.yml and pyproject.toml disagree"
    return {"lowest": lowest.group(1), "highest": f"{bounds.group(3)}.{int(bounds.group(4)) - 1}"}


def claimed_minors() -> list[str]:
    """Every minor of the claimed range, lowest to highest: 2.16, 2.17, ..., 2.20."""
    low, high = (tuple(int(p) for p in v.split(".")[:2]) for v in claimed().values())
    assert low[0] == high[0], "a range across major versions: list its minors here"
    return [f"{low[0]}.{minor}" for minor in range(low[1], high[1] + 1)]


def makefile_value(name: str) -> str:
    found = re.search(rf"^{name} := (\S+)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert found, f"the Makefile sets no {name}"
    return found.group(1)


def versions() -> dict[str, str]:
    """{what the Makefile builds: the version it must report}: the lowest, Ubuntu 24.04's, each minor between (as
    "2.17"), the highest."""
    ends = claimed()
    between = claimed_minors()[1:-1]
    assert makefile_value("ANSIBLE_LOWEST") == ends["lowest"] and makefile_value("ANSIBLE_HIGHEST") == ends["highest"]
    return {"lowest": ends["lowest"], "ubuntu": makefile_value("ANSIBLE_UBUNTU"), **{m: m for m in between}, **ends}


def make(target: str) -> None:
    done = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True, timeout=900)
    # make exits 2 whatever its recipe exited with; its last line says the recipe's own status.
    if done.returncode and done.stderr.rstrip().endswith(f"] Error {NONE_FOUND}"):
        pytest.skip(f"make {target}: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr


def ansible_core(which: str) -> tuple[Path, str]:
    """(the bin folder whose ansible-playbook runs that version, the PYTHONPATH it needs), built by the Makefile."""
    if which in ("lowest", "highest"):
        make(f".venv-ansible-{which}/.installed")
        return REPO / f".venv-ansible-{which}" / "bin", ""
    version = versions()[which]
    make(f".ansible-core/{version}/.installed")
    over = "highest" if which == "ubuntu" else "lowest"
    return REPO / f".venv-ansible-{over}" / "bin", str(REPO / ".ansible-core" / version)


def test_the_versions_tested_are_every_minor_claimed_and_ubuntus():
    tested = versions()
    assert [v[:4] for v in tested.values()] == ["2.16", "2.16", *claimed_minors()[1:]], tested
    assert tested["ubuntu"] == "2.16.3"  # Ubuntu 24.04's ansible-core package


@pytest.mark.parametrize("which", list(versions()))
def test_the_readmes_command_checks_the_node_on_every_ansible_core_claimed(tmp_path, which):
    bin_dir, pythonpath = ansible_core(which)
    env = playbook_env(tmp_path, bin_dir=bin_dir, PYTHONPATH=pythonpath)
    # What the command below runs: its ansible-core and the Python under it.
    asked = subprocess.run(
        ["ansible-playbook", "--version"], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    version = re.search(r"^ansible-playbook \[core ([0-9.]+)\]", asked, flags=re.M)
    python = re.search(r"^  python version = (\d+)\.(\d+)", asked, flags=re.M)
    assert version and python, asked
    want = versions()[which]
    assert version.group(1) == want if want.count(".") == 2 else version.group(1).startswith(want + "."), asked
    if which == "ubuntu":
        assert python.groups() == ("3", "12"), asked  # the Python Ubuntu 24.04 ships

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in CHECKOUT_ROOT:
        (checkout / name).symlink_to(REPO / name)
    NODE_LOCK_TURN.parent.mkdir(parents=True, exist_ok=True)
    with open(NODE_LOCK_TURN, "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)  # an event wait: the other run's close or death releases it
        proc = subprocess.run(
            ["ansible-playbook", "validate.yml", "-i", "inventory/local"],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    out = proc.stdout + proc.stderr
    (tmp_path / "run.log").write_text(out)
    flat = " ".join(out.split())
    assert "Traceback" not in out and "has no attribute" not in out, out[-4000:]
    # Nothing the version warns of (a deprecation, a conditional of text, an option it drops).
    assert "[WARNING]" not in out and "[DEPRECATION WARNING]" not in out, out[-4000:]
    # No GPU here: the node is not accepted for want of a driver, and that is the run's one failure.
    assert proc.returncode == 2, out[-4000:]
    assert "1 node(s) failed acceptance: localhost: no NVIDIA driver: libnvidia-ml.so not found" in flat, out[-4000:]

    (run_dir,) = [p for p in (checkout / "reports").iterdir() if p.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    results = report["nodes"]["localhost"]["results"]
    assert report["nodes"]["localhost"]["verdict"] == "fail"
    assert [r for r in results if r["check"] == "engine"] == [], results
    assert {r["group"] for r in results} >= {*registry.group_names(), "benchmark"}
    # The engine's own choice of benchmarks: every one of the default tier asked for, each saying torch is missing.
    asked_for = {r["check"]: r for r in results if r["group"] == "benchmark" and r["check"] != "measured_again"}
    assert set(asked_for) == set(registry.benchmark_names(default=True)), sorted(asked_for)
    assert all(r["status"] == "error" and "no torch in" in r["reason"] for r in asked_for.values()), asked_for
