"""One measurement at a time, even when a run's controller is gone (kill -9 of ansible-playbook).

- The node lock of a run whose controller is gone is taken over only once no process of that run still works on the
  node: until then the new run waits (bounded) or is refused, naming the run and its processes, and the old run's
  processes, told to stop through the lock, stop themselves.
- An engine process whose run no longer holds the node does not start.
- A document from a run whose controller is gone is refused, never written nor indexed.
- End to end: ansible-playbook killed with SIGKILL while two nodes (this machine over a local connection, a test
  host over ssh) run their soak; a second run started at once. The first run's engine processes end by themselves
  on both nodes, the second takes each node over only after that, and the first run leaves no host document and
  nothing in the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.base import lock, runs
from gpufleet.base.errors import InputError
from gpufleet.fleet import document_writer
from gpufleet.runner import private
from gpufleet.runner import record as rec
from playbooks import playbook_env, start_playbook
from testhosts import TestFleet, skip_reason
from waiting import left_running, wait_for

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENGINE_MARKS = (b"-m\0gpufleet", b"gpufleet.bench", b"gpufleet.finetune", b"torch.distributed.run")

# An engine-like process of run `old`: its guard watches the lock (GPUFLEET_LOCK, as the node stage and the background
# jobs give it), it measures in a child of its own session, and it ends once that child does. It names the child
# once the child runs its own code: until its exec is through, /proc shows the child no environment to be found by.
ENGINE = textwrap.dedent("""
    import subprocess, sys
    from gpufleet.base import guard
    guard.start_from_env()
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(600)"],
                             start_new_session=True, stdout=subprocess.PIPE)
    guard.track(child)
    child.stdout.readline()
    print(child.pid, flush=True)
    child.wait()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _spec(path: Path, run_id: str) -> str:
    return json.dumps({"path": str(path), "run_id": run_id, "holder": "node-a", "heartbeat_timeout_s": None})


@pytest.mark.slow
def test_a_stale_lock_is_taken_over_only_once_nothing_of_its_run_works_on_the_node(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "old", "node-a", 600)
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, GPUFLEET_LOCK=_spec(path, "old")),
    )
    try:
        child = int(engine.stdout.readline())
        # The controller says run old is gone; its processes are not: refused at once when asked not to wait,
        # naming the run and a process of it, and the record says who waits for them to stop.
        refused = lock.acquire(path, "new", "node-a", 600, dead_runs=["old"], stop_wait_s=0)
        assert not refused["acquired"], refused
        assert "held by run 'old'" in refused["reason"] and "its run was stopped" in refused["reason"], refused[
            "reason"
        ]
        assert "still work on the node" in refused["reason"] and f"pid {engine.pid}" in refused["reason"], refused[
            "reason"
        ]
        assert {p["pid"] for p in refused["working"]} >= {engine.pid, child}
        assert json.loads(path.read_text())["stopping"]["by"] == "new"
        # Waiting: the old run's guard reads the mark and stops what it started, the node is taken over after.
        got = lock.acquire(path, "new", "node-a", 600, dead_runs=["old"], poll_s=0.1, stop_wait_s=300)
        taken_at = time.time()
        assert got["acquired"] and got["stale"]["previous"]["run_id"] == "old", got
        assert {p["pid"] for p in got["stale"]["waited_for"]} >= {engine.pid, child}
        assert not _alive(child) and (engine.poll() is not None or not _alive(engine.pid)), (
            "taken over while old still works"
        )
        assert got["record"]["holders"]["node-a"]["heartbeat_at"] <= taken_at
        assert "stopping" not in json.loads(path.read_text())
    finally:
        engine.kill()
        engine.wait()


