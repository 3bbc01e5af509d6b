"""No secret at rest, on either machine, after any end of a run.

`gpufleet fleet run` (the documented command) on this machine (a local connection) and a test host over ssh
without pipelining (Ansible's default: each module is copied to the node as a file, AnsiballZ_<module>.py under
~/.ansible/tmp, that holds its arguments), with a token in gpufleet_node_env and a become password given with -e.
Run after run on the same two nodes, each ends another way: ansible-playbook killed with SIGKILL, the runner sent
SIGTERM, the runner's process group killed with SIGKILL, the test host rebooted (its processes killed, its /tmp and
/run emptied, sshd started again) while both nodes measure (then the runner sent SIGTERM, once the run has lost the
node), and last a run that completes. After each, every file either machine wrote is read for the planted values:

    this machine  the test's folder whole: the reports folder, the runner's artifacts, TMPDIR (Ansible's local
                  temporary folders, the extra variables), HOME (~/.ansible_async); and every file written since
                  the run started under /tmp, /var/tmp, /dev/shm, /run, the checkout and the account's ~/.ansible
                  (~/.ansible/tmp: the local node's payloads), ~/.ansible_async, ~/.cache and ~/gpufleet-finetune
    the test host every file it wrote (its overlay's upper layer: ~/.ansible/tmp, ~/.ansible_async, the engine's
                  working folders), its /tmp and its /run (the node lock)

Before the complete run, a payload of a gpufleet module, as a killed run leaves it when it is killed between
copying the module and starting it (built by Ansible's own module builder, dated past STALE_PAYLOAD_S), is put on
the test host: the complete run removes it, and leaves a payload of another collection's module alone.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.runner import record as rec
from playbooks import playbook_env, start_playbook
from testhosts import SHARED, TOOL_PATH, TestFleet, skip_reason
from waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKEN, BECOME = f"hf_{uuid.uuid4().hex}", f"become-{uuid.uuid4().hex}"
# Ansible puts a local connection's payloads under the account's home (~root, whatever HOME says), beside its
# ~/.ansible_async and the fine-tune's folder; the account's other folders (toolchains, caches of packages) are no
# run's to write.
ACCOUNT = Path(pwd.getpwuid(os.getuid()).pw_dir)
SHARED_ROOTS = (
    [Path(p) for p in ("/tmp", "/var/tmp", "/dev/shm", "/run")]
    + [REPO]
    + [ACCOUNT / name for name in (".ansible", ".ansible_async", ".cache", "gpufleet-finetune")]
)


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(["node-a"], net=236, tag="gfa") as hosts:
        yield hosts


def _holding(roots: list[Path], since: float = 0.0) -> list[str]:
    """The regular files under `roots` (modified at or after `since`) that hold TOKEN or BECOME."""
    values = (TOKEN.encode(), BECOME.encode())
    found = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(folder, d)) or root == Path(folder)]
            if Path(folder) == REPO:  # the checkout's history and Python environments are not written by a run
                dirs[:] = [d for d in dirs if d != ".git" and not d.startswith(".venv")]
            for name in files:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or max(st.st_mtime, st.st_ctime) < since:
                        continue
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:  # gone meanwhile, or not ours to read
                    continue
                if any(v in data for v in values):
                    found.append(path)
    return found


def _local_engines(run_dir: Path, mark: bytes = b"") -> list[int]:
    """This machine's processes of the run (its mark in their environment) whose command line holds `mark`."""
    needle = f"GPUFLEET_RUNNER_RUN_DIR={run_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                cmdline = (entry / "cmdline").read_bytes()
                if mark in cmdline and b"ssh" not in cmdline.split(b"\0")[0]:  # ssh's masters outlive a run
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


