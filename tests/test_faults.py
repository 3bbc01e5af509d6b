"""Faults injected into real validate.yml runs, and runs interrupted: nothing measured is lost, nothing is left
running, the fault is named and the run ends non-zero.

The nodes are test hosts of our own (tests/testhosts.py: sshd's in network namespaces, routed to each other);
the benchmarks run on the CPU (gloo), a logic check and never a performance figure. The faults:
- a node's sshd killed while its checks run, another node's engine killed with SIGKILL mid-benchmark, and a
  host document truncated just before the report: one run of three nodes;
- a hung NCCL job across two nodes (one rank stopped with SIGSTOP);
- the controller's reports folder on a tiny filesystem that fills up;
- ansible-playbook interrupted with SIGINT during the node benchmarks, and with SIGTERM while a job runs in
  the background across the nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import playbooks
from testhosts import TestFleet, skip_reason

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ENGINE_MARKS = ("-m gpufleet", "gpufleet.bench", "gpufleet.finetune", "torch.distributed.run")


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(["node-a", "node-b", "node-c"], net=217, tag="gfz") as hosts:
        yield hosts


def start_playbook(fleet: TestFleet, inventory: Path, reports: Path, *extra: str, playbook: str = "validate.yml"):
    """ansible-playbook in the background, its output line by line; (process, run dir, lines read so far)."""
    run_id = f"test-{uuid.uuid4().hex[:10]}"
    env = playbooks.playbook_env(reports, PYTHONUNBUFFERED="1", **fleet.ssh_env())
    proc = playbooks.start_playbook(
        playbook, inventory, *extra, env=env, new_session=True, run_id=run_id, reports=reports
    )
    return proc, reports / run_id


def read_until(proc: subprocess.Popen, lines: list[str], marker: str, timeout_s: float) -> None:
    """Read the playbook's output until a line holds `marker`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return
    raise AssertionError(f"{marker!r} did not appear in the playbook's output:\n{''.join(lines)[-8000:]}")


def finish(proc: subprocess.Popen, lines: list[str], timeout_s: float) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    lines.append(out or "")
    return "".join(lines)


def doc(run_dir: Path, host: str) -> dict:
    return json.loads((run_dir / "hosts" / f"{host}.json").read_text())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:  # gone meanwhile
        return ""


def leftovers(fleet: TestFleet) -> dict:
    """What any run left on the hosts: engine, torchrun and rank processes ('pid command line', to tell which),
    and gpufleet work folders."""
    found = {}
    for name in fleet.names:
        procs = [f"{pid} {_cmdline(pid)}" for pid in fleet.pids(name, *ENGINE_MARKS)]
        folders = sorted(p.name for p in (fleet.root(name) / "tmp").glob("gpufleet-*"))
        if procs or folders:
            found[name] = {"processes": procs, "folders": folders}
    return found


def wait_clean(fleet: TestFleet, timeout_s: float = 180, folders: bool = True) -> dict:
    """What is still left after up to timeout_s (processes alone, with folders=False: a failed benchmark keeps its
    folder). A job stops a heartbeat timeout after its controller went, then takes its grace to end; on a busy
    machine each step takes longer."""
    deadline = time.monotonic() + timeout_s
    left = leftovers(fleet)
    while time.monotonic() < deadline and any(v["processes"] or (folders and v["folders"]) for v in left.values()):
        time.sleep(0.5)
        left = leftovers(fleet)
    return left


