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
import threading
from pathlib import Path

import pytest
import yaml

from gpufleet.commands import main as cli
from gpufleet.base import lock, runs
from gpufleet.base.errors import EXIT_CODES
from gpufleet.runner import record as rec

from playbooks import playbook_env, run_playbook
from test_fleet_synthetic import node_doc, write_run
from test_store_damage import fill, tiny_filesystem
from waiting import wait_for

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
    proc = run_playbook(
        "validate.yml",
        inventory,
        "-e",
        json.dumps(extra),
        env=playbook_env(tmp_path),
        run_id="wrapped",
        reports=reports,
        lock=tmp_path / "node.lock",
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


def test_argparse_refusals_end_with_the_json_line_too_and_every_message_names_its_command():
    for argv, words in (
        (["fleet", "run", "-i", "inventory/local", "--tier", "nope", "--json"], "argument --tier: invalid choice"),
        (["history", "--json"], "the following arguments are required: key"),
    ):
        done = subprocess.run([str(BIN / "gpufleet"), *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        line = json.loads(done.stdout.strip().splitlines()[-1])
        assert line["exit"] == 2 and line["status"] == "refused" and words in line["message"], line
        assert words in done.stderr  # argparse's own usage and message stay on stderr
    for argv, name in (
        (["ladder", "/nonexistent"], "gpufleet ladder: /nonexistent/report.json cannot be read"),
        (["slurm", "sweep", "--tier", "smoke"], "gpufleet slurm sweep: --partition"),
    ):
        done = subprocess.run([str(BIN / "gpufleet"), *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith(name), done.stderr


@pytest.mark.slow
def test_a_node_refused_by_its_lock_is_named_in_drain_txt_and_not_drained(tmp_path):
    # Another run of this controller holds the node, and its controller (a process of this test) still runs.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        controller = runs.controller_identity()
        controller.update(pid=holder.pid, started_ticks=runs._proc_stat(holder.pid)[1])
        assert runs.controller_alive(controller)
        assert lock.acquire(tmp_path / "node.lock", "other", "localhost", 3600, controller=controller)["acquired"]
        proc, line = fleet_run(
            tmp_path, "-i", "inventory/local", "--run-id", "refused", "-e", '{"gpufleet_benchmarks": []}'
        )
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1 and line["why"]["localhost"][0]["check"] == "lock.node_lock", line
    head, *lines = (tmp_path / "reports" / "refused" / "drain.txt").read_text().splitlines()
    assert (
        head
        == (
            "# gpufleet refused: 1 node(s) not accepted; not drained: localhost, held by another gpufleet run (its node "
            "lock), so not measured"
        )
        and not lines
    )


@pytest.mark.slow
def test_a_disk_that_fills_during_a_run_keeps_what_was_measured_and_the_run_reaches_history(tmp_path):
    """The reports folder's file system fills once the node's document is written: the run ends with exit 2 and
    its JSON line (not `refused`), naming the full file system and what to do; the document stays, and the next
    run, once there is room, brings the run into the history."""
    no_benchmarks = ("-i", "inventory/local", "-e", '{"gpufleet_benchmarks": []}')
    with tiny_filesystem(tmp_path / "reports", "8m") as reports:
        assert fleet_run(tmp_path, *no_benchmarks, "--run-id", "first")[0].returncode == 1
        document = reports / "full" / "hosts" / "localhost.json"

        def fill_once_measured() -> None:
            wait_for(document.exists, 300, "the node's document", interval_s=0.02)
            fill(reports / "ballast")

        filler = threading.Thread(target=fill_once_measured, daemon=True)
        filler.start()
        proc, line = fleet_run(tmp_path, *no_benchmarks, "--run-id", "full")
        filler.join(60)
        assert proc.returncode == 2 and line["exit"] == 2 and line["status"] != "refused", line
        assert line["nodes"] == {"localhost": "no report"}, line
        assert f"the file system of {reports / 'full'} is full" in line["message"], line
        assert f"`gpufleet report {reports / 'full'}`" in line["message"], line
        assert json.loads(document.read_text())["results"]  # measured, and kept
        assert not rec.running_playbooks(reports / "full")  # nothing of the run goes on without its runner
        (reports / "ballast").unlink()
        proc, line = fleet_run(tmp_path, *no_benchmarks, "--run-id", "next")
        assert proc.returncode == 1, line
        history = cli_json("history", "localhost", "--reports-dir", str(reports), "--json")
        assert [r["run_id"] for r in history["runs"]] == ["first", "full", "next"], history
    assert not left_temporary(tmp_path)


def cli_json(*argv: str) -> dict:
    done = subprocess.run([str(BIN / "gpufleet"), *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_run_refused_for_a_full_disk_leaves_no_folder(tmp_path):
    """The reports folder's file system full before the run: `gpufleet fleet run` is refused (exit 2, its JSON line
    naming the file it could not write and what to do), and leaves nothing in the folder: no run folder holding an
    empty runner/."""
    with tiny_filesystem(tmp_path / "full", "1m") as full:
        (full / "reports").mkdir()
        fill(full / "ballast")
        proc, line = fleet_run(
            tmp_path, "-i", "inventory/local", "--reports-dir", str(full / "reports"), "--run-id", "refused"
        )
        assert proc.returncode == 2 and line["status"] == "refused", (line, proc.stderr[-2000:])
        assert "No space left on device" in line["message"] and "space left" in line["message"], line
        assert not list((full / "reports").iterdir()), list((full / "reports").rglob("*"))


@pytest.mark.slow
def test_a_run_whose_ansible_playbook_alone_is_killed_gives_its_node_lock_back_and_says_so(tmp_path):
    """kill -9 of the run's ansible-playbook while the node is held (its workers die with it; the runner lives on):
    the run ends with exit 2, and its end says the node lock, which the killed playbook could not give back, was given
    back by release.yml; the lock file is gone, so the next run needs no take-over."""
    lock_path, run_dir = tmp_path / "node.lock", tmp_path / "reports" / "killed"
    (tmp_path / "tmp").mkdir()
    runner = subprocess.Popen(
        [str(BIN / "gpufleet"), "fleet", "run", "-i", "inventory/local", "--run-id", "killed", "--reports-dir",
         str(tmp_path / "reports"), "--plain", "--json", "-e", '{"gpufleet_benchmarks": ["matmul"]}', "-e",
         f"gpufleet_lock_path={lock_path}"],
        cwd=REPO, env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", TMPDIR=str(tmp_path / "tmp")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: lock_path.exists() and '"killed"' in lock_path.read_text(), 300, "the node held by the run")
        pids = set(rec.running_playbooks(run_dir))
        [main] = [p for p in pids if runs._proc_stat(p) and runs._proc_stat(p)[0] not in pids]
        os.kill(main, 9)
        out, err = runner.communicate(timeout=600)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, 9)
    line = json.loads(out.splitlines()[-1])
    assert runner.returncode == 2 and line["exit"] == 2, (line, err[-3000:])
    assert "ansible-playbook was killed before it gave its node locks back: they were given back" in line["message"]
    assert not lock_path.exists(), lock_path.read_text()
