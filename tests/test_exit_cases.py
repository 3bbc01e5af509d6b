"""Each case held to the README's exit-code table (errors.EXIT_CODES): 0 done, 1 a result failed or erred (a node not
accepted), 2 bad input or could not run, with a message that names what, never a traceback; `gpufleet fleet --json`
ends with its JSON line whatever the code. 130 (interrupted) is held in tests/test_runner_fleet.py and
tests/test_faults.py, a full disk in tests/test_store_damage.py.

The fleet runs are real runs of validate.yml through ansible-runner on this machine (inventory/local, or a node at
a closed port of 127.0.0.1 that never answers); a failed start leaves no run folder and no Ansible temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import cli
from gpufleet.errors import EXIT_CODES

from test_fleet_synthetic import node_doc, write_run

pytest.importorskip("ansible_runner")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The codes the table names, each with the words that start its line.
TABLE = {
    int(line.split()[0]): line.split(None, 1)[1] for line in EXIT_CODES.splitlines()[1:] if line.split()[0].isdigit()
}


def unreachable_inventory(tmp_path: Path) -> str:
    path = tmp_path / "silent.yml"
    node = {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": 1,
        "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no",
    }
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"node-a": node, "node-b": node}}}}}))
    return str(path)


def fleet_run(tmp_path: Path, *args: str, **env_vars: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`gpufleet fleet run --json` (its temporary folders under tmp_path, env_vars added to its environment): the
    process and its last line, parsed."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        TMPDIR=str(tmp_path / "tmp"),
        HOME=str(tmp_path / "home"),
        **env_vars,
    )
    env.pop("ANSIBLE_LOCAL_TEMP", None)
    proc = subprocess.run(
        [
            str(BIN / "gpufleet"),
            "fleet",
            "run",
            "--reports-dir",
            str(tmp_path / "reports"),
            "--plain",
            "--json",
            "-e",
            f"gpufleet_lock_path={tmp_path / 'node.lock'}",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return proc, json.loads(lines[-1])


def left_temporary(tmp_path: Path) -> list[str]:
    """Ansible's and the runner's temporary folders still there after a run."""
    return [p.name for p in (tmp_path / "tmp").glob("gpufleet-ansible-*")] + [
        p.name for p in (tmp_path / "home" / ".ansible" / "tmp").glob("ansible-local-*")
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["a run id already used", "a threshold refused", "no node answered", "a node not accepted"]
)
def test_a_fleet_run_exits_as_the_table_says_and_ends_with_its_json_line(tmp_path, case):
    reports = tmp_path / "reports"
    if case == "a run id already used":
        write_run(reports, "used", {"localhost": node_doc("localhost", 0)})
        proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "used")
        expected, words = 2, "run id 'used' is already used"
    elif case == "a threshold refused":
        proc, line = fleet_run(
            tmp_path,
            "-i",
            "inventory/local",
            "--run-id",
            "typo",
            "-e",
            json.dumps({"gpufleet_thresholds": {"nope": 1}}),
        )
        expected, words = 2, "gpufleet_thresholds for localhost: gpufleet_thresholds.nope is not a known threshold"
        assert not (reports / "typo").exists(), "a failed start leaves no run folder"
    elif case == "no node answered":
        proc, line = fleet_run(tmp_path, "-i", unreachable_inventory(tmp_path), "--run-id", "silent")
        expected, words = 2, "no node answered"
        assert line["nodes"] == {"node-a": "not reached", "node-b": "not reached"}
    else:
        proc, line = fleet_run(
            tmp_path, "-i", "inventory/local", "--run-id", "cpu", "-e", '{"gpufleet_benchmarks": []}'
        )
        expected, words = 1, "node(s) not accepted"  # no GPU here
        assert line["nodes"] == {"localhost": "not accepted"} and line["why"]["localhost"]
    assert expected in TABLE
    assert proc.returncode == expected and line["exit"] == expected, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert words in line["message"] and words in " ".join((proc.stdout + proc.stderr).split()), line
    assert not left_temporary(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a variable refused", "a node not accepted", "no node answered"])
def test_the_playbook_path_tells_a_refused_variable_from_a_node_not_accepted(tmp_path, case):
    """ansible-playbook exits 2 for both (a task failed): what tells them apart is the run folder, as
    docs/operations.md's table says. A refused variable fails the first play and leaves no run folder; a node not
    accepted, or none answering, leaves reports/<run-id>/report.json with each node's verdict."""
    inventory = unreachable_inventory(tmp_path) if case == "no node answered" else "inventory/local"
    extra = {"gpufleet_benchmark": []} if case == "a variable refused" else {"gpufleet_benchmarks": []}
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "validate.yml",
            "-i",
            inventory,
            "-e",
            json.dumps(
                dict(
                    extra,
                    gpufleet_run_id="wrapped",
                    gpufleet_reports_dir=str(reports),
                    gpufleet_lock_path=str(tmp_path / "node.lock"),
                )
            ),
        ],
        cwd=REPO,
        env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-3000:]
    report = reports / "wrapped" / "report.json"
    if case == "a variable refused":
        assert not (reports / "wrapped").exists(), "a refused variable leaves no run folder"
        assert (
            "TASK [Check every node's variables]" in out
            and "gpufleet_benchmark (for localhost) is not a variable" in out
        )
    else:
        nodes = json.loads(report.read_text())["nodes"]
        assert {n["verdict"] for n in nodes.values()} == {"fail"}, nodes
        if case == "no node answered":
            assert all(any(r["check"] == "reachable" for r in n["results"]) for n in nodes.values()), nodes


def test_the_store_commands_exit_as_the_table_says(capsys, tmp_path):
    reports = tmp_path / "reports"
    good = write_run(reports, "good", {"n0": node_doc("n0", 0)})
    assert cli.main(["report", str(good)]) == 0  # every node accepted
    bad = node_doc("n1", 1)
    bad["results"][0] = dict(bad["results"][0], status="fail", reason="broken")
    assert cli.main(["report", str(write_run(reports, "bad", {"n1": bad}))]) == 1  # a node not accepted
    assert cli.main(["history", "n0", "--reports-dir", str(reports)]) == 0
    capsys.readouterr()
    (reports / "gpufleet.db").write_bytes(b"\x00garbage\xff" * 2000)
    for f in reports.glob("gpufleet.db-*"):
        f.unlink()
    assert cli.main(["history", "n0", "--reports-dir", str(reports)]) == 2  # said, not a traceback
    assert "is not a gpufleet store" in capsys.readouterr().err
    assert cli.main(["store", "rebuild", "--reports-dir", str(reports)]) == 0  # the repair
    assert cli.main(["history", "no-such-node", "--reports-dir", str(reports)]) == 2
    assert "is no node, GPU UUID or serial" in capsys.readouterr().err