def test_a_lost_node_a_killed_engine_and_a_truncated_document_are_each_named(fleet, tmp_path):
    # node-c: its sshd is killed once its soak runs; node-b: its engine is killed mid-soak (each soak runs for as long
    # as it is asked, so there is time to find it); node-a: its document is cut short before the report.
    inventory = fleet.inventory(
        tmp_path / "hosts.yml",
        gpufleet_tier="soak",
        gpufleet_soak_duration_s=3,
        host_vars={"node-b": {"gpufleet_soak_duration_s": 120}, "node-c": {"gpufleet_soak_duration_s": 30}},
    )
    proc, run_dir = start_playbook(fleet, inventory, tmp_path / "reports")
    lines: list[str] = []
    try:
        read_until(proc, lines, "[node-c] gpufleet: benchmarks", 120)
        # Its engine running is what makes the loss fall inside the benchmarks (the line alone may come late).
        fleet.wait_for(lambda: fleet.pids("node-c", "bench soak"), 120, "node-c's soak engine")
        fleet.kill_sshd("node-c")
        fleet.wait_for(lambda: fleet.pids("node-b", "bench soak"), 120, "node-b's soak engine")
        fleet.kill("node-b", "bench soak")
        read_until(proc, lines, "PLAY [Report on the fleet]", 240)
        path = run_dir / "hosts" / "node-a.json"
        path.write_text(path.read_text()[:100])
        out = finish(proc, lines, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-8000:]

    report = json.loads((run_dir / "report.json").read_text())
    nodes = report["nodes"]
    assert set(nodes) == {"node-a", "node-b", "node-c"}
    # node-a: what is left of its document is named, never passed over.
    (bad,) = [r for r in nodes["node-a"]["results"] if r["check"] == "results_file"]
    assert bad["status"] == "error" and "hosts/node-a.json is unreadable" in bad["reason"], bad
    # node-b: the killed engine is an error of its group with the signal; its checks are whole.
    b = doc(run_dir, "node-b")
    assert {r["group"] for r in b["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene"}
    (killed,) = [r for r in b["results"] if r["group"] == "benchmark" and r["status"] == "error"]
    assert "-9" in killed["reason"] or "signal 9" in killed["reason"] or "SIGKILL" in killed["reason"], killed
    # node-c: lost mid-run; what it measured before is kept and the loss is named.
    c = doc(run_dir, "node-c")
    lost = ("UNREACHABLE", "Failed to connect", "did not answer", "Connection", "reached over ssh")
    assert any(r["status"] == "error" and any(w in r["reason"] for w in lost) for r in c["results"]), c["results"]
    assert {h: n["verdict"] for h, n in nodes.items()} == {"node-a": "fail", "node-b": "fail", "node-c": "fail"}
    assert not wait_clean(fleet)


def test_a_hung_nccl_job_stops_both_nodes_within_its_timeout(fleet, tmp_path):
    timeout_s = 90
    inventory = fleet.inventory(
        tmp_path / "hosts.yml", ["node-a", "node-b"], gpufleet_benchmarks=["nccl"], gpufleet_nccl_timeout_s=timeout_s
    )
    proc, run_dir = start_playbook(fleet, inventory, tmp_path / "reports")
    lines: list[str] = []
    try:
        read_until(proc, lines, "Start NCCL across the nodes at once", 300)
        ranks = fleet.wait_for(
            lambda: fleet.pids("node-b", "gpufleet.benchmarks.nccl.nccl_measure --worker"), 60, "node-b's ranks"
        )
        os.kill(ranks[0], signal.SIGSTOP)
        stopped = time.monotonic()
        out = finish(proc, lines, timeout_s + 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-8000:]
    assert time.monotonic() - stopped < timeout_s + 150, out[-5000:]
    for host in ("node-a", "node-b"):
        (nccl,) = [
            r for r in doc(run_dir, host)["results"] if r["group"] == "benchmark_multinode" and r["check"] == "nccl"
        ]
        assert nccl["status"] == "fail" and "timed out" in nccl["reason"], nccl
        # Its checks and its own benchmarks inside the node are whole.
        assert [
            r for r in doc(run_dir, host)["results"] if r["group"] == "benchmark" and r["check"] == "nccl_all_reduce"
        ]
    assert "benchmark_multinode.nccl" in (run_dir / "report.md").read_text()
    # No process is left; a failed benchmark keeps its log folder as evidence, named in its result.
    left = wait_clean(fleet, folders=False)
    assert not any(v["processes"] for v in left.values()), left
    for host, what in left.items():
        named = json.dumps(doc(run_dir, host))
        assert all(folder in named for folder in what["folders"]), (host, what)
        for folder in what["folders"]:  # the next test starts clean
            subprocess.run(["rm", "-rf", str(fleet.root(host) / "tmp" / folder)], check=True)


def test_a_full_reports_filesystem_is_named_and_what_was_written_stays_whole(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tiny filesystem")
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "gpufleet-full", str(full)], check=True)
    try:
        # Room for the run's folder and its host document, not for the reports as well.
        (full / "ballast").write_bytes(b"\0" * (48 * 1024))
        run_id = f"test-{uuid.uuid4().hex[:10]}"
        proc = playbooks.run_playbook(
            "validate.yml",
            "inventory/local",
            "-e",
            '{"gpufleet_benchmarks": []}',
            env=playbooks.playbook_env(tmp_path),
            timeout_s=300,
            run_id=run_id,
            reports=full,
            lock=tmp_path / "node.lock",
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-5000:]
        # The file system's words (a file write) or SQLite's (the store): either way the fault is named.
        assert "No space left on device" in out or "database or disk is full" in out, out[-5000:]
        run_dir = full / run_id
        # Whatever was written is whole: no half file replaced a good one, no temporary file is left.
        for path in run_dir.rglob("*"):
            assert not path.name.startswith("."), path
            if path.suffix == ".json":
                json.loads(path.read_text())
    finally:
        subprocess.run(["umount", str(full)], check=False)


