"""Real ansible-playbook runs of finetune.yml across two hosts the test makes itself, and of validate.yml's
fine-tune stage on this machine.

The two hosts are sshd's in network namespaces, chrooted into overlays of this machine's root
(molecule/resources/testhost.sh); Ansible reaches them over ssh, and they reach each other through this
machine, which routes between their two /30s (forwarding on their two veth ends only). The fine-tune is the
tiny random-weight Qwen2 on the shipped glaive sample, on the CPU with gloo: its result is `skip`, a logic
check and never a performance figure.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.bench.launch import free_port
import playbooks
import testhosts

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The hosts see this machine's root, but with fresh /tmp and /run: the checkout and the Python environment
# (gpufleet_python) are bound in read-only at their own paths, wherever they are.
SHARED = [
    f"{p}:{p}"
    for p in sorted({str(REPO), sys.prefix})
    if not any(p != q and p.startswith(q + "/") for q in (str(REPO), sys.prefix))
]
TESTHOST = REPO / "molecule" / "resources" / "testhost.sh"
TOOLS = ("ip", "sshd", "ssh", "ssh-keygen", "chroot", "mount", "umount", "mountpoint")
TOOL_PATH = f"{BIN}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
CPU_NOTE = "not a performance figure"
# name: (network namespace, address of this machine's veth end, the host's address)
HOSTS = {"node-a": ("gfft-a", "10.215.1.1", "10.215.1.2"), "node-b": ("gfft-b", "10.215.2.1", "10.215.2.2")}
TORCHRUN_MARKS = ("torch.distributed.run", "gpufleet.finetune.worker")


def run_playbook(
    playbook: str,
    inventory: Path | str,
    reports: Path,
    *extra: str,
    env_extra: dict | None = None,
    background: bool = False,
    timeout_s: int = 300,
):
    """ansible-playbook from the repository root into reports/<run-id>; (process or completed, run dir)."""
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    env = playbooks.playbook_env(reports, base=dict(os.environ, PATH=TOOL_PATH), **(env_extra or {}))
    if background:
        return playbooks.start_playbook(
            playbook, inventory, *extra, env=env, run_id=run_id, reports=reports
        ), reports / run_id
    proc = playbooks.run_playbook(
        playbook, inventory, *extra, env=env, timeout_s=timeout_s, run_id=run_id, reports=reports
    )
    return proc, reports / run_id


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def finetune_result(run_dir: Path, host: str) -> dict:
    doc = json.loads((run_dir / "hosts" / f"{host}.json").read_text())
    assert doc["host"] == host
    results = [r for r in doc["results"] if r["group"] == "finetune"]
    assert len(results) == 1, doc["results"]
    return results[0]


# ---------------------------------------------------------------- two hosts of our own


@pytest.fixture(scope="module")
def two_hosts():
    """node-a and node-b: sshd in network namespaces, routed to each other through this machine."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hosts are network namespaces, veth pairs and overlay mounts")
    missing = [t for t in TOOLS if not shutil.which(t, path=TOOL_PATH)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: apt-get install openssh-server openssh-client iproute2")
    # Short: ssh's control sockets live under it and a socket path is at most 108 bytes.
    claims = testhosts.claim(215, "gfft")  # the network and names of HOSTS
    state = Path(tempfile.mkdtemp(prefix="gfft-"))
    env = dict(os.environ, PATH=TOOL_PATH)
    try:
        key = state / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-finetune-test", "-f", str(key)],
            check=True,
            env=env,
        )
        for name, (netns, host_ip, node_ip) in HOSTS.items():
            # A run that was killed may have left its namespace and veth behind.
            subprocess.run(
                ["bash", str(TESTHOST), "down", name, netns, str(state)], env=env, capture_output=True, timeout=120
            )
            subprocess.run(
                ["bash", str(TESTHOST), "up", name, netns, host_ip, node_ip, str(state), f"{key}.pub", *SHARED],
                check=True,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
        # testhost.sh links each host to this machine only; route each /30 to the other through this machine.
        # Forwarding is switched on for the two veth ends alone (not net.ipv4.ip_forward), and goes with them.
        (a_ns, a_gw, a_ip), (b_ns, b_gw, b_ip) = HOSTS.values()
        for netns, gw, other in ((a_ns, a_gw, b_ip), (b_ns, b_gw, a_ip)):
            subprocess.run(
                ["ip", "-n", netns, "route", "add", other.rsplit(".", 1)[0] + ".0/30", "via", gw], check=True, env=env
            )
            try:
                Path(f"/proc/sys/net/ipv4/conf/{netns}-h/forwarding").write_text("1\n")
            except OSError as exc:
                pytest.skip(f"cannot route between the test hosts: forwarding on {netns}-h: {exc}")
        # The rendezvous needs this: node-b must reach a port on node-a.
        probe = subprocess.run(
            ["ip", "netns", "exec", b_ns, "bash", "-c", f"exec 3<>/dev/tcp/{a_ip}/22"],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert probe.returncode == 0, f"node-b cannot reach node-a's sshd: {probe.stderr}"
        yield {"state": state, "key": key}
    finally:
        for name, (netns, _, _) in HOSTS.items():
            subprocess.run(
                ["bash", str(TESTHOST), "down", name, netns, str(state)], env=env, capture_output=True, timeout=120
            )
        # Never delete through a mount that is still there: the hosts' /dev is this machine's, bound in.
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        if not any(m == str(state) or m.startswith(f"{state}/") for m in mounts):
            shutil.rmtree(state, ignore_errors=True)
        for lock in claims:
            lock.close()


def two_host_inventory(hosts: dict, path: Path, **group_vars) -> Path:
    common = {
        "ansible_connection": "ssh",
        "ansible_user": "root",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": str(hosts["key"]),
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o IdentitiesOnly=yes "
        "-o ConnectTimeout=10",
        # The overlay's lower layer is this machine's root: the same interpreter, engine and torch are there.
        "gpufleet_python": str(BIN / "python"),
        "gpufleet_finetune_config": "files/configs/tiny-qwen2-lora.yml",
        "gpufleet_finetune_timeout_s": 180,
        "gpufleet_finetune_rdzv_timeout_s": 60,
        **group_vars,
    }
    nodes = {}
    for name, (_, _, node_ip) in HOSTS.items():
        # Per node: gloo must use the namespace's own interface (both hosts share this machine's host name), two
        # "nodes" share this machine's cores, and a marker that finds this node's torchrun processes.
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": 1, "GPUFLEET_TEST_NODE": name}
        nodes[name] = {"ansible_host": node_ip, "gpufleet_node_env": env}
    path.write_text(
        yaml.safe_dump({"all": {"vars": common, "children": {"gpu_nodes": {"hosts": nodes}}}}, sort_keys=False)
    )
    return path


def ssh_env(hosts: dict) -> dict:
    # Root logins: modules go down the ssh channel (pipelining) instead of through temporary files.
    return {
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(hosts["state"] / "cp"),
        "ANSIBLE_HOST_KEY_CHECKING": "false",
        "ANSIBLE_PIPELINING": "true",
    }


def node_root(hosts: dict, name: str) -> Path:
    """The host's / as this machine sees it."""
    return hosts["state"] / name / "root"


def torchrun_pids(name: str) -> list[int]:
    """torchrun and its ranks on one test host: processes of its network namespace that carry its marker."""
    netns = HOSTS[name][0]
    pids = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, env=dict(os.environ, PATH=TOOL_PATH)
    )
    found = []
    for pid in pids.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if any(m in cmdline for m in TORCHRUN_MARKS) and f"GPUFLEET_TEST_NODE={name}".encode() in environ:
            found.append(int(pid))
    return found


def test_finetune_runs_across_two_hosts_and_reports_each(two_hosts, tmp_path):
    inventory = two_host_inventory(two_hosts, tmp_path / "hosts.yml")
    proc, run_dir = run_playbook("finetune.yml", inventory, tmp_path / "reports", env_extra=ssh_env(two_hosts))
    out = output(proc)
    assert proc.returncode == 0, out[-20000:]  # a CPU run is a skip: nothing failed
    assert "Start the fine-tune on every node at once: node-a, node-b" in out, out[-20000:]

    a, b = finetune_result(run_dir, "node-a"), finetune_result(run_dir, "node-b")
    for res, rank in ((a, 0), (b, 1)):
        d = res["detail"]
        assert res["check"] == "finetune" and res["status"] == "skip" and CPU_NOTE in res["reason"], res
        assert (d["world_size"], d["nnodes"], d["node_rank"]) == (2, 2, rank), d
        assert d["launch"]["master_addr"] == HOSTS["node-a"][2] and d["launch"]["rdzv_timeout_s"] == 60
        mn = d["multinode"]
        assert mn["members"] == ["node-a", "node-b"] and mn["master"] == "node-a" and mn["node_rank"] == rank
        assert mn["master_addr"] == HOSTS["node-a"][2] and mn["left_out"] == {}
        # The relative config name resolved under gpufleet_finetune_dir on the node, where the play copied it.
        assert d["config_path"] == "/root/gpufleet-finetune/files/configs/tiny-qwen2-lora.yml"
        assert len(d["losses"]) == 8 and all(math.isfinite(x) for x in d["losses"])
        assert d["loss_last"] < d["loss_first"], d["losses"]
        assert math.isfinite(d["eval_loss"]) and math.isfinite(d["eval_loss_first"])
    assert a["detail"]["losses"] == b["detail"]["losses"]  # one job: the loss is averaged over both ranks

    # Node rank 0 saved the adapter on node-a, under the run's output folder.
    adapter = a["detail"]["adapter_dir"]
    assert adapter == f"/root/gpufleet-finetune/output/{run_dir.name}/adapter", adapter
    config = node_root(two_hosts, "node-a") / adapter.lstrip("/") / "adapter_config.json"
    assert json.loads(config.read_text())["r"] == 8
    assert b["detail"]["adapter_dir"] is None

    report = json.loads((run_dir / "report.json").read_text())
    assert set(report["nodes"]) == {"node-a", "node-b"}
    for host in ("node-a", "node-b"):
        results = report["nodes"][host]["results"]
        assert [(r["group"], r["check"]) for r in results if r["group"] != "fleet"] == [("finetune", "finetune")]
        # The fleet layer has nothing to hold a fine-tune-only run against on the CPU: it says so.
        assert {r["status"] for r in results if r["group"] == "fleet"} <= {"skip"}
    for name in ("report.md", "report.html", "junit.xml"):
        assert (run_dir / name).is_file(), name
    assert "finetune.finetune" in (run_dir / "report.md").read_text()


def test_a_node_that_dies_mid_run_stops_both_and_is_named(two_hosts, tmp_path):
    """node-b's torchrun and rank are killed once training runs: node-a's rank loses its peer, both plays end
    well before the timeout, the playbook fails, and node-a's result names node-b. The timeout leaves room for a
    busy machine's start (torch and the model loaded on both hosts): the test waits for step 3 itself."""
    timeout_s = 300
    inventory = two_host_inventory(
        two_hosts, tmp_path / "hosts.yml", gpufleet_finetune_timeout_s=timeout_s, gpufleet_finetune_max_steps=2000
    )  # far longer than the test waits
    t0 = time.monotonic()
    proc, run_dir = run_playbook(
        "finetune.yml", inventory, tmp_path / "reports", env_extra=ssh_env(two_hosts), background=True
    )
    try:
        # Rank 0 (node-a) logs each step to its torchrun log, in node-a's /tmp.
        tmp_a = node_root(two_hosts, "node-a") / "tmp"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(
                "step 3/" in log.read_text(errors="replace") for log in tmp_a.glob("gpufleet-finetune-*/torchrun.log")
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"training did not start on node-a within 240 s:\n{proc.communicate(timeout=300)[0][-20000:]}")
        victims = torchrun_pids("node-b")
        assert len(victims) >= 2, victims  # torchrun and its rank, found by node-b's marker from gpufleet_node_env
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=timeout_s + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.monotonic()

    assert proc.returncode != 0, out[-20000:]
    # Both plays end on the lost peer, not at the timeout.
    assert ended - killed < timeout_s / 2, (ended - killed, out[-20000:])
    assert ended - t0 < timeout_s, ended - t0

    a, b = finetune_result(run_dir, "node-a"), finetune_result(run_dir, "node-b")
    assert a["status"] == "fail" and b["status"] == "fail", (a, b)
    fa = a["detail"]["failure"]
    assert fa["phase"] == "peer" and fa["peer_addr"] == HOSTS["node-b"][2], fa
    assert fa["peer_node"] == "node-b" and fa["peer_node_rank"] == 1, fa
    assert f"{HOSTS['node-b'][2]} is node-b, node rank 1" in a["reason"], a["reason"]
    assert "another node of the run died" in a["remedy"]
    fb = b["detail"]["failure"]
    assert fb["node_rank"] == 1 and fb["phase"] == "killed" and "killed by signal 9" in b["reason"], fb
    assert "killed from outside" in b["remedy"]

    report = json.loads((run_dir / "report.json").read_text())
    assert {h: report["nodes"][h]["verdict"] for h in ("node-a", "node-b")} == {"node-a": "fail", "node-b": "fail"}
    assert "2 node(s) failed" in out and "node-a: finetune.finetune: " in " ".join(out.split()), out[-5000:]
    # Nothing of the run is left on either host.
    assert not torchrun_pids("node-a") and not torchrun_pids("node-b")


# ---------------------------------------------------------------- bad variables stop the run before any node


@pytest.mark.parametrize(
    "node_b_vars, message",
    [
        ({"gpufleet_node_env": "CUDA_VISIBLE_DEVICES=0"}, "gpufleet_node_env for node-b must be a mapping"),
        (
            {"gpufleet_node_env": {"BAD-NAME": "1"}},
            "gpufleet_node_env for node-b must be a mapping of environment variable name",
        ),
        (
            {"gpufleet_finetune_rdzv_timeout_s": 600, "gpufleet_finetune_timeout_s": 600},
            "gpufleet_finetune_rdzv_timeout_s for node-b (600) must be less than gpufleet_finetune_timeout_s (600) less its 60 s margin",
        ),
        ({"gpufleet_finetune_master_port": 70000}, "gpufleet_finetune_master_port for node-b must be a TCP port"),
        ({"gpufleet_finetune_max_steps": "many"}, "gpufleet_finetune_max_steps for node-b must be a whole number"),
        ({"gpufleet_finetune_dir": "relative/dir"}, "gpufleet_finetune_dir for node-b must be an absolute path"),
        (
            {"gpufleet_finetune_config": "files/configs/qwen2-7b-lora-zero3.yml"},
            "gpufleet_finetune_config must be the same on every node of the fine-tune (set it for the group): "
            'node-b has "files/configs/qwen2-7b-lora-zero3.yml", node-a has "files/configs/qwen2-7b-lora.yml"',
        ),
    ],
)
def test_bad_finetune_variables_stop_the_run_naming_them(tmp_path, node_b_vars, message):
    # Unreachable addresses: the checks run on the controller before any node is contacted.
    inventory = tmp_path / "hosts.yml"
    node = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_nodes": {"hosts": {"node-a": node, "node-b": dict(node, **node_b_vars)}}}}}
        )
    )
    proc, run_dir = run_playbook("finetune.yml", inventory, tmp_path / "reports", timeout_s=120)
    out = " ".join(output(proc).split())  # the messages are folded over lines
    assert proc.returncode != 0
    assert message in out, out[-5000:]
    assert not (run_dir / "hosts").exists()  # stopped before the run folder, let alone a node


