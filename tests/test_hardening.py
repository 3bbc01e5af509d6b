"""Safe names and paths, the run record, the node lock and the guard that leaves nothing behind on a node.

Real files, real processes and real signals; nothing here needs a GPU or a network.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpufleet.base import guard, lock, paths, runs
from gpufleet.base.errors import InputError
from waiting import wait_for

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- names and paths


@pytest.mark.parametrize("name", ["run-1", "20261123T101500Z", "after_reimage.2", "node-a", "A" * 128])
def test_plain_names_are_accepted(name):
    assert paths.safe_name(name, "gpufleet_run_id") == name


@pytest.mark.parametrize("name", ["../../somewhere", "a/b", ".hidden", "", "x" * 129, "run id", "r\n1", "..", "ü"])
def test_names_that_are_not_plain_are_refused_naming_the_variable(name):
    with pytest.raises(InputError, match="gpufleet_run_id"):
        paths.safe_name(name, "gpufleet_run_id")


def test_a_path_that_leaves_its_folder_is_refused(tmp_path):
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "out").symlink_to(tmp_path.parent)
    assert paths.inside(tmp_path, "inside", what="x") == (tmp_path / "inside").resolve()
    for parts in (("..", "elsewhere"), ("inside", "out", "x"), ("/etc",)):
        with pytest.raises(InputError, match=f"outside {tmp_path.resolve()}"):
            paths.inside(tmp_path, *parts, what="the run folder")


def test_files_are_written_whole_and_private(tmp_path):
    target = tmp_path / "doc.json"
    paths.write_atomic(target, "first\n")
    paths.write_atomic(target, "second\n")
    assert target.read_text() == "second\n"
    assert stat.S_IMODE(target.stat().st_mode) == paths.FILE_MODE
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]  # no temporary file left
    folder = paths.make_dir(tmp_path / "run")
    assert stat.S_IMODE(folder.stat().st_mode) == paths.DIR_MODE
    nested = paths.make_dir(tmp_path / "reports" / "r1" / "runner" / "env")  # every missing parent too, not 0755
    for f in (nested, *list(nested.parents)[:3]):
        assert stat.S_IMODE(f.stat().st_mode) == paths.DIR_MODE, f
    with pytest.raises(InputError, match=f"cannot create {target}"):
        paths.make_dir(target)
    with pytest.raises(InputError, match=f"cannot write {tmp_path / 'missing' / 'x.json'}"):
        paths.write_atomic(tmp_path / "missing" / "x.json", "x")


# ---------------------------------------------------------------- the run record


def test_a_run_id_names_one_run_and_a_resume_adds_an_attempt(tmp_path):
    first = runs.start(str(tmp_path), "r1", playbook="validate", hosts=["node-a", "node-b"], tier="acceptance")
    assert first["attempt"] == 1 and not first["resumed"]
    assert Path(first["run_dir"]) == tmp_path / "r1" and (tmp_path / "r1" / "hosts").is_dir()
    with pytest.raises(InputError, match="gpufleet_run_id 'r1' is already used by the run in .* never overwritten"):
        runs.start(str(tmp_path), "r1", playbook="validate", hosts=["node-a"])
    again = runs.start(
        str(tmp_path), "r1", playbook="validate", hosts=["node-b"], resume=True, limit="node-b", stages=["multinode"]
    )
    assert again["attempt"] == 2 and again["resumed"]
    doc = runs.read_run(tmp_path / "r1")
    assert [a["attempt"] for a in doc["attempts"]] == [1, 2]
    assert doc["attempts"][1]["limit"] == "node-b" and doc["attempts"][1]["stages"] == ["multinode"]
    assert doc["hosts"] == ["node-a", "node-b"]
    with pytest.raises(InputError, match="no run 'r9' .* to resume"):
        runs.start(str(tmp_path), "r9", playbook="validate", hosts=[], resume=True)


@pytest.mark.parametrize(
    "run_id, host, message",
    [
        ("../../somewhere", "node-a", "gpufleet_run_id '../../somewhere' is not a plain name"),
        ("r1", "node/../../x", "the inventory host name 'node/../../x' is not a plain name"),
    ],
)
def test_names_that_would_leave_the_reports_folder_are_refused(tmp_path, run_id, host, message):
    with pytest.raises(InputError, match=message.replace(".", r"\.").replace("(", r"\(")):
        runs.start(str(tmp_path / "reports"), run_id, playbook="validate", hosts=[host])
    assert not (tmp_path / "somewhere").exists() and not (tmp_path / "x").exists()


def test_a_run_whose_controller_is_gone_is_known_dead_and_a_finished_one_is_not(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = runs.start(str(tmp_path), "killed", playbook="validate", hosts=["n"])
    record = runs.read_run(tmp_path / "killed")
    # As if an ansible-playbook process now gone had run it on this controller.
    record["attempts"][0]["controller"] = dict(started["controller"], pid=gone.pid)
    (tmp_path / "killed" / "run.json").write_text(json.dumps(record))
    runs.start(str(tmp_path), "done", playbook="validate", hosts=["n"])
    record = runs.read_run(tmp_path / "done")
    record["attempts"][0]["controller"] = dict(started["controller"], pid=gone.pid)
    (tmp_path / "done" / "run.json").write_text(json.dumps(record))
    runs.finish(tmp_path / "done", "pass")
    # Still running: this test's own process is the controller of the third.
    runs.start(str(tmp_path), "alive", playbook="validate", hosts=["n"])
    assert runs.dead_runs(tmp_path) == ["killed"]
    assert runs.start(str(tmp_path), "next", playbook="validate", hosts=["n"])["dead_runs"] == ["killed"]


# ---------------------------------------------------------------- the node lock


def test_one_run_holds_a_node_and_a_second_is_told_which(tmp_path):
    path = tmp_path / "node.lock"
    ctl = {"host": "ctl", "pid": 1}
    got = lock.acquire(path, "r1", "node-a", 600, controller=ctl)
    assert got["acquired"] and got["stale"] is None
    # The same run again, another inventory host of the same machine: joined.
    assert lock.acquire(path, "r1", "node-b", 600)["acquired"]
    other = lock.acquire(path, "r2", "node-a", 600)
    assert not other["acquired"]
    assert (
        "the node is held by run 'r1' (controller ctl, pid 1)" in other["reason"]
        and "node-a, node-b" in other["reason"]
    )
    assert lock.release(path, "r1", "node-a")["released"]
    assert not lock.acquire(path, "r2", "node-a", 600)["acquired"]  # node-b still holds it for r1
    assert lock.release(path, "r1", "node-b")["released"]
    assert not path.exists()
    assert lock.acquire(path, "r2", "node-a", 600)["acquired"]


@pytest.mark.parametrize(
    "how, says",
    [
        ("expired", "its lease expired at"),
        ("dead", "its run was stopped: the controller's ansible-playbook process for it is gone"),
        ("rebooted", "the node rebooted since it was taken"),
    ],
)
def test_a_stale_lock_is_taken_over_and_said_so(tmp_path, how, says):
    path = tmp_path / "node.lock"
    lock.acquire(path, "old", "node-a", 0.01 if how == "expired" else 600)
    if how == "rebooted":
        rec = json.loads(path.read_text())
        rec["boot_id"] = "another-boot"
        path.write_text(json.dumps(rec))
    time.sleep(0.05)
    got = lock.acquire(path, "new", "node-a", 600, dead_runs=["old"] if how == "dead" else [])
    assert got["acquired"], got
    assert got["stale"]["previous"]["run_id"] == "old" and says in got["stale"]["reason"]


def test_a_lock_of_this_controller_is_never_stale_by_its_lease_alone(tmp_path):
    # This controller can tell whether its own run still goes (dead_runs); another's it can only judge by the lease.
    path = tmp_path / "node.lock"
    lock.acquire(path, "old", "node-a", 0.01, controller={"host": "ctl", "pid": 1})
    time.sleep(0.05)
    held = lock.acquire(path, "new", "node-a", 600, controller={"host": "ctl", "pid": 2})
    assert not held["acquired"] and "held by run 'old'" in held["reason"] and "lease" not in held["reason"]
    other = lock.acquire(path, "new", "node-a", 600, controller={"host": "elsewhere", "pid": 2})
    assert other["acquired"] and "its lease expired at" in other["stale"]["reason"]


def test_a_run_waits_for_the_node_when_asked_and_no_longer(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "r1", "node-a", 600)
    refused = lock.acquire(path, "r2", "node-a", 600, wait_s=0.3, poll_s=0.05)
    assert not refused["acquired"] and "held by run 'r1'" in refused["reason"] and "waited" in refused["reason"]
    got = {}
    waiter = threading.Thread(
        target=lambda: got.update(lock.acquire(path, "r2", "node-a", 600, wait_s=300, poll_s=0.05))
    )
    waiter.start()
    lock.release(path, "r1", "node-a")
    waiter.join(timeout=300)
    assert got["acquired"] and got["stale"] is None and got["waited_s"] < 300


def test_the_controller_is_the_outermost_ansible_playbook_process(tmp_path):
    # ansible-playbook forks a worker (same command line) per task, and the worker starts the module: the run's
    # controller is the main process, which lives as long as the run, never the worker.
    nest = tmp_path / "nest.py"
    nest.write_text(
        textwrap.dedent("""\
        import json, subprocess, sys
        from gpufleet.base import runs
        n = int(sys.argv[1])
        if n == 0:
            print(json.dumps(runs.controller_identity()))  # the module, under the worker
        else:
            subprocess.run([sys.executable, sys.argv[0], str(n - 1)] + (["ansible-playbook"] if n > 1 else []), check=True)
        """)
    )
    main = subprocess.Popen([sys.executable, str(nest), "2", "ansible-playbook"], stdout=subprocess.PIPE, text=True)
    me = json.loads(main.communicate(timeout=60)[0])
    assert me["pid"] == main.pid
    assert me["started_ticks"] and me["boot_id"]
    assert runs.controller_alive(me) is False  # it has ended: its pid may come back, never with its start time


def test_a_background_job_stops_when_the_heartbeat_ends_or_the_lock_is_lost(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "r1", "node-a", 600)
    assert lock.check(path, "r1", "node-a", heartbeat_timeout_s=60) is None
    assert "has not checked on this job" in lock.check(path, "r1", "node-a", heartbeat_timeout_s=0)
    # A job started long after the lock was taken (the controller's first poll still to come): its controller's
    # silence counts from the job's start, when the controller was there to start it.
    late = lock.read(path)
    late["holders"]["node-a"]["heartbeat_at"] -= 100
    paths.write_atomic(path, json.dumps(late))
    assert lock.check(path, "r1", "node-a", heartbeat_timeout_s=60, since_s=time.time()) is None
    assert "has not checked on this job" in lock.check(path, "r1", "node-a", heartbeat_timeout_s=60)
    assert lock.heartbeat(path, "r1", "node-a")["held"]
    assert not lock.heartbeat(path, "r2", "node-a")["held"]
    lock.release(path, "r1", "node-a")
    assert "no longer holds the node lock" in lock.check(path, "r1", "node-a", heartbeat_timeout_s=60)


# ---------------------------------------------------------------- nothing left behind


GUARDED = textwrap.dedent("""
    import os, subprocess, sys, tempfile, time
    from gpufleet.base import guard
    guard.start_from_env()
    work = tempfile.mkdtemp(prefix="gpufleet-guard-test-", dir=sys.argv[1])
    guard.track_dir(work)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             preexec_fn=guard.die_with_parent)
    guard.track(child)
    print(child.pid, work, flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waits for its parent: it runs nothing.
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def _start_guarded(tmp_path, env=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", GUARDED, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **(env or {})),
        start_new_session=True,
    )
    child_pid, work = proc.stdout.readline().split()
    return proc, int(child_pid), Path(work)


def _wait_gone(pid, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    return not _alive(pid)


def test_a_group_of_zombies_is_stopped_and_a_running_one_is_not():
    """The guard waits for the groups it stopped before it removes their folders: an exited child that its parent
    has not reaped yet must not hold that back."""
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert guard._group_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        _wait_gone(child.pid)
        assert Path(f"/proc/{child.pid}/stat").exists()  # a zombie: not reaped yet
        assert not guard._group_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not guard._group_alive(child.pid)


def test_a_terminated_engine_stops_what_it_started_and_removes_its_folders(tmp_path):
    proc, child, work = _start_guarded(tmp_path)
    assert _alive(child) and work.is_dir()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert _wait_gone(child), "the engine's child outlived it"
    assert not work.exists()


@pytest.mark.slow
def test_a_job_whose_controller_stopped_checking_on_it_stops(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "r1", "node-a", 600)
    spec = json.dumps({"path": str(path), "run_id": "r1", "holder": "node-a", "heartbeat_timeout_s": 1})
    proc, child, work = _start_guarded(tmp_path, {"GPUFLEET_LOCK": spec})
    try:
        assert _wait_gone(child), "the job ran on without its controller"
        wait_for(lambda: not work.exists(), 30, "the job's folder removed")  # right after the processes
    finally:
        proc.kill()
        proc.wait()


# The engine was still preparing when its run went: what it starts afterwards must not run unwatched.
STARTED_AFTER_THE_STOP = textwrap.dedent("""
    import subprocess, sys, time
    from gpufleet.base import guard
    guard.start_from_env()
    while not guard.stopped():
        time.sleep(0.1)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(child.pid, flush=True)
    guard.track(child)
    print(child.wait(), flush=True)
""")


@pytest.mark.slow
def test_what_a_job_starts_after_its_run_was_stopped_is_stopped_at_once(tmp_path):
    path = tmp_path / "node.lock"
    lock.acquire(path, "r1", "node-a", 600)
    spec = json.dumps({"path": str(path), "run_id": "r1", "holder": "node-a", "heartbeat_timeout_s": 1})
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTED_AFTER_THE_STOP],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, GPUFLEET_LOCK=spec),
        start_new_session=True,
    )
    child = int(proc.stdout.readline())
    try:
        assert _wait_gone(child), "what the job started after its run was stopped runs on"
        assert int(proc.stdout.readline()) < 0  # killed by a signal
    finally:
        os.kill(child, signal.SIGKILL) if _alive(child) else None
        proc.kill()
        proc.wait()


