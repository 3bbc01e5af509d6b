"""`gpufleet fleet run` and `gpufleet fleet resume` against real ansible-playbook runs over three test hosts of our
own (tests/testhosts.py: sshd's in network namespaces, routed to each other), through ansible-runner.

Two runs, each resumed:
- a full run whose node-b loses its sshd while it is checked: the plain live view (one timestamped line per
  change) is checked line by line; node-b's sshd comes back and the resume runs node-b alone again, node-a and
  node-c joining its run across nodes as peers;
- a run interrupted with SIGINT while node-c still benchmarks: the nodes that finished keep their documents,
  and the resume runs node-c's node stage, then the run across nodes that never came, and nothing else.
The benchmarks run on the CPU (gloo): every node fails acceptance (no GPU), so the exit code is 1 and the
resumes ask for the unfinished only (--only-unfinished): what failed because there is no GPU stays as it is.
The resumes use the playbooks' gpufleet_resume, gpufleet_stages and gpufleet_peers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpufleet.base import registry
from testhosts import TestFleet, skip_reason
from waiting import wait_for

pytest.importorskip("torch")
pytest.importorskip("ansible_runner")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODES = ["node-a", "node-b", "node-c"]
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
NODE_GROUPS = registry.group_names()


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(NODES, net=231, tag="gfr") as hosts:
        yield hosts


def inventory(fleet: TestFleet, path: Path, host_vars: dict | None = None, **group_vars) -> Path:
    # The engine of this checkout on the nodes, wherever the environment's own install points.
    nodes = {
        n: {
            "gpufleet_node_env": dict(fleet.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src")),
            **(host_vars or {}).get(n, {}),
        }
        for n in NODES
    }
    return fleet.inventory(path, host_vars=nodes, gpufleet_benchmarks=[], gpufleet_nccl_timeout_s=90, **group_vars)


def gpufleet(fleet: TestFleet | None, tmp_path: Path, *args: str) -> subprocess.Popen:
    """`gpufleet fleet ARGS --plain` in the background, its output line by line (fleet None: no test hosts)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        TMPDIR=str(tmp_path / "tmp"),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO / "src"),
        **(fleet.ssh_env() if fleet else {}),
    )
    return subprocess.Popen(
        [str(BIN / "gpufleet"), "fleet", *args, "--plain"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until(proc: subprocess.Popen, lines: list[str], predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if predicate(lines[-1]):
            return
    raise AssertionError(f"{what}: not seen in the runner's output:\n" + "\n".join(lines[-80:]))


def finish(proc: subprocess.Popen, lines: list[str], timeout_s: float) -> int:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    lines += (out or "").splitlines()
    return proc.returncode


@contextlib.contextmanager
def ended(proc: subprocess.Popen):
    """The runner, killed with everything it started if the test leaves before it has ended."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def interrupt(proc: subprocess.Popen, lines: list[str]) -> int:
    """Ctrl-C to the runner; its exit status once it has given the locks back and ended (a busy machine takes
    its time over the release playbook)."""
    os.kill(proc.pid, signal.SIGINT)
    return finish(proc, lines, 300)


def run(fleet, tmp_path, *args, timeout_s=400) -> tuple[int, list[str]]:
    proc = gpufleet(fleet, tmp_path, *args)
    lines: list[str] = []
    return finish(proc, lines, timeout_s), lines


def node_lines(lines: list[str], host: str) -> list[tuple[str, str, str]]:
    """(stage, what is under way, verdict) of each of the node's lines, in order."""
    out = []
    for line in lines:
        m = re.fullmatch(rf"{STAMP}  {re.escape(host)} +(\S+) +(.*?) +\d+ s  (.+)", line)
        if m:
            out.append((m.group(1), m.group(2).strip(), m.group(3)))
    return out


def doc(run_dir: Path, host: str) -> dict:
    return json.loads((run_dir / "hosts" / f"{host}.json").read_text())


def node_stage(document: dict) -> list[dict]:
    return [r for r in document["results"] if r["group"] not in ("benchmark_multinode", "fleet")]


def invocations(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "runner" / "runner.json").read_text())["invocations"]


def tasks_run(run_dir: Path, ident: str) -> set[tuple[str, str]]:
    """(host, module) of every task that ran in one invocation, from ansible-runner's events."""
    seen = set()
    for path in (run_dir / "runner" / "artifacts" / ident / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        if event["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            seen.add((data.get("host"), (data.get("resolved_action") or "").rsplit(".", 1)[-1]))
    return seen


def start_sshd(fleet: TestFleet, name: str) -> None:
    """Bring back the sshd kill_sshd stopped (as testhost.sh starts it)."""
    netns = fleet.hosts[name][0]
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "chroot",
            str(fleet.root(name)),
            "/usr/sbin/sshd",
            "-f",
            "/etc/ssh/sshd_config_gpufleet_testhost",
        ],
        check=True,
        env=dict(os.environ, PATH=f"{os.environ['PATH']}:/usr/sbin"),
    )
    fleet.wait_for(
        lambda: (
            subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/{fleet.address(name)}/22"], capture_output=True).returncode
            == 0
        ),
        60,
        f"{name}'s sshd back",
    )


def files_holding(folder: Path, *secrets: str) -> list[str]:
    """Every file under folder that holds one of the secrets, as text or in JSON's escapes."""
    needles = [s.encode() for s in secrets]
    return [str(p) for p in folder.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


def test_a_full_run_shows_each_node_live_and_a_lost_node_is_run_again_alone_with_peers(fleet, tmp_path):
    run_id = f"full-{uuid.uuid4().hex[:8]}"
    reports = tmp_path / "reports"
    # A token in every node's environment (the inventory) and another passed with -e: neither may reach a file of
    # the run folder (runner.json, ansible-runner's command, env/ and events, the reports).
    node_token, var_token = f"node-token-{uuid.uuid4().hex}", f"var-token-{uuid.uuid4().hex}"
    # node-b benchmarks its memory (seconds on the CPU): it is lost meanwhile, after its checks.
    inv = inventory(
        fleet,
        tmp_path / "hosts.yml",
        host_vars={
            n: {
                "gpufleet_node_env": dict(
                    fleet.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"), SITE_TOKEN=node_token
                ),
                **({"gpufleet_benchmarks": ["memory"]} if n == "node-b" else {}),
            }
            for n in NODES
        },
    )
    proc = gpufleet(
        fleet,
        tmp_path,
        "run",
        "-i",
        str(inv),
        "--reports-dir",
        str(reports),
        "--run-id",
        run_id,
        "-e",
        f"site_api_token={var_token}",
    )
    lines: list[str] = []
    with ended(proc):
        read_until(proc, lines, lambda line: re.search(r"  node-b +benchmarks ", line), 180, "node-b's benchmarks")
        fleet.kill_sshd("node-b")
        rc = finish(proc, lines, 400)
    out = "\n".join(lines)
    run_dir = reports / run_id
    assert rc == 1, out  # no GPU: no node accepted

    # Every line is timestamped; the first says what runs where, the last how it ended.
    assert all(re.match(STAMP + "  ", line) for line in lines), out
    assert lines[0].endswith(
        f"run {run_id}: run (validate.yml, checkout {REPO}) on 3 node(s): node-a, node-b, node-c"
    ), out
    assert lines[-1].endswith(
        f"run {run_id}: 3 of 3 node(s) not accepted: node-a, node-b, node-c; report: {run_dir / 'report.md'}"
    ), out
    # Above it, why: each node's worst cause (its first check, how many more give that reason, the reason once), then
    # the other causes by name.
    for line, host in zip(lines[-4:-1], NODES):
        assert re.fullmatch(
            rf"{STAMP}    {host}: (error|fail) [a-z_]+\.[a-z_0-9]+( and \d+ more check\(s\) with the same "
            rf"reason)?: \S.*",
            line,
        ), out
    assert not files_holding(run_dir, node_token, var_token)
    assert stat.S_IMODE(run_dir.stat().st_mode) == stat.S_IMODE((run_dir / "runner").stat().st_mode) == 0o750
    for host in ("node-a", "node-c"):
        seen = node_lines(lines, host)
        stages = [s for s, _, _ in seen]
        # In order, each stage once it runs: locked (the first thing asked of the node), checked (the groups of one
        # task), across the nodes, reported.
        assert stages[0] == "lock" and stages[-1] == "done", out
        checks = list(dict.fromkeys(what for s, what, _ in seen if s == "checks"))
        assert checks == [", ".join(NODE_GROUPS)], out
        assert ("checks", ", ".join(NODE_GROUPS), "so far error") in seen, out  # no GPU: the checks erred
        assert "cross-node" in stages and stages.index("cross-node") > stages.index("checks"), out
        assert seen[-1] == ("done", "", "not accepted"), out
        # One line per change: never the same line twice in a row.
        assert all(a != b for a, b in zip(seen, seen[1:])), out
    lost = node_lines(lines, "node-b")
    assert any(v == "so far unreachable" for _, _, v in lost), out
    assert lost[-1] == ("done", "", "not accepted"), out

    (first,) = invocations(run_dir)
    assert first["command"] == "run" and first["exit"] == 1 and not first["interrupted"] and first["ended"]
    assert first["hosts"] == NODES and first["extravars"] == {} and first["limit"] is None
    assert first["extravars_withheld"] == ["site_api_token"]
    artifacts = run_dir / "runner" / "artifacts" / "001-run"
    assert (artifacts / "stdout").stat().st_size > 0 and list((artifacts / "job_events").glob("*.json"))
    report = json.loads((run_dir / "report.json").read_text())
    assert {h: report["nodes"][h]["verdict"] for h in NODES} == {h: "fail" for h in NODES}
    b_before = doc(run_dir, "node-b")
    assert any(r["status"] == "error" and r["check"] in ("engine", "reachable") for r in b_before["results"]), b_before
    kept = {h: doc(run_dir, h) for h in ("node-a", "node-c")}

    # node-b answers again: the resume runs it alone, node-a and node-c (finished) joining its NCCL run as peers.
    start_sshd(fleet, "node-b")
    rc, lines = run(fleet, tmp_path, "resume", run_id, "--reports-dir", str(reports), "--only-unfinished")
    assert rc == 2 and "give it again with -e" in lines[-1] and "site_api_token" in lines[-1], lines
    rc, lines = run(
        fleet,
        tmp_path,
        "resume",
        run_id,
        "--reports-dir",
        str(reports),
        "--only-unfinished",
        "--json",
        "-e",
        f"site_api_token={var_token}",
    )
    out = "\n".join(lines)
    assert rc == 1, out
    ending = json.loads(lines.pop())  # --json: the same ending, with why
    assert set(ending["why"]) == set(NODES) and all(ending["why"][h][0]["reason"] for h in NODES), ending
    assert not files_holding(run_dir, node_token, var_token)
    assert any(
        line.endswith("  step 1: --limit node-b, stages node, multinode, peers node-a, node-c") for line in lines
    ), out
    assert lines[-1].endswith(
        f"run {run_id}: resumed; 3 of 3 node(s) not accepted: node-a, node-b, node-c; report: {run_dir / 'report.md'}"
    ), out
    second = invocations(run_dir)[1]
    assert (second["command"], second["limit"], second["stages"], second["peers"]) == (
        "resume",
        ["node-b"],
        ["node", "multinode"],
        ["node-a", "node-c"],
    )
    b_after = doc(run_dir, "node-b")
    assert not [r for r in b_after["results"] if r["status"] == "error" and r["check"] in ("engine", "reachable")], (
        b_after
    )
    assert {r["group"] for r in node_stage(b_after)} >= set(NODE_GROUPS)
    # Nothing that finished ran again: node-a's and node-c's documents are as they were, and no check ran on them.
    assert {h: doc(run_dir, h) for h in ("node-a", "node-c")} == kept
    ran = tasks_run(run_dir, second["ident"])
    assert not {(h, m) for h, m in ran if h in ("node-a", "node-c") and m in NODE_GROUPS}, ran
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert len(attempts) == 2 and attempts[1]["stages"] == ["node", "multinode"], attempts
    # node-b's run across nodes took node-a and node-c as peers; their figures go to peers/, their own documents
    # untouched.
    mn = [r for r in b_after["results"] if r["group"] == "benchmark_multinode" and r["check"] == "nccl_all_reduce"]
    assert mn and set(mn[0]["detail"]["multinode"]["members"]) == set(NODES), b_after
    for peer in ("node-a", "node-c"):
        peer_doc = json.loads((run_dir / "peers" / f"{peer}.json").read_text())
        assert [r for r in peer_doc["results"] if r["group"] == "benchmark_multinode"], peer_doc


def test_an_interrupted_run_keeps_what_finished_and_resumes_only_what_did_not(fleet, tmp_path):
    run_id = f"int-{uuid.uuid4().hex[:8]}"
    reports = tmp_path / "reports"
    run_dir = reports / run_id
    # node-c benchmarks memory and NCCL inside the node (seconds on the CPU): the run is interrupted meanwhile.
    inv = inventory(fleet, tmp_path / "hosts.yml", host_vars={"node-c": {"gpufleet_benchmarks": ["memory", "nccl"]}})
    # A token passed with -e: neither the run nor the release after the interrupt may write it into the run folder.
    token = f"var-token-{uuid.uuid4().hex}"
    proc = gpufleet(
        fleet,
        tmp_path,
        "run",
        "-i",
        str(inv),
        "--reports-dir",
        str(reports),
        "--run-id",
        run_id,
        "-e",
        f"site_api_token={token}",
    )
    lines: list[str] = []
    with ended(proc):
        read_until(proc, lines, lambda line: re.search(r"  node-c +benchmarks ", line), 180, "node-c's benchmarks")
        fleet.wait_for(
            lambda: all((run_dir / "hosts" / f"{h}.json").exists() for h in ("node-a", "node-b")),
            240,
            "the documents of node-a and node-b",
        )
        assert not (run_dir / "hosts" / "node-c.json").exists()
        rc = interrupt(proc, lines)
    out = "\n".join(lines)
    assert rc == 130, out
    assert lines[-1].endswith(
        f"run {run_id}: interrupted; the documents of node-a, node-b are in {run_dir / 'hosts'}. "
        f"Go on with: gpufleet fleet resume {run_id} --reports-dir {reports}"
    ), out
    (first,) = invocations(run_dir)
    assert first["interrupted"] and first["exit"] == 130 and first["status"] == "interrupted" and first["ended"]
    assert first["last_stage"]["node-c"] == "benchmarks", first
    assert (run_dir / "runner" / "artifacts" / f"{first['ident']}-release").is_dir(), "the locks were given back"
    assert not files_holding(run_dir, token)
    assert not (run_dir / "hosts" / "node-c.json").exists()
    kept = {h: node_stage(doc(run_dir, h)) for h in ("node-a", "node-b")}
    assert all(kept.values())

    # Dry run first: node-c's node stage, then the run across the nodes that never came.
    again = ("-e", f"site_api_token={token}")
    rc, lines = run(
        fleet, tmp_path, "resume", run_id, "--reports-dir", str(reports), "--only-unfinished", "--dry-run", *again
    )
    out = "\n".join(lines)
    assert rc == 0, out
    assert [line.split("  ", 1)[1] for line in lines] == [
        f"run {run_id}: 3 node(s) to run again",
        "  node-a: multinode: it was cut off before this stage",
        "  node-b: multinode: it was cut off before this stage",
        "  node-c: node: no host document: its node stage did not finish; multinode: runs again with its node stage",
        "  step 1: --limit node-c, stages node",
        "  step 2: --limit node-a,node-b,node-c, stages multinode",
    ], out
    assert len(invocations(run_dir)) == 1, "a dry run runs nothing"

    rc, lines = run(fleet, tmp_path, "resume", run_id, "--reports-dir", str(reports), "--only-unfinished", *again)
    out = "\n".join(lines)
    assert rc == 1, out
    _, second, third = invocations(run_dir)
    assert (second["limit"], second["stages"], third["limit"], third["stages"]) == (
        ["node-c"],
        ["node"],
        NODES,
        ["multinode"],
    )
    # Every result kept; nothing that finished ran twice.
    for host, results in kept.items():
        assert node_stage(doc(run_dir, host)) == results
    ran = tasks_run(run_dir, second["ident"]) | tasks_run(run_dir, third["ident"])
    assert not {(h, m) for h, m in ran if h in ("node-a", "node-b") and m in NODE_GROUPS + ("gpu_counters",)}, ran
    c = doc(run_dir, "node-c")
    assert {r["group"] for r in c["results"]} >= set(NODE_GROUPS) | {"benchmark", "benchmark_multinode"}
    for host in NODES:
        mn = [
            r
            for r in doc(run_dir, host)["results"]
            if r["group"] == "benchmark_multinode" and r["check"] == "nccl_all_reduce"
        ]
        assert mn and mn[0]["detail"]["multinode"]["members"] == NODES, (host, doc(run_dir, host)["results"])
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert [a.get("stages") for a in attempts] == [None, ["node"], ["multinode"]], attempts
    report = json.loads((run_dir / "report.json").read_text())
    assert set(report["nodes"]) == set(NODES)


def test_a_variable_refused_before_any_node_is_could_not_run(tmp_path):
    """No test hosts needed: the playbook stops on the controller, and the runner says why (exit 2)."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    proc = subprocess.run(
        [
            str(BIN / "gpufleet"),
            "fleet",
            "run",
            "-i",
            "inventory/local",
            "--reports-dir",
            str(tmp_path),
            "--run-id",
            "bad",
            "-e",
            '{"gpufleet_benchmark_depth": "bogus"}',
            "--json",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    # --json: the JSON alone on stdout, with one exit field; the view's lines, the reason among them, on stderr.
    assert (
        "could not run: Check every node's variables: gpufleet_benchmark_depth for localhost must be "
        'quick or thorough; got "bogus"'
    ) in proc.stderr, out
    summary = json.loads(proc.stdout)
    assert summary["exit"] == 2 and summary["nodes"] == {"localhost": "no report"}
    assert [k for k in summary if k in ("exit", "rc", "returncode", "exit_code")] == ["exit"], summary
    assert not (tmp_path / "bad").exists()  # a failed start leaves no run folder; the run id stays free


def test_an_interrupted_run_gives_its_node_locks_back(tmp_path):
    # On this machine (inventory/local), with a lock file of the test's own: the runner, stopped with SIGINT once
    # the run holds the node, gives the lock back before it ends (a bare ansible-playbook cannot: its next run takes
    # the node over at once, tests/test_playbook_validate.py).
    lock_path = tmp_path / "node.lock"
    proc = gpufleet(
        None,
        tmp_path,
        "run",
        "-i",
        "inventory/local",
        "--run-id",
        "stopped",
        "--reports-dir",
        str(tmp_path / "reports"),
        "-e",
        '{"gpufleet_benchmarks": []}',
        "-e",
        f"gpufleet_lock_path={lock_path}",
    )
    lines: list[str] = []

    def taken() -> bool:
        if lock_path.exists() and '"stopped"' in lock_path.read_text():
            return True
        assert proc.poll() is None, "the run ended before it took the node lock"
        return False

    with ended(proc):
        wait_for(taken, 240, "the run to take the node lock", interval_s=0.2)
        rc = interrupt(proc, lines)
    out = "\n".join(lines)
    assert rc == 130, out
    assert not lock_path.exists(), out + "\n" + lock_path.read_text()
    assert "could not be given back" not in out, out
    # Ansible's temporary folders go with the run, although ansible-playbook was stopped before it could remove them.
    left = [*(tmp_path / "ansible-tmp").glob("ansible-local-*"), *(tmp_path / "tmp").glob("gpufleet-ansible-*")]
    assert not left, left
