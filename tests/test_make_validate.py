"""`make validate` on inventory/local: the node's Python and the GPU count it expects, chosen on this machine and
said at the start (scripts/local_node.py), reach the run; a board with fewer GPUs than its profile's is told how
to say so. On a GPU machine, tools/gpu_make_validate.sh runs the README's command from a fresh clone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.node import host_documents
from playbooks import playbook_env, run_playbook

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"


def local_node(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "local-node.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "local_node.py"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_it_says_which_python_the_node_runs_and_which_gpu_count_it_expects(tmp_path):
    done, chosen = local_node(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"make validate: the node's Python: {sys.executable}, the controller's .venv: ")
    # Here: no CUDA (the CPU build of torch), no driver: said, with how to choose another Python.
    assert "NODE_PYTHON=" in lines[0]
    assert (
        lines[1]
        == "make validate: GPUs: no NVIDIA driver: libnvidia-ml.so not found: no GPU to check, the node will not be accepted"
    )
    assert chosen == {"local_node_python": sys.executable}
    done, chosen = local_node(tmp_path, "--node-python", sys.executable, "--expected-gpus", "4")
    assert done.returncode == 0 and chosen == {
        "local_node_python": sys.executable,
        "local_node_gpus_expected": 4,
    }
    assert "make validate: GPUs: 4 GPU(s) expected, as EXPECTED_GPUS says; NVML sees 0" in done.stdout
    done, _ = local_node(tmp_path, "--expected-gpus", "four")
    assert done.returncode == 1 and "EXPECTED_GPUS='four'; expected a whole number of GPUs" in done.stderr


def test_a_board_with_fewer_gpus_than_its_profile_is_told_how_to_say_so():
    readings = json.loads(READINGS.read_text())  # one H100 80GB HBM3: profile h100-sxm, an 8-GPU board
    count = next(
        r for r in host_documents.check_host(readings, ["gpu_inventory"])["results"] if r["check"] == "gpu_count"
    )
    assert count["status"] == "fail" and count["reason"].endswith("expected 8")
    assert (
        "if this machine has 1 GPUs by design, say so: gpufleet_thresholds: {gpus_expected: 1} for it "
        "(make validate: EXPECTED_GPUS=1); profile h100-sxm expects 8 (HGX H100 8-GPU baseboard)"
    ) in count["remedy"]
    said = next(
        r
        for r in host_documents.check_host(readings, ["gpu_inventory"], overrides={"gpus_expected": 2})["results"]
        if r["check"] == "gpu_count"
    )
    assert said["status"] == "fail" and "by design" not in said["remedy"]  # the inventory said 2: a GPU is missing


@pytest.mark.slow
def test_inventory_local_takes_what_make_validate_chose(tmp_path):
    """The variables file local_node.py writes, as the Makefile passes it: the node's Python and the count reach the
    node's engine, and the run says the count at its start."""
    done, _ = local_node(tmp_path, "--expected-gpus", "3")
    assert done.returncode == 0, done.stderr
    proc = run_playbook(
        "validate.yml",
        "inventory/local",
        "-e",
        f"@{tmp_path / 'local-node.json'}",
        "-e",
        json.dumps({"gpufleet_benchmarks": []}),
        env=playbook_env(tmp_path),
        run_id="local",
        reports=tmp_path / "reports",
        lock=tmp_path / "node.lock",
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "GPUs expected: 3 (gpufleet_thresholds.gpus_expected) on localhost. To change it:" in out, out[-3000:]
    assert "(make validate: EXPECTED_GPUS=N)" in out
    doc = json.loads((tmp_path / "reports" / "local" / "hosts" / "localhost.json").read_text())
    assert doc["profile"]["thresholds"]["gpus_expected"] == {
        "value": 3,
        "source": "inventory override (gpufleet_thresholds)",
    }
