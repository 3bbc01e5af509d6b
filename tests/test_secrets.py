"""No secret in a process list: a token in gpufleet_node_env reaches the engine on every node, over a local and an
ssh connection, without appearing in any process's command line (/proc/<pid>/cmdline, readable by every user of
the node) or in ansible-playbook's -vvv output.

A real validate.yml run, ansible-playbook -vvv, over this machine (local connection) and a test host of our own
(tests/testhosts.py: an sshd in a network namespace, the same process table); a thread reads the command line of
every process while it runs.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path

import pytest
import yaml

from playbooks import playbook_env, run_playbook
from testhosts import TestFleet, skip_reason

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(["node-a"], net=225, tag="gfk") as hosts:
        yield hosts


class ProcessWatch:
    """Every process's command line read again and again until stopped: the ones that hold `token`, and the engine
    processes (python -m gpufleet) whose environment holds it (the token reached them)."""

    def __init__(self, token: str):
        self.token = token.encode()
        self.leaks: dict[int, str] = {}
        self.reached: set[str] = set()  # the nodes (GPUFLEET_TEST_NODE, else this machine) whose engine got it
        self.engines: set[int] = set()
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        cmdline = f.read()
                    if self.token in cmdline:
                        self.leaks[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
                    if b"-m\0gpufleet\0" in cmdline:
                        self.engines.add(int(entry.name))
                        with open(f"/proc/{entry.name}/environ", "rb") as f:
                            environ = f.read().split(b"\0")
                        if any(self.token in v for v in environ):
                            self.reached.add("node-a" if b"GPUFLEET_TEST_NODE=node-a" in environ else "localhost")
                except OSError:  # gone meanwhile
                    continue
            self.rounds += 1
            self._stop.wait(0.02)


def test_a_token_in_gpufleet_node_env_is_in_no_command_line_and_no_verbose_output(fleet, tmp_path):
    token = f"hf_{uuid.uuid4().hex}"
    env_of = lambda name: dict(fleet.host_vars(name)["gpufleet_node_env"], HF_TOKEN=token)  # noqa: E731
    ssh = {
        "ansible_connection": "ssh",
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(fleet.key),
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o IdentitiesOnly=yes",
    }
    hosts = {
        "localhost": {
            "ansible_connection": "local",
            "gpufleet_lock_path": str(tmp_path / "node.lock"),
            "gpufleet_node_env": {"HF_TOKEN": token},
        },
        "node-a": {**ssh, **fleet.host_vars("node-a"), "gpufleet_node_env": env_of("node-a")},
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_python_interpreter": sys.executable,
                        "gpufleet_python": str(BIN / "python"),
                        "gpufleet_benchmarks": ["matmul"],
                        "gpufleet_nccl_multinode": False,
                    },
                    "children": {"gpu_nodes": {"hosts": hosts}},
                }
            }
        )
    )
    inventory.chmod(0o600)
    with ProcessWatch(token) as watch:
        proc = run_playbook(
            "validate.yml",
            inventory,
            "-vvv",
            env=playbook_env(tmp_path, **fleet.ssh_env()),
            timeout_s=900,
            run_id=f"secret-{uuid.uuid4().hex[:8]}",
            reports=tmp_path,
        )
    out = proc.stdout + proc.stderr
    assert "Check and benchmark the node" in out, out[-5000:]
    assert watch.engines, "no engine process was seen: the watch saw nothing of the run"
    # The token reached the engine processes of both nodes ...
    assert watch.reached == {"localhost", "node-a"}, (watch.reached, len(watch.engines), watch.rounds)
    # ... and no command line, nor the verbose output.
    assert not watch.leaks, watch.leaks
    assert token not in out, [line for line in out.splitlines() if token in line][:5]
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != inventory:
            assert token.encode() not in path.read_bytes(), path
