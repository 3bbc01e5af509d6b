"""The fleet layer through real validate.yml runs over three test hosts of our own (tests/testhosts.py: sshd's in
network namespaces, routed to each other): run history, baselines and node replacement with known-good peers.

One test, three real runs in a row, so that each scenario costs no run of its own:
1. a run over node-a, node-b and node-c, made the baseline (gpufleet_baseline_set);
2. the same run id again: refused on the controller, before any node is touched, naming gpufleet_run_id, and the
   first run's folder keeps every byte;
   then a host document of run 1 is cut short: `gpufleet store rebuild` and `gpufleet report` name the file, and
   the run stays in the history;
3. garbage written over the store, then the replacement run `--limit node-c` with node-a and node-b as peers,
   node-b's sshd stopped: the store is moved aside and rebuilt (the report says so, the baseline is back); node-c's checks
   run, its NCCL run across nodes has node-a and node-c as members and names node-b as left out, node-a's figures
   go to peers/node-a.json (and into the report, beside node-c's), its own documents stay as they were, and node-c
   is compared with the baseline (run 1); node-a still held the lock of a run killed elsewhere on this controller:
   taken over and said so. The history of node-a shows both runs.
The benchmarks run on the CPU (gloo): every node fails acceptance (no GPU), a logic check, never a performance
figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpufleet.base import lock, registry
from gpufleet.base.runs import controller_identity
from playbooks import validate_on
from testhosts import TestFleet, skip_reason

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODES = ["node-a", "node-b", "node-c"]
NODE_GROUPS = set(registry.group_names())


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(NODES, net=233, tag="gfp") as hosts:
        yield hosts


def playbook(fleet: TestFleet, inventory: Path, reports: Path, run_id: str, *extra: str) -> tuple[int, str]:
    return validate_on(fleet, inventory, reports, run_id, *extra, timeout_s=420)


def gpufleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "python"), "-m", "gpufleet", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )


def doc(path: Path) -> dict:
    return json.loads(path.read_text())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fleet_result(report: dict, host: str, check: str) -> dict:
    (res,) = [r for r in report["nodes"][host]["results"] if r["group"] == "fleet" and r["check"] == check]
    return res


def test_baseline_reused_run_id_corrupt_document_and_a_replacement_run_with_a_peer(fleet, tmp_path):
    reports = tmp_path / "reports"
    # The engine of this checkout on the nodes, wherever the environment's own install points.
    nodes = {
        n: {"gpufleet_node_env": dict(fleet.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"))}
        for n in NODES
    }
    inventory = fleet.inventory(
        tmp_path / "hosts.yml",
        host_vars=nodes,
        gpufleet_benchmarks=[],
        gpufleet_tier="acceptance",
        gpufleet_nccl_timeout_s=90,
    )
    first, third = f"base-{uuid.uuid4().hex[:8]}", f"repl-{uuid.uuid4().hex[:8]}"
    run1 = reports / first

    # ---- 1. every node, made the baseline
    rc, out = playbook(fleet, inventory, reports, first, "-e", "gpufleet_baseline_set=true")
    assert rc != 0, out[-6000:]  # no GPU: no node accepted
    assert "Fail when a node was not accepted" in out, out[-6000:]
    assert sorted(p.name for p in (run1 / "hosts").iterdir()) == [f"{n}.json" for n in NODES]
    assert not (run1 / "peers").exists()
    for host in NODES:
        mn = [
            r
            for r in doc(run1 / "hosts" / f"{host}.json")["results"]
            if r["group"] == "benchmark_multinode" and r["check"] == "nccl_all_reduce"
        ]
        assert (
            mn and mn[0]["detail"]["multinode"]["members"] == NODES and mn[0]["detail"]["multinode"]["peers"] == []
        ), mn
    shown = gpufleet("baseline", "show", "--json", "--reports-dir", str(reports))
    assert shown.returncode == 0 and json.loads(shown.stdout)["run_id"] == first, shown.stdout + shown.stderr
    kept = snapshot(run1)

    # ---- 2. the same run id again: refused before any node is touched; run 1 keeps every byte
    rc, out = playbook(fleet, inventory, reports, first)
    assert rc != 0, out[-6000:]
    assert "gpufleet_run_id" in out and first in out, out[-6000:]
    assert "Check that the node answers" not in out, out[-6000:]
    assert snapshot(run1) == kept

    # A host document of run 1 cut short between runs: named, and the run stays in the store.
    (run1 / "hosts" / "node-b.json").write_text(kept["hosts/node-b.json"].decode()[:100])
    rebuilt = gpufleet("store", "rebuild", "--reports-dir", str(reports), "--json")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    summary = json.loads(rebuilt.stdout)
    assert first in summary["runs"] and summary["baseline"] == first, summary
    (bad,) = summary["unreadable"]
    assert (bad["run_id"], bad["host"]) == (first, "node-b") and bad["reason"], bad
    reported = gpufleet("report", str(run1), "--json")
    again = doc(run1 / "report.json")
    (named,) = [r for r in again["nodes"]["node-b"]["results"] if r["check"] == "results_file"]
    assert named["status"] == "error" and "hosts/node-b.json is unreadable" in named["reason"], (named, reported.stderr)
    assert set(again["nodes"]) == set(NODES)

    # ---- 3. node-c replaced: it runs alone, node-a joins its NCCL run as a known-good peer; node-b, the other peer
    # asked for, does not answer and is left out, named
    fleet.kill_sshd("node-b")
    # Garbage written over the store between runs: the run moves it aside, rebuilds the store from the run
    # folders (the baseline back from baseline.json) and says so in its report.
    db = reports / "gpufleet.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"garbage over the store " * 100)
    # node-a still carries the lock of a run killed from another reports folder of this controller: the
    # controller says that run's ansible-playbook is gone, so the peer is taken over, and that is said.
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock.acquire(
        fleet.root("node-a") / "run" / "lock" / "gpufleet-node.lock",
        "killed-elsewhere",
        "node-a",
        3600,
        controller=dict(controller_identity(), pid=gone.pid),
    )
    rc, out = playbook(
        fleet,
        inventory,
        reports,
        third,
        "--limit",
        "node-c",
        "-e",
        json.dumps({"gpufleet_peers": ["node-a", "node-b"]}),
    )
    run3 = reports / third
    assert rc != 0 and "Fail when a node was not accepted" in out, out[-6000:]
    assert sorted(p.name for p in (run3 / "hosts").iterdir()) == ["node-c.json"], out[-6000:]
    c = doc(run3 / "hosts" / "node-c.json")
    assert {r["group"] for r in c["results"]} >= NODE_GROUPS
    mn = [r for r in c["results"] if r["group"] == "benchmark_multinode" and r["check"] == "nccl_all_reduce"]
    assert mn, c["results"]
    info = mn[0]["detail"]["multinode"]
    assert (info["members"], info["master"], info["node_rank"], info["peers"]) == (
        ["node-a", "node-c"],
        "node-a",
        1,
        ["node-a"],
    ), info
    assert list(info["left_out"]) == ["node-b"] and "did not answer" in info["left_out"]["node-b"], info
    assert list(info["peers_taken_over"]) == ["node-a"], info
    assert info["peers_taken_over"]["node-a"].startswith(
        "took over the stale lock of run killed-elsewhere: its run was stopped"
    ), info
    assert sorted(p.name for p in (run3 / "peers").iterdir()) == ["node-a.json"]
    peer = doc(run3 / "peers" / "node-a.json")
    assert peer["host"] == "node-a"
    assert {r["group"] for r in peer["results"]} == {"benchmark_multinode"}, peer[
        "results"
    ]  # no node stage on the peer
    (peer_mn,) = [r for r in peer["results"] if r["check"] == "nccl_all_reduce"]
    # Each rank times the same collectives: the peer's figure beside the new node's.
    assert (
        peer_mn["detail"]["multinode"]["node_rank"] == 0 and peer_mn["value"] > 0 and peer_mn["unit"] == mn[0]["unit"]
    ), peer_mn
    # The peer's own documents are never touched; its lock was given back (a later run can take it).
    assert snapshot(run1)["hosts/node-a.json"] == kept["hosts/node-a.json"]
    assert (fleet.root("node-a") / "run" / "lock").is_dir()  # where its lock was taken
    assert not (fleet.root("node-a") / "run" / "lock" / "gpufleet-node.lock").exists()
    # Compared with the baseline: run 1.
    report = doc(run3 / "report.json")
    assert set(report["nodes"]) == {"node-c"}
    assert report["fleet"]["baseline"]["run_id"] == first, report["fleet"]["baseline"]
    (aside,) = reports.glob("gpufleet.db.damaged-*")
    assert aside.read_bytes() == b"garbage over the store " * 100
    (problem,) = report["fleet"]["store_problems"]
    assert (
        f"moved aside to {aside}" in problem
        and f"rebuilt by run {third}" in problem
        and f"baseline {first} restored" in problem
    ), problem
    vs = fleet_result(report, "node-c", "node_vs_baseline")
    assert first in json.dumps(vs), vs
    # The peer's figures of the run across nodes are shown beside node-c's, and judge nothing.
    assert [r["check"] for r in report["peers"]["node-a"]["results"]] == [r["check"] for r in peer["results"]]
    md = (run3 / "report.md").read_text()
    assert "## Peers" in md and "| node-a | `benchmark_multinode.nccl_all_reduce` |" in md, md[-3000:]

    history = gpufleet("history", "node-a", "--reports-dir", str(reports), "--json")
    assert history.returncode == 0, history.stdout + history.stderr
    runs = {r["run_id"]: r["role"] for r in json.loads(history.stdout)["runs"]}
    assert runs == {first: "node", third: "peer"}, runs