def test_an_engine_whose_run_no_longer_holds_the_node_does_not_start(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "new", "node-a", 600)
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "check", "--group", "gpu_inventory", "--json"],
        env=dict(os.environ, GPUFLEET_LOCK=_spec(path, "old")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and json.loads(done.stdout)["status"] == "refused", done  # no document: --json's line
    assert "not run: run 'old' no longer holds the node lock: run 'new'" in done.stderr, done.stderr


def test_a_document_from_a_run_whose_controller_is_gone_is_refused(tmp_path):
    reports = tmp_path / "reports"
    # The controller of the killed run: a process that ran, recorded as run start records one, and is gone.
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ticks = int(Path(f"/proc/{gone.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    controller = dict(runs.controller_identity(), pid=gone.pid, started_ticks=ticks)
    gone.communicate(b"")
    started = runs.start(str(reports), "k1", playbook="validate", hosts=["n0"])
    doc = {"schema_version": 1, "host": "n0", "results": [], "started": "2026-11-20T10:00:00Z", "seconds": 0}
    with pytest.raises(InputError, match=r"the controller of run k1 \(ansible-playbook pid \d+ on .*\) is gone"):
        document_writer.record(Path(started["run_dir"]), "n0", doc, controller=controller)
    assert not list((reports / "k1" / "hosts").iterdir())
    # Its own controller alive (this process), or none named (gpufleet record by hand): written.
    assert document_writer.record(Path(started["run_dir"]), "n0", doc, controller=started["controller"])["path"]


# ---------------------------------------------------------------- kill -9 of ansible-playbook, end to end


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(["node-a"], net=226, tag="gfo") as hosts:
        yield hosts


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _started(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): a pid used again later is another process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class LastSeen:
    """For each pid, a time at which it was still alive (taken before the look that found it alive): a process
    seen alive after a moment T ran after T. Polled until every one is gone."""

    def __init__(self, pids: dict[int, str]):
        self.pids = pids
        self.started = {pid: _started(pid) for pid in pids}
        self.alive_after: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        left = set(self.pids)
        while left:
            for pid in list(left):
                t0 = time.time()
                if _alive(pid) and _started(pid) == self.started[pid]:
                    self.alive_after[pid] = t0
                else:
                    left.discard(pid)
            time.sleep(0.05)

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


@pytest.mark.slow
def test_kill_9_of_ansible_playbook_stops_its_measuring_and_the_next_run_takes_over_after(fleet, tmp_path):
    local_lock = tmp_path / "node.lock"
    remote_lock = "/run/lock/gpufleet-node.lock"
    ssh = {
        "ansible_connection": "ssh",
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(fleet.key),
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o IdentitiesOnly=yes",
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_python_interpreter": sys.executable,
                        "gpufleet_python": str(BIN / "python"),
                        "gpufleet_nccl_multinode": False,
                    },
                    "children": {
                        "gpu_nodes": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "gpufleet_lock_path": str(local_lock),
                                    "gpufleet_node_env": {"OMP_NUM_THREADS": 1},
                                },
                                "node-a": {**ssh, **fleet.host_vars("node-a"), "gpufleet_lock_path": remote_lock},
                            }
                        }
                    },
                }
            }
        )
    )
    reports = tmp_path / "reports"
    env = playbook_env(tmp_path, **fleet.ssh_env())

    def playbook(run_id: str, *extra: str) -> subprocess.Popen:
        return start_playbook(
            "validate.yml", inventory, *extra, env=env, new_session=True, run_id=run_id, reports=reports
        )

    k1_id, k2_id = f"k1-{uuid.uuid4().hex[:6]}", f"k2-{uuid.uuid4().hex[:6]}"
    k1 = playbook(k1_id, "-e", "gpufleet_tier=soak", "-e", "gpufleet_soak_duration_s=600")
    k2 = None
    try:
        # Both nodes in their soak: this machine's under k1's worker, node-a's in its namespace.
        wait_for(lambda: any(b"bench\0soak" in _cmdline(p) for p in _descendants(k1.pid)), 300, "this machine's soak")
        wait_for(lambda: fleet.pids("node-a", "bench soak"), 300, "node-a's soak")
        measuring = {p: "localhost" for p in _descendants(k1.pid) if any(m in _cmdline(p) for m in ENGINE_MARKS)}
        measuring |= {p: "node-a" for p in fleet.pids("node-a") if any(m in _cmdline(p) for m in ENGINE_MARKS)}
        assert set(measuring.values()) == {"localhost", "node-a"}, measuring
        watch = LastSeen(measuring)
        os.kill(k1.pid, signal.SIGKILL)  # ansible-playbook's main process alone: its workers are on their own
        k1.communicate(timeout=60)
        k2 = playbook(k2_id, "-e", '{"gpufleet_benchmarks": []}')
        out2, _ = k2.communicate(timeout=900)
        # k1 stopped measuring by itself, on both nodes.
        assert watch.join(300), {p: _cmdline(p) for p in measuring if _alive(p)}
    finally:
        for proc in (k1, k2):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    for host in ("localhost", "node-a"):
        assert (reports / k2_id / "hosts" / f"{host}.json").exists(), out2[-5000:]
        doc = json.loads((reports / k2_id / "hosts" / f"{host}.json").read_text())
        (taken,) = [r for r in doc["results"] if r["check"] == "node_lock"]
        assert taken["status"] == "pass", (host, taken, out2[-3000:])
        assert (taken["detail"]["stale"] or {}).get("previous", {}).get("run_id") == k1_id, (host, taken)
        took_at = taken["detail"]["record"]["holders"][host]["heartbeat_at"]
        # Nothing of k1 measured on the node after k2 took it.
        late = {p: round(t - took_at, 2) for p, t in watch.alive_after.items() if measuring[p] == host and t > took_at}
        assert not late, (host, late, {p: _cmdline(p)[:120] for p in late})
        assert any(r["group"] == "gpu_inventory" for r in doc["results"])  # k2 measured it
    # k1 left no document, so nothing of it is in the store as a run with figures.
    assert not list((reports / k1_id / "hosts").glob("*.json")), list((reports / k1_id / "hosts").iterdir())
    assert (
        subprocess.run(
            [str(BIN / "gpufleet"), "store", "rebuild", "--reports-dir", str(reports)],
            capture_output=True,
            text=True,
            timeout=300,
        ).returncode
        == 0
    )
    hist = json.loads(
        subprocess.run(
            [str(BIN / "gpufleet"), "history", "localhost", "--reports-dir", str(reports), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
    )
    assert [(r["run_id"], r["document"] == "ok") for r in hist["runs"] if r["run_id"] == k1_id] in (
        [],
        [(k1_id, False)],
    )


# ---------------------------------------------------------------- kill -9 of the runner, `gpufleet fleet run`

SECRETS = {"gpufleet_node_env": {"HF_TOKEN": "hf_not_at_rest_0"}, "ansible_become_password": "not_at_rest_1"}


def _runner(tmp_path: Path, run_id: str) -> subprocess.Popen:
    """`gpufleet fleet run` on this machine (inventory/local), in a process group of its own, with a token and a
    become password among its extra variables."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [
            str(BIN / "gpufleet"),
            "fleet",
            "run",
            "-i",
            "inventory/local",
            "--run-id",
            run_id,
            "--reports-dir",
            str(tmp_path / "reports"),
            "--plain",
            "-e",
            json.dumps({"gpufleet_benchmarks": [], **SECRETS}),
            "-e",
            f"gpufleet_lock_path={tmp_path / 'node.lock'}",
        ],
        cwd=REPO,
        env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", TMPDIR=str(tmp_path / "tmp")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _holding_secrets(folder: Path) -> list[str]:
    """The files under folder that hold a secret value of SECRETS."""
    values = [v.encode() for v in ("hf_not_at_rest_0", "not_at_rest_1")]
    found = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and any(v in path.read_bytes() for v in values):
                found.append(str(path))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("when", ["as ansible-playbook starts", "while the node is measured"])
def test_kill_9_of_the_runner_ends_its_playbook_and_leaves_no_secret_on_disk(tmp_path, when):
    runner = _runner(tmp_path, "killed")
    run_dir = tmp_path / "reports" / "killed"
    lock_path = tmp_path / "node.lock"
    try:

        def ready() -> bool:
            assert runner.poll() is None, "the run ended before it could be killed"
            if when == "as ansible-playbook starts":
                return bool(rec.running_playbooks(run_dir))
            return lock_path.exists() and '"killed"' in lock_path.read_text()

        wait_for(ready, 240, f"the run {when}", interval_s=0.05)
        if when == "while the node is measured":
            # The playbook has read its extra variables: none is on disk while the run measures.
            assert not list((tmp_path / "tmp").glob("gpufleet-vars-*")), list((tmp_path / "tmp").iterdir())
        playbooks = rec.running_playbooks(run_dir)
        assert playbooks, "no ansible-playbook of the run to leave behind"
        os.killpg(
            runner.pid, signal.SIGKILL
        )  # the runner and its process group; ansible-playbook has a session of its own
        runner.wait(timeout=60)
        # The playbook ends with its runner, and what it started on the node with it: it measures and reports no
        # more (headless, it would have gone on to write the node's document and the report).
        wait_for(lambda: not rec.running_playbooks(run_dir), 60, "the killed runner's ansible-playbook to end")
        assert not (run_dir / "report.json").exists() and not (run_dir / "hosts" / "localhost.json").exists()
        assert not left_running(r"-m gpufleet (check|bench|lock|counters|node-stage|run playbook)|node_stage"), "engine"
        # Secrets never outlive the run on disk: the extra variables are gone, with no runner left to remove them.
        wait_for(lambda: not list((tmp_path / "tmp").glob("gpufleet-vars-*")), 30, "the extra variables to be removed")
        assert not _holding_secrets(tmp_path), _holding_secrets(tmp_path)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    [left] = (tmp_path / "tmp").glob("gpufleet-ansible-*")  # Ansible's folder, which the killed runner could not remove
    if when == "as ansible-playbook starts":
        return
    # A process that still uses that folder (as a headless playbook's worker would) keeps it through the next run;
    # once it is gone, the next runner removes the folder.
    user = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(600)"],
        cwd=left,
        env=dict(os.environ, ANSIBLE_LOCAL_TEMP=str(left)),
        stdout=subprocess.PIPE,
    )
    try:
        user.stdout.readline()
        nxt = _runner(tmp_path, "next")
        assert nxt.wait(timeout=600) == 1  # measured (no GPU here: not accepted), the stale lock taken over
        taken = next(
            r
            for r in json.loads((tmp_path / "reports" / "next" / "hosts" / "localhost.json").read_text())["results"]
            if r.get("group") == "lock"
        )
        assert taken["status"] == "pass" and "took over the stale lock of run killed" in taken["reason"], taken
        assert left.is_dir(), "the folder a live process uses was removed"
    finally:
        user.kill()
        user.wait()
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path / "tmp")
    try:
        private.ansible_local_tmp().rmdir()  # the next runner's own, made after the clean-up
    finally:
        tempfile.tempdir = saved
    assert not left.exists()
    assert not _holding_secrets(tmp_path), _holding_secrets(tmp_path)