# ---------------------------------------------------------------- validate.yml's fine-tune stage


def test_validate_runs_the_finetune_stage_when_asked_and_adds_it_to_the_document(tmp_path):
    extra = {
        "gpufleet_benchmarks": [],
        "gpufleet_finetune": True,
        "gpufleet_finetune_dir": str(tmp_path / "ft"),
        "gpufleet_lock_path": str(tmp_path / "node.lock"),
        "gpufleet_finetune_config": "files/configs/tiny-qwen2-lora.yml",
        "gpufleet_finetune_max_steps": 4,
        "gpufleet_finetune_master_port": free_port(),
        "gpufleet_finetune_timeout_s": 180,
        "gpufleet_finetune_rdzv_timeout_s": 60,
    }
    proc, run_dir = run_playbook(
        "validate.yml",
        "inventory/local",
        tmp_path / "reports",
        "-e",
        json.dumps(extra),
        env_extra={"ANSIBLE_ASYNC_DIR": str(tmp_path / "ansible-async")},
    )
    out = output(proc)
    assert proc.returncode != 0, out  # no GPU: the node is not accepted
    doc = json.loads((run_dir / "hosts" / "localhost.json").read_text())
    # Added beside the checks of play 2, not in place of them.
    assert {r["group"] for r in doc["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene", "finetune"}
    res = finetune_result(run_dir, "localhost")
    assert res["status"] == "skip" and CPU_NOTE in res["reason"], res
    assert res["detail"]["steps"] == 4 and res["detail"]["loss_last"] < res["detail"]["loss_first"]
    assert res["detail"]["multinode"]["members"] == ["localhost"]
    assert (tmp_path / "ft" / "output" / run_dir.name / "adapter" / "adapter_config.json").is_file()
    assert "finetune.finetune" in (run_dir / "report.md").read_text()


def test_validate_checks_the_finetune_variables_when_the_stage_is_on(tmp_path):
    proc, run_dir = run_playbook(
        "validate.yml",
        "inventory/local",
        tmp_path / "reports",
        "-e",
        json.dumps({"gpufleet_finetune": True, "gpufleet_node_env": ["OMP_NUM_THREADS=1"]}),
        timeout_s=120,
    )
    out = " ".join(output(proc).split())
    assert proc.returncode != 0
    assert "gpufleet_node_env for localhost must be a mapping" in out, out[-5000:]
    assert not (run_dir / "hosts").exists()


def test_nodes_that_cannot_join_are_left_out_with_the_reason(tmp_path):
    """One node does not answer, the other has no gpufleet_python: neither runs, each document says why."""
    if shutil.which("ssh") is None:
        pytest.skip("the ssh client is needed to try a node over ssh (Debian: apt-get install openssh-client)")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {
                            "hosts": {
                                "deadnode": {
                                    "ansible_connection": "ssh",
                                    "ansible_host": "127.0.0.1",
                                    "ansible_port": 1,
                                    "ansible_ssh_common_args": "-o ConnectTimeout=5 -o BatchMode=yes",
                                },
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                    "gpufleet_python": str(tmp_path / "no-such-python"),
                                },
                            }
                        }
                    }
                }
            }
        )
    )
    proc, run_dir = run_playbook(
        "finetune.yml", inventory, tmp_path / "reports", "-e", f"gpufleet_finetune_dir={tmp_path / 'ft'}", timeout_s=120
    )
    out = output(proc)
    assert proc.returncode != 0, out
    assert "Start the fine-tune" not in out
    dead, local = finetune_result(run_dir, "deadnode"), finetune_result(run_dir, "localhost")
    assert dead["status"] == "error" and dead["reason"].startswith(
        "left out of the fine-tune across nodes: the node did not answer"
    )
    assert (
        local["status"] == "error"
        and f"gpufleet_python {tmp_path / 'no-such-python'} does not exist on localhost" in local["reason"]
    )
    for res in (dead, local):
        assert res["reason"].endswith("no node could join, so none ran") and res["remedy"]
        assert res["detail"]["multinode"]["members"] == []
    report = json.loads((run_dir / "report.json").read_text())
    assert {h: n["verdict"] for h, n in report["nodes"].items()} == {"deadnode": "fail", "localhost": "fail"}
