"""validate.yml runs on the lowest and the highest ansible-core the collection claims: meta/runtime.yml's
`requires_ansible` and the range of pyproject.toml's controller extra (the rest of the suite runs the test venv's).

Each version has a venv of its own with the controller extra, built by the Makefile (`.venv-ansible-lowest`,
`.venv-ansible-highest`) and kept between runs. A real run over inventory/local (this machine, no GPU, no benchmark)
goes through every play: the node is not accepted (exit 2), and every run folder left holds its report.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from playbooks import playbook_env, run_playbook

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NO_NEWER_PYTHON = 3  # the Makefile's exit when no Python can run the highest ansible-core


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


def venv(which: str) -> Path:
    """The venv of that ansible-core, built (or found up to date) by the Makefile."""
    done = subprocess.run(
        ["make", "-s", f".venv-ansible-{which}/.installed"], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    if done.returncode == NO_NEWER_PYTHON and which == "highest":
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    return REPO / f".venv-ansible-{which}"


@pytest.mark.parametrize("which", ["lowest", "highest"])
def test_validate_runs_every_play_on_the_lowest_and_highest_ansible_core_claimed(tmp_path, which):
    bin_dir = venv(which) / "bin"
    version = subprocess.run(
        [str(bin_dir / "python"), "-c", "import ansible.release; print(ansible.release.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    want = claimed()[which]
    assert version == want if which == "lowest" else version.startswith(want + "."), (version, want)

    reports = tmp_path / "reports"
    proc = run_playbook(
        "validate.yml",
        "inventory/local",
        "-e",
        json.dumps({"gpufleet_benchmarks": []}),
        env=playbook_env(tmp_path, bin_dir=bin_dir, PYTHONPATH=""),
        timeout_s=300,
        run_id=f"core-{which}",
        reports=reports,
        lock=tmp_path / "node.lock",
        bin_dir=bin_dir,
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "has no attribute" not in out, out[-4000:]
    # No GPU here: the node is not accepted, and that is the one failure of the run.
    assert proc.returncode == 2 and "1 node(s) failed acceptance: localhost" in " ".join(out.split()), out[-4000:]
    report = json.loads((reports / f"core-{which}" / "report.json").read_text())
    assert report["nodes"]["localhost"]["verdict"] == "fail"
    assert {r["group"] for r in report["nodes"]["localhost"]["results"]} >= {"gpu_inventory", "gpu_health"}
    assert [p.name for p in reports.iterdir() if p.is_dir() and not (p / "report.json").is_file()] == []