def test_sigint_during_the_node_benchmarks_leaves_nothing_running(fleet, tmp_path):
    # node-a finishes first and writes its document; node-b is interrupted mid-soak.
    inventory = fleet.inventory(
        tmp_path / "hosts.yml",
        ["node-a", "node-b"],
        gpufleet_tier="soak",
        gpufleet_soak_duration_s=2,
        host_vars={"node-b": {"gpufleet_soak_duration_s": 300}},
    )
    proc, run_dir = start_playbook(fleet, inventory, tmp_path / "reports")
    lines: list[str] = []
    try:
        fleet.wait_for(lambda: (run_dir / "hosts" / "node-a.json").exists(), 240, "node-a's document")
        fleet.wait_for(lambda: fleet.pids("node-b", "bench soak"), 120, "node-b's soak")
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends (the foreground group: ansible-playbook's own)
        out = finish(proc, lines, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-5000:]
    assert not wait_clean(fleet)
    # What was written before the interrupt stays whole.
    a = doc(run_dir, "node-a")
    assert {r["group"] for r in a["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene", "benchmark"}


def test_sigterm_while_a_job_runs_across_nodes_stops_it_on_every_node(fleet, tmp_path):
    inventory = fleet.inventory(
        tmp_path / "hosts.yml",
        ["node-a", "node-b"],
        gpufleet_benchmarks=[],
        gpufleet_finetune=True,
        gpufleet_finetune_config="files/configs/tiny-qwen2-lora.yml",
        gpufleet_finetune_max_steps=5000,
        gpufleet_finetune_timeout_s=600,
        gpufleet_finetune_rdzv_timeout_s=60,
        # Well above the gap between two polls of a busy controller (7-8 s measured at a load
        # of 7), so the job runs until the SIGTERM; it stops 30 s + a poll + its grace after.
        gpufleet_lock_heartbeat_timeout_s=30,
    )
    proc, run_dir = start_playbook(fleet, inventory, tmp_path / "reports")
    lines: list[str] = []
    try:
        read_until(proc, lines, "Start the fine-tune on every node at once", 300)
        fleet.wait_for(lambda: fleet.pids("node-b", "gpufleet.finetune.worker"), 120, "node-b's ranks")
        os.kill(proc.pid, signal.SIGTERM)
        finish(proc, lines, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The jobs run in the background on the nodes: they stop once the controller no longer checks on them.
    left = wait_clean(fleet)
    logs = {
        str(log): log.read_text(errors="replace")[-1500:]
        for host, what in left.items()
        for folder in what["folders"]
        for log in (fleet.root(host) / "tmp" / folder).glob("*.log")
    }
    assert not left, (left, logs, "".join(lines)[-3000:])
    for host in ("node-a", "node-b"):  # written before the interrupt, and still whole
        assert {r["group"] for r in doc(run_dir, host)["results"]} >= {"gpu_inventory", "gpu_health"}