class Runs:
    """`gpufleet fleet run` on this machine and the test host, one run at a time, and what each leaves."""

    def __init__(self, fleet: TestFleet, tmp_path: Path):
        self.fleet, self.tmp = fleet, tmp_path
        self.reports = tmp_path / "reports"
        for folder in ("tmp", "home"):
            (tmp_path / folder).mkdir()
        self.inventory = tmp_path / "hosts.yml"
        ssh = {
            "ansible_connection": "ssh",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(fleet.key),
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no "
            "-o IdentitiesOnly=yes",
        }
        hosts = {
            "localhost": {"ansible_connection": "local", "gpufleet_lock_path": str(tmp_path / "node.lock")},
            "node-a": {**ssh, "ansible_host": fleet.address("node-a")},
        }
        self.inventory.write_text(
            yaml.safe_dump(
                {
                    "all": {
                        "vars": {"ansible_python_interpreter": sys.executable, "gpufleet_python": str(BIN / "python")},
                        "children": {"gpu_nodes": {"hosts": hosts}},
                    }
                }
            )
        )
        # Ansible's settings as a site leaves them: no pipelining. ssh's sockets in a short folder (a socket's path
        # is at most 108 bytes).
        self.env = dict(
            os.environ,
            PATH=f"{BIN}:{os.environ['PATH']}",
            HOME=str(tmp_path / "home"),
            TMPDIR=str(tmp_path / "tmp"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(fleet.state / "cp"),
            ANSIBLE_HOST_KEY_CHECKING="false",
        )
        self.env.pop("ANSIBLE_PIPELINING", None)

    def start(self, run_id: str, *tier: str) -> subprocess.Popen:
        extra = {
            "gpufleet_node_env": {"HF_TOKEN": TOKEN, "OMP_NUM_THREADS": 1},
            "ansible_become_password": BECOME,
            "gpufleet_nccl_multinode": False,
        }
        self.started = time.time() - 1
        return subprocess.Popen(
            [str(BIN / "gpufleet"), "fleet", "run", "-i", str(self.inventory), "--run-id", run_id]
            + ["--reports-dir", str(self.reports), "--plain", *tier]
            + ["-e", json.dumps(extra)],
            cwd=REPO,
            env=self.env,
            stdout=(self.tmp / f"{run_id}.out").open("w"),  # read for the values too
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def both_measure(self, runner: subprocess.Popen, run_dir: Path) -> list[int]:
        """Wait until the engine's node stage runs on both nodes (its checks, then its soak); the run's
        ansible-playbook processes."""

        def staged():
            assert runner.poll() is None, (self.tmp / f"{run_dir.name}.out").read_text()[-3000:]
            return self.fleet.pids("node-a", "-m gpufleet node-stage") and _local_engines(run_dir, b"\0node-stage\0")

        wait_for(staged, 600, "both nodes in their node stage", interval_s=0.1)
        return rec.running_playbooks(run_dir)

    def ended(self, runner: subprocess.Popen, run_dir: Path) -> None:
        """Wait until nothing of the run works on either machine."""
        runner.wait(timeout=900)
        wait_for(lambda: not _local_engines(run_dir), 120, "this machine's processes of the run to end")
        wait_for(lambda: not self.fleet.pids("node-a", "-m gpufleet", "AnsiballZ"), 120, "the host's to end")

    def holding(self) -> list[str]:
        host = self.fleet.state / "node-a"
        return _holding([self.tmp, host / "upper", host / "root" / "tmp", host / "root" / "run"]) + _holding(
            SHARED_ROOTS, self.started
        )


def reboot(fleet: TestFleet, name: str) -> None:
    """The host as after a reboot: every process of it killed, its /tmp and /run emptied, sshd started again as
    testhost.sh starts it (its /run prepared as there)."""
    netns = fleet.hosts[name][0]
    root = fleet.root(name)
    fleet.kill(name)
    wait_for(lambda: not fleet.pids(name), 60, f"{name}'s processes to end")
    # The checkout and the Python environment are bound in read-only at their own paths (a checkout under /tmp is in
    # the host's /tmp): a reboot keeps them, as testhost.sh binds them again; the rest of /tmp and /run goes.
    bound = [root / b.split(":", 1)[1].lstrip("/") for b in SHARED]
    for folder in (root / "tmp", root / "run"):
        for entry in folder.iterdir():
            if any(b == entry or entry in b.parents for b in bound):
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    (root / "run" / "sshd").mkdir(parents=True)
    (root / "run" / "systemd").mkdir()
    (root / "run" / "systemd" / "container").write_text("gpufleet-testhost\n")
    sshd = f"mount -t sysfs sysfs '{root}/sys' && exec chroot '{root}' /usr/sbin/sshd -f /etc/ssh/sshd_config_gpufleet_testhost"
    subprocess.run(
        ["ip", "netns", "exec", netns, "sh", "-c", sshd], check=True, env=dict(os.environ, PATH=TOOL_PATH), timeout=60
    )
    wait_for(lambda: fleet.pids(name, "sshd"), 60, f"{name}'s sshd")


# Ansible's module builder, as a run calls it for a module it copies to a node: the payload's bytes on stdout.
BUILD = """
import os, sys
from ansible.executor import module_common
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader, module_loader
from ansible.template import Templar
module, marker, collections = sys.argv[1:]
init_plugin_loader([collections])
path = module_loader.find_plugin_with_context(module).plugin_resolved_path
built = module_common.modify_module(
    module_name=module, module_path=os.path.abspath(path), templar=Templar(loader=DataLoader()),
    module_args={"node_env": {"HF_TOKEN": marker}, "python": sys.executable},
    task_vars={"ansible_python_interpreter": sys.executable},
)
sys.stdout.buffer.write(built.b_module_data)
"""


def stale_payload(fleet: TestFleet, name: str, module: str, marker: str) -> Path:
    """A payload of `module` holding `marker`, as a run copies it to a node, in a folder of the host's
    ~/.ansible/tmp dated an hour back: what a run killed between copying a module and starting it leaves."""
    built = subprocess.run(
        [sys.executable, "-c", BUILD, module, marker, str(REPO / "collections")],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert marker.encode() in built
    folder = fleet.root(name) / "root" / ".ansible" / "tmp" / f"ansible-tmp-{time.time() - 3600}-1-{uuid.uuid4().int}"
    folder.mkdir(parents=True, mode=0o700)
    payload = folder / f"AnsiballZ_{module.rsplit('.', 1)[1]}.py"
    payload.write_bytes(built)
    for p in (payload, folder):
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    return payload


def test_no_secret_is_left_on_either_machine_after_any_end_of_a_run(fleet, tmp_path):
    runs = Runs(fleet, tmp_path)
    leaks: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}

    for ending in (
        "kill -9 of ansible-playbook",
        "SIGTERM of the runner",
        "kill -9 of the runner's group",
        "the test host rebooted",
    ):
        t0 = time.monotonic()
        run_id = f"end{len(leaks)}"
        run_dir = runs.reports / run_id
        runner = runs.start(run_id, "--tier", "soak", "--soak-duration-s", "600")
        try:
            playbooks = runs.both_measure(runner, run_dir)
            assert playbooks, "no ansible-playbook of the run"
            if ending == "kill -9 of ansible-playbook":
                for pid in playbooks:
                    os.kill(pid, signal.SIGKILL)
            elif ending == "SIGTERM of the runner":
                runner.send_signal(signal.SIGTERM)
            elif ending == "kill -9 of the runner's group":
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait(timeout=60)
                wait_for(lambda: not rec.running_playbooks(run_dir), 120, "the runner's ansible-playbook to end")
            else:
                reboot(fleet, "node-a")
                # The run has lost the node (its document says so); this machine's soak would go on for minutes.
                wait_for(lambda: (run_dir / "hosts" / "node-a.json").exists(), 600, "node-a's document")
                runner.send_signal(signal.SIGTERM)
            runs.ended(runner, run_dir)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
        leaks[ending] = runs.holding()
        seconds[ending] = round(time.monotonic() - t0, 1)

    # A payload a run killed between copying and starting a module left, and another collection's beside it.
    left = stale_payload(fleet, "node-a", "gpufleet.cluster.node_stage", TOKEN)
    other = stale_payload(fleet, "node-a", "ansible.builtin.ping", "not-ours")
    t0 = time.monotonic()
    runner = runs.start("complete", "--tier", "smoke")
    runs.ended(runner, runs.reports / "complete")
    seconds["complete"] = round(time.monotonic() - t0, 1)
    assert runner.returncode == 1, "the run did not complete (no GPU here: not accepted)"
    assert (runs.reports / "complete" / "report.json").exists()
    leaks["complete"] = runs.holding()
    print("seconds per ending:", seconds)
    problems = {ending: files for ending, files in leaks.items() if files}
    if left.exists() or left.parent.exists():
        problems["the payload a killed run left, after the next run"] = [str(left)]
    assert not problems, "\n".join(f"{ending}: {path}" for ending, files in problems.items() for path in files)
    assert other.exists(), "another collection's payload was removed"


# A run across nodes starts its job with async (job_across_nodes.yml): Ansible copies such a module to the node
# whether the connection pipelines or not, and its job outlives ansible-playbook.
ASYNC_JOB = """
- name: A gpufleet module as a job across nodes starts it
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Start the benchmark as a job
      gpufleet.cluster.benchmark:
        python: "{{ ansible_playbook_python }}"
        benchmarks: [matmul]
        depth: smoke
        node_env: {HF_TOKEN: "%s", OMP_NUM_THREADS: 1}
        timeout_s: 600
      async: 660
      poll: 0
      register: job
    - name: Wait for the job
      ansible.builtin.async_status:
        jid: "{{ job.ansible_job_id }}"
      register: status
      until: status is finished
      retries: 600
      delay: 1
"""


def test_a_job_started_with_async_keeps_no_secret_on_disk_while_it_runs_nor_after_its_controller_is_killed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    playbook = tmp_path / "job.yml"
    playbook.write_text(ASYNC_JOB % TOKEN)
    env = playbook_env(tmp_path, HOME=str(home))
    env.pop("ANSIBLE_PIPELINING", None)
    started = time.time() - 1
    proc = start_playbook(str(playbook), None, env=env, new_session=True)
    try:
        # The job's engine runs with the token in its environment: the job has started on the node.
        def engine():
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and b"-m\0gpufleet\0bench" in (entry / "cmdline").read_bytes():
                        if f"HF_TOKEN={TOKEN}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                            return int(entry.name)
                except OSError:
                    continue
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            return None

        def holding() -> list[str]:  # but the playbook, the operator's own file
            return [p for p in _holding([tmp_path]) + _holding(SHARED_ROOTS, started) if p != str(playbook)]

        pid = wait_for(engine, 300, "the job's engine")
        assert not holding(), f"while the job runs: {holding()}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 600, "the job's engine to end")
        assert list((home / ".ansible_async").iterdir()), "the job left no result"
        assert not holding(), f"after the job: {holding()}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