# torchrun: each rank in a session of its own; this one does not pass SIGTERM on (torchrun too slow to).
TREE = textwrap.dedent("""
    import subprocess, sys, time
    from gpufleet.base import guard
    guard.start_from_env()
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; r = subprocess.Popen("
                                 "[sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
                                 "print(r.pid, flush=True); time.sleep(300)"],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    guard.track(launcher)
    print(launcher.pid, launcher.stdout.readline().strip(), flush=True)
    time.sleep(300)
""")


def test_a_stopped_job_stops_the_processes_its_children_put_in_sessions_of_their_own(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    launcher, rank = map(int, proc.stdout.readline().split())
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert _wait_gone(launcher)
        assert _wait_gone(rank), "a rank in a session of its own outlived the stopped job"
    finally:
        for pid in (launcher, rank):
            os.kill(pid, signal.SIGKILL) if _alive(pid) else None
        proc.kill()
        proc.wait()


MODULE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import run_engine
    run_engine(sys.executable, ["hold"], 300, "test")
""")

HOLDING_ENGINE = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.environ["PIDS_FILE"] + ".part", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.environ["PIDS_FILE"] + ".part", os.environ["PIDS_FILE"])  # whole when it appears
    time.sleep(300)
""")


@pytest.mark.parametrize("how", ["connection", "sigterm", "sigkill"])
def test_a_module_whose_controller_is_gone_leaves_no_engine_behind(tmp_path, fake_engine, how):
    """The module runs the engine; the controller goes (its end of the module's stdout closes), or the module is
    terminated, or killed outright: the engine and what it started go too."""
    fake_engine(HOLDING_ENGINE)
    pids_file = tmp_path / "pids"
    env = dict(os.environ, PIDS_FILE=str(pids_file))
    module = subprocess.Popen(
        [sys.executable, "-c", MODULE, str(REPO / "collections")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    wait_for(pids_file.exists, 120, "the engine's pids", interval_s=0.1)
    engine, child = map(int, pids_file.read_text().split())
    if how == "connection":
        module.stdout.close()  # what the ssh session or the local worker does when the controller goes
    else:
        module.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    module.wait(timeout=60)
    assert _wait_gone(engine), "the engine outlived its module"
    if how != "sigkill":
        assert _wait_gone(child), "the engine's child outlived the module"
    # A module killed outright cannot clean up: the kernel's SIGTERM to the engine is all there is, and the
    # real engine's guard then stops what it started (test_a_terminated_engine_stops_what_it_started...).
    os.kill(child, signal.SIGKILL) if _alive(child) else None


def test_the_controller_identity_is_this_machine():
    me = runs.controller_identity()
    assert me["host"] == socket.gethostname() and me["pid"] > 1
    assert runs.controller_alive(me) is True
    assert runs.controller_alive(dict(me, host="elsewhere")) is None


SLOW_READING_ENGINE = """
    import hashlib, json, sys, time
    from ansible_collections.gpufleet.cluster.plugins.module_utils import engine_process
    time.sleep(2 * engine_process.CHECK_EVERY_S)  # starts reading after the module's first wait for it ended
    data = sys.stdin.buffer.read()
    print(json.dumps({"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
"""


@pytest.mark.slow
def test_a_large_input_reaches_an_engine_that_is_slow_to_start(fake_engine, monkeypatch):
    """host_record hands the engine a host document of hundreds of KiB on stdin; an engine slow to start (a loaded
    controller) must still get all of it: it once got the first 64 KiB and waited for the rest until its timeout."""
    import hashlib

    import module_runner  # noqa: F401  (puts the collection on sys.path)
    from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import run_json

    fake_engine(SLOW_READING_ENGINE)
    monkeypatch.setenv("PYTHONPATH", f"{os.environ['PYTHONPATH']}:{REPO / 'collections'}")
    document = json.dumps({"results": [{"detail": "x" * 1000, "n": i} for i in range(1000)]})
    assert len(document) > 15 * 65536  # many times what a pipe holds
    rc, got = run_json(sys.executable, ["record"], 60, "the controller", input_text=document)
    assert rc == 0 and got == {"bytes": len(document), "sha256": hashlib.sha256(document.encode()).hexdigest()}


ENGINE_KILLED_WITH_A_WORKER_LEFT = """
    import json, os, signal, subprocess, sys, time
    # A worker of the engine's own (same process group, its output inherited), as the soak's spawned ranks are;
    # then the engine is killed, as when someone kills it on the node.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[-1], "w") as out:
        out.write(str(worker.pid))
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_an_engine_killed_with_a_worker_left_holding_its_output_ends_the_module_run_at_once(fake_engine, tmp_path):
    """A soak engine killed on the node left its ranks holding its output open; the module waited for them until
    its timeout (17 minutes), and they ran on. Now they are killed a grace period after the engine is gone."""
    import module_runner  # noqa: F401  (puts the collection on sys.path)
    from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import run_engine

    fake_engine(ENGINE_KILLED_WITH_A_WORKER_LEFT)
    pid_file = tmp_path / "worker.pid"
    t0 = time.monotonic()
    rc, out, err = run_engine(sys.executable, ["bench", str(pid_file)], 300, "node-b")
    assert rc == -signal.SIGKILL, (rc, out, err)
    assert time.monotonic() - t0 < 120  # the grace period and a busy machine's slack, far below the timeout
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
        and Path(f"/proc/{worker}").exists()
        and Path(f"/proc/{worker}/stat").read_text().split(")")[-1].split()[0] != "Z"
    ):
        time.sleep(0.1)
    assert (
        not Path(f"/proc/{worker}").exists()
        or Path(f"/proc/{worker}/stat").read_text().split(")")[-1].split()[0] == "Z"
    ), "the worker outlived its engine"
