"""The verdict acted on in a real Slurm: Debian's slurmctld, slurmd and munged on the network-namespace test hosts
(tests/slurm_cluster.py), every outcome read back with `scontrol show node` or `sinfo`.

The verdicts come from the real engine and report: host documents of `gpufleet check --readings` over recorded
readings (one with an Xid 79 added to its kernel log), made into report.json by `gpufleet report`, acted on by
`gpufleet slurm`. The health check runs as slurmd runs it: HealthCheckProgram in slurm.conf.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster
from gpufleet.base import slurm
from gpufleet.collect import kernel_log, nvml
from gpufleet.fleet import slurm_action as fleet_slurm
from playbooks import playbook_env, run_playbook
from slurm_cluster import SlurmCluster
from waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"
THRESHOLDS = json.dumps({"gpus_expected": 1})  # the recording is of a one-GPU VM
NET, TAG = 219, "gfs"

needs_slurm = pytest.mark.skipif(bool(slurm_cluster.skip_reason()), reason=str(slurm_cluster.skip_reason()))


def healthy_readings(path: Path) -> Path:
    """The recording, its GPU with no process on it (the recording lists none: made before processes were read)."""
    readings = json.loads(READINGS.read_text())
    readings["nvml"]["gpus"][0]["processes"] = []
    path.write_text(json.dumps(readings))
    return path


def xid_readings(path: Path) -> Path:
    """The healthy readings with Xid 79 (fallen off the bus) on its GPU, as the kernel log gives it."""
    readings = json.loads(healthy_readings(path).read_text())
    bus = readings["nvml"]["gpus"][0]["pci_bus_id"][:-2]  # 0000:00:06.0 -> 0000:00:06
    readings["kernel_log"]["xid_events"] = [
        kernel_log.parse_xid(f"NVRM: Xid (PCI:{bus}): 79, pid=1, GPU has fallen off the bus.")
    ]
    path.write_text(json.dumps(readings))
    return path


def no_driver_readings(path: Path) -> Path:
    """The healthy readings with the driver gone, as collect.nvml reads a node without libnvidia-ml.so."""
    readings = json.loads(healthy_readings(path).read_text())
    readings["nvml"] = {"available": False, "error": nvml.NO_DRIVER, "gpus": []}
    path.write_text(json.dumps(readings))
    return path


def gpufleet(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, env=env, timeout=300
    )


def make_run(reports: Path, run_id: str, failing: list[str], passing: list[str]) -> Path:
    """A run folder whose report.json says `failing` are not accepted and `passing` are, from the real report."""
    run_dir = reports / run_id
    (run_dir / "hosts").mkdir(parents=True)
    bad, good = xid_readings(reports / f"{run_id}-xid.json"), healthy_readings(reports / f"{run_id}-ok.json")
    for host in failing + passing:
        # The GPU groups: the recording holds no host section for host_hygiene to judge.
        done = gpufleet(
            "check",
            "--group",
            "gpu_inventory",
            "--group",
            "gpu_health",
            "--readings",
            str(bad if host in failing else good),
            "--host",
            host,
            "--json",
            "--exit-zero",
            "--thresholds",
            THRESHOLDS,
        )
        assert done.returncode == 0, done.stderr
        (run_dir / "hosts" / f"{host}.json").write_text(done.stdout)
    done = gpufleet("report", str(run_dir), "--no-store", "--json")
    summary = json.loads(done.stdout)
    assert {h for h, n in summary["nodes"].items() if n["verdict"] == "fail"} == set(failing), done.stdout
    return run_dir


def act(cluster: SlurmCluster, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return gpufleet("slurm", str(run_dir), "--json", *args, env=cluster.env())


def sinfo(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """{node: (state, reason)} from sinfo."""
    out = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], env=cluster.env(), capture_output=True, text=True, check=True
    ).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


@pytest.fixture
def cluster(request):
    names = getattr(request, "param", ["sn1", "sn2", "sn3"])
    with SlurmCluster(names, net=NET, tag=TAG) as c:
        c.wait_idle()
        yield c


def listening(pid: int | str) -> dict[str, int]:
    """{socket inode: port} of the TCP sockets listening in process `pid`'s network namespace."""
    found = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def socket_inodes(pid: int) -> set[str]:
    fds = Path(f"/proc/{pid}/fd")
    links = (os.readlink(fd) for fd in fds.iterdir())
    return {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}


@pytest.mark.slow
@needs_slurm
def test_daemons_listen_only_in_the_test_hosts_own_namespaces(cluster):
    """A machine that runs its own Slurm keeps it: no daemon the tests start listens in this machine's namespace."""
    own_netns, own_listening = os.readlink("/proc/self/ns/net"), listening("self")
    seen = {}
    for proc in cluster.procs:
        name = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        theirs = {inode: port for inode, port in listening(proc.pid).items() if inode in socket_inodes(proc.pid)}
        assert not set(theirs) & set(own_listening), f"{name} listens in this machine's network namespace: {theirs}"
        if name == "munged":
            assert not theirs, f"munged listens on TCP ports {sorted(theirs.values())}; expected its socket file alone"
        else:
            assert os.readlink(f"/proc/{proc.pid}/ns/net") != own_netns, (
                f"{name} runs in this machine's network namespace"
            )
        seen.setdefault(name, set()).update(theirs.values())
    assert set(seen) == {"munged", "slurmctld", "slurmd"}, seen
    assert cluster.ctld_port in seen["slurmctld"] and cluster.slurmd_port in seen["slurmd"], seen


def test_reason_names_gpufleet_run_class_and_first_check_within_the_limit():
    node = {
        "results": [
            {"group": "gpu_health", "check": "temperature", "status": "warn"},
            {"group": "host_hygiene", "check": "nccl_env", "status": "fail", "class": "configuration"},
            {"group": "gpu_health", "check": "xid", "status": "fail", "class": "hardware"},
        ]
    }
    assert fleet_slurm.drain_reason("run-7", node) == "gpufleet: run-7 hardware: gpu_health.xid +1 more"
    long = slurm.reason("x" * 300 + " a=b")
    assert len(long) == slurm.REASON_MAX_CHARS and long.startswith("gpufleet: xxx") and long.endswith("...")
    assert "=" not in slurm.reason("a=b") and slurm.is_own(slurm.reason("anything"))
    # An arrow reads as one (it showed as `-_`), and the stamp Slurm appends comes off again.
    assert slurm.reason("REACCEPT s2: GPU 0 serial A -> B") == "gpufleet: REACCEPT s2: GPU 0 serial A to B"
    assert slurm.bare_reason("gpufleet: r1 x [root@2026-11-27T12:52:32]") == "gpufleet: r1 x"


def test_breaker_counts_only_nodes_this_run_takes_out_of_service():
    """plan() over Slurm's nodes as scontrol gives them: a failing node already drained by gpufleet gets its reason
    renewed without counting against the limit; an admin's drain is left alone and not counted either."""
    shown = slurm.parse_nodes(
        "\n".join(
            [
                "NodeName=a State=IDLE Partitions=p",
                f"NodeName=b State=IDLE+DRAIN Partitions=p Reason={slurm.reason('run-0 hardware: gpu_health.ecc')} [root@t]",
                "NodeName=c State=DOWN+DRAIN+NOT_RESPONDING Partitions=p Reason=admin: PSU [root@t]",
                "NodeName=d State=IDLE Partitions=p",
            ]
        )
    )
    assert (
        shown["c"]["base"] == "DOWN"
        and "DRAIN" in shown["c"]["flags"]
        and shown["c"]["reason"] == "admin: PSU [root@t]"
    )
    failing = {
        "verdict": "fail",
        "results": [{"group": "gpu_health", "check": "xid", "status": "fail", "class": "hardware"}],
    }
    report = {
        "run_id": "run-9",
        "nodes": {"a": failing, "b": failing, "c": failing, "d": {"verdict": "pass", "results": []}},
    }
    planned = fleet_slurm.plan(report, shown, "drain_resume", (1, False))  # one new drain allowed
    assert not planned["breaker"]["tripped"]
    assert [d["do"] for d in planned["decisions"]] == ["drain", "drain", "nothing", "nothing"]
    assert "left alone" in planned["decisions"][2]["why"]
    planned = fleet_slurm.plan(report, shown, "drain_resume", (0, False))
    assert planned["breaker"]["tripped"] and planned["breaker"]["would_drain"] == ["a"]


def test_a_node_another_run_held_is_never_drained():
    """Its node_lock error is an environment failure of another gpufleet run's making, not the node's: neither
    drain.txt nor the Slurm action drains it; a node that also failed a check of its own still is."""
    from gpufleet.fleet import export

    held = {
        "verdict": "fail",
        "results": [
            {
                "group": "lock",
                "check": "node_lock",
                "status": "error",
                "class": "environment",
                "reason": "held by run r0",
            }
        ],
    }
    broken = {
        "verdict": "fail",
        "results": held["results"] + [{"group": "gpu_health", "check": "xid", "status": "fail", "class": "hardware"}],
    }
    report = {"run_id": "run-9", "nodes": {"a": held, "b": broken}}
    lines = export.drain_lines(report)
    assert len(lines) == 1 and "NodeName=b " in lines[0], lines
    shown = slurm.parse_nodes("NodeName=a State=IDLE Partitions=p\nNodeName=b State=IDLE Partitions=p")
    planned = fleet_slurm.plan(report, shown, "drain_resume", (50, True))
    assert [(d["host"], d["do"]) for d in planned["decisions"]] == [("a", "nothing"), ("b", "drain")]
    assert "another gpufleet run held it" in planned["decisions"][0]["why"]


@pytest.mark.parametrize("value", ["none", "drain", "drain_resume"])
def test_the_action_and_its_limit_are_checked_with_the_variable_named(value):
    assert fleet_slurm.parse_action(value) == value
    assert fleet_slurm.parse_max_drain("50%") == (50, True) and fleet_slurm.parse_max_drain(2) == (2, False)
    for bad in ("0%", "101%", "-1", "half", True, ""):
        with pytest.raises(Exception, match="gpufleet_slurm_max_drain"):
            fleet_slurm.parse_max_drain(bad)
    with pytest.raises(Exception, match="gpufleet_slurm_action is 'resume'"):
        fleet_slurm.parse_action("resume")


@pytest.mark.slow
@needs_slurm
def test_failing_drained_with_reason_own_drain_resumed_admin_drain_left_alone(cluster, tmp_path):
    # An administrator drained sn3 for a reason of their own; gpufleet had drained sn2 in an earlier run.
    cluster.scontrol("update", "nodename=sn3", "state=drain", "reason=admin: fan replaced, burn-in pending")
    cluster.scontrol(
        "update", "nodename=sn2", "state=drain", f"reason={slurm.reason('run-0 hardware: gpu_health.xid')}"
    )
    run_dir = make_run(tmp_path, "run-1", failing=["sn1"], passing=["sn2", "sn3"])

    # Check mode: the record says what would be done, and Slurm is as it was.
    done = act(cluster, run_dir, "--action", "drain_resume", "--check")
    assert done.returncode == 0, done.stderr
    would = {d["slurm_node"]: d["do"] for d in json.loads(done.stdout)["decisions"]}
    assert would == {"sn1": "drain", "sn2": "resume", "sn3": "nothing"}
    assert cluster.node_state("sn1") == "IDLE" and cluster.node_state("sn2") == "IDLE+DRAIN"

    done = act(cluster, run_dir, "--action", "drain_resume")
    assert done.returncode == 0, done.stderr + done.stdout
    sn1, sn2, sn3 = (cluster.node(n) for n in ("sn1", "sn2", "sn3"))
    assert sn1["State"] == "IDLE+DRAIN"
    assert sn1["Reason"].startswith("gpufleet: run-1 hardware: gpu_health.xid"), sn1["Reason"]
    # Slurm pings a resumed node before it takes jobs (IDLE+NOT_RESPONDING until the slurmd answers).
    assert sn2["State"].startswith("IDLE") and "DRAIN" not in sn2["State"] and "Reason" not in sn2
    wait_for(lambda: cluster.node_state("sn2") == "IDLE", 120, "sn2 idle once its slurmd answered")
    assert sn3["State"] == "IDLE+DRAIN" and sn3["Reason"].startswith("admin: fan replaced, burn-in pending")
    listed = sinfo(cluster)
    assert listed["sn1"][0] == "drained" and listed["sn2"][0] == "idle" and listed["sn3"][0] == "drained"

    # The run folder keeps what was done and when; report.json and report.md say it, the admin's node included.
    kept = json.loads((run_dir / "slurm.json").read_text())["actions"]
    assert [a["check_mode"] for a in kept] == [False]  # --check kept nothing
    latest = {d["slurm_node"]: d for d in kept[-1]["decisions"]}
    assert latest["sn1"]["done"] and latest["sn1"]["state_after"] == "IDLE+DRAIN"
    assert "left alone" in latest["sn3"]["why"] and "admin: fan replaced" in latest["sn3"]["why"]
    assert json.loads((run_dir / "report.json").read_text())["slurm"]["decisions"] == kept[-1]["decisions"]
    md = (run_dir / "report.md").read_text()
    assert md.count("## Slurm") == 1 and "- sn3 (sn3, pass, was IDLE+DRAIN): nothing done; left alone" in md


@pytest.mark.slow
@needs_slurm
def test_drain_alone_never_resumes_and_none_does_nothing(cluster, tmp_path):
    cluster.scontrol(
        "update", "nodename=sn2", "state=drain", f"reason={slurm.reason('run-0 hardware: gpu_health.ecc')}"
    )
    run_dir = make_run(tmp_path, "run-2", failing=["sn1"], passing=["sn2", "sn3"])
    assert act(cluster, run_dir).returncode == 0  # the default: none
    assert [cluster.node_state(n) for n in ("sn1", "sn2", "sn3")] == ["IDLE", "IDLE+DRAIN", "IDLE"]
    assert act(cluster, run_dir, "--action", "drain").returncode == 0
    assert [cluster.node_state(n) for n in ("sn1", "sn2", "sn3")] == ["IDLE+DRAIN", "IDLE+DRAIN", "IDLE"]
    # slurmctld keeps a longer reason whole: REASON_MAX_CHARS is gpufleet's own limit, for sinfo and people.
    cluster.scontrol("update", "nodename=sn3", "state=drain", "reason=" + "r" * 300)
    assert cluster.node("sn3")["Reason"].startswith("r" * 300 + " [")


@pytest.mark.slow
@needs_slurm
def test_breaker_trips_on_a_small_partition_and_never_blocks_resuming(cluster, tmp_path):
    cluster.scontrol(
        "update", "nodename=sn3", "state=drain", f"reason={slurm.reason('run-0 hardware: gpu_health.xid')}"
    )
    run_dir = make_run(tmp_path, "run-3", failing=["sn1", "sn2"], passing=["sn3"])
    # 2 of the partition's 3 nodes: past 50% (one node).
    done = act(cluster, run_dir, "--action", "drain_resume", "--max-drain", "50%")
    assert done.returncode == 1, done.stdout
    record = json.loads(done.stdout)
    assert record["breaker"]["tripped"] and sorted(record["breaker"]["would_drain"]) == ["sn1", "sn2"]
    assert "partition gpu: 2 of its 3 nodes, more than 50%" in record["breaker"]["why"]
    assert cluster.node_state("sn1") == "IDLE" and cluster.node_state("sn2") == "IDLE"
    wait_for(lambda: cluster.node_state("sn3") == "IDLE", 120, "sn3 resumed all the same")
    # As a count: 2 allowed, both drained.
    done = act(cluster, run_dir, "--action", "drain", "--max-drain", "2")
    assert done.returncode == 0, done.stdout
    assert sinfo(cluster)["sn1"][0] == "drained" and sinfo(cluster)["sn2"][0] == "drained"


@pytest.mark.slow
@needs_slurm
def test_bad_input_names_the_variable(cluster, tmp_path):
    run_dir = make_run(tmp_path, "run-4", failing=[], passing=["sn1"])
    done = act(cluster, run_dir, "--action", "drain", "--max-drain", "lots")
    assert done.returncode == 2 and "gpufleet_slurm_max_drain is 'lots'" in done.stderr
    done = act(cluster, run_dir, "--action", "drainresume")
    assert done.returncode == 2 and "gpufleet_slurm_action is 'drainresume'" in done.stderr


@pytest.mark.slow
@needs_slurm
def test_health_check_program_drains_its_node_on_an_xid(tmp_path):
    readings = tmp_path / "readings"
    readings.mkdir()
    # As slurmd runs it: no arguments, a bare environment with SLURMD_NODENAME; the recording of each node by name.
    program = tmp_path / "gpufleet-health.sh"
    program.write_text(f"""#!/bin/sh
export SLURM_CONF={tmp_path}/conf-link PYTHONPATH={REPO / "src"}
exec {sys.executable} -m gpufleet check --slurm-health --readings {readings}/$SLURMD_NODENAME.json --thresholds '{THRESHOLDS}'
""")
    program.chmod(0o755)
    for name in ("sh1", "sh2"):
        healthy_readings(readings / f"{name}.json")
    with SlurmCluster(["sh1", "sh2"], net=NET, tag=TAG, health_check=program) as cluster:
        (tmp_path / "conf-link").symlink_to(cluster.conf)
        cluster.wait_idle()
        health_log = cluster.dir / "slurmd-sh1.log"
        # Both healthy until sh1's readings show an Xid; sh2's stay healthy, and it stays in service.
        xid_readings(readings / "sh1.json")
        wait_for(
            lambda: cluster.node_state("sh1") == "IDLE+DRAIN", 180, f"the health check draining sh1 (log {health_log})"
        )
        reason = cluster.node("sh1")["Reason"]
        assert reason.startswith("gpufleet: health hardware: xid GPU 0: Xid 79 at 0000:00:06"), reason
        assert sinfo(cluster)["sh1"][0] == "drained"
        assert cluster.node_state("sh2") == "IDLE"
        # sh2's driver goes (libnvidia-ml.so no longer loads): NVML reads nothing, every check errs for that one
        # cause, and the node is drained with it as the reason.
        no_driver_readings(readings / "sh2.json")
        wait_for(
            lambda: cluster.node_state("sh2") == "IDLE+DRAIN", 180, f"the health check draining sh2 (log {health_log})"
        )
        reason = cluster.node("sh2")["Reason"]
        assert reason.startswith("gpufleet: health software: no NVIDIA driver: libnvidia-ml.so not found ("), reason
        assert sinfo(cluster)["sh2"][0] == "drained"


@pytest.mark.slow
def test_health_check_is_silent_when_healthy_and_says_what_it_would_drain(tmp_path):
    done = gpufleet(
        "check", "--slurm-health", "--readings", str(healthy_readings(tmp_path / "ok.json")), "--thresholds", THRESHOLDS
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    done = gpufleet(
        "check",
        "--slurm-health",
        "--dry-run",
        "--slurm-node",
        "n7",
        "--readings",
        str(xid_readings(tmp_path / "x.json")),
        "--thresholds",
        THRESHOLDS,
    )
    assert done.returncode == 1 and done.stdout.startswith(
        "would drain n7: gpufleet: health hardware: xid GPU 0: Xid 79"
    )
    # A node whose driver is gone (no libnvidia-ml.so, or NVML unable to start) is drained with that as the cause;
    # one whose gpufleet lacks nvidia-ml-py is not: the GPUs may be fine, gpufleet could not read them.
    done = gpufleet(
        "check",
        "--slurm-health",
        "--dry-run",
        "--slurm-node",
        "n7",
        "--readings",
        str(no_driver_readings(tmp_path / "nd.json")),
        "--thresholds",
        THRESHOLDS,
    )
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(
        r"would drain n7: gpufleet: health software: no NVIDIA driver: libnvidia-ml\.so not found "
        r"\(\d+ checks\)\n",
        done.stdout,
    ), done.stdout
    for error in ("NVML init failed: Driver Not Loaded", "nvidia-ml-py is not installed: No module named 'pynvml'"):
        readings = json.loads((tmp_path / "nd.json").read_text())
        readings["nvml"]["error"] = error
        (tmp_path / "e.json").write_text(json.dumps(readings))
        done = gpufleet(
            "check",
            "--slurm-health",
            "--dry-run",
            "--slurm-node",
            "n7",
            "--readings",
            str(tmp_path / "e.json"),
            "--thresholds",
            THRESHOLDS,
        )
        assert done.returncode == (1 if error.startswith("NVML init") else 0), (error, done.stdout)
    assert (
        done.stdout == ""
        and "could not read the GPUs, node left in service: nvidia-ml-py is not installed" in done.stderr
    )
    # The epilog also fails on a process left on a GPU.
    readings = json.loads(healthy_readings(tmp_path / "ok.json").read_text())
    readings["nvml"]["gpus"][0]["processes"] = [{"pid": 4242, "name": "python", "used_memory_mib": 1024}]
    (tmp_path / "p.json").write_text(json.dumps(readings))
    args = [
        "check",
        "--dry-run",
        "--slurm-node",
        "n7",
        "--readings",
        str(tmp_path / "p.json"),
        "--thresholds",
        THRESHOLDS,
    ]
    assert gpufleet(*args, "--slurm-health").returncode == 0
    done = gpufleet(*args, "--slurm-health", "epilog")
    assert done.returncode == 1 and "processes GPU 0: pid 4242 (python, 1024 MiB)" in done.stdout, done.stdout


@pytest.mark.slow
@needs_slurm
def test_replacement_taken_over_from_an_admin_drain_and_resumed_once_accepted(cluster, tmp_path):
    # The repaired node comes back drained by the administrator; `gpufleet fleet accept new --slurm` takes it over
    # before testing it (run_prepare has made the run folder), then acts on the verdict.
    cluster.scontrol("update", "nodename=sn1", "state=drain", "reason=admin: GPU 3 replaced")
    run_dir = tmp_path / "run-5"
    run_dir.mkdir()
    done = gpufleet("slurm", str(run_dir), "--take-over", "new", "--slurm-name", "new=sn1", "--json", env=cluster.env())
    assert done.returncode == 0, done.stderr
    sn1 = cluster.node("sn1")
    assert sn1["State"] == "IDLE+DRAIN" and sn1["Reason"].startswith(
        "gpufleet: run-5 accepting, was IDLE+DRAIN: admin: GPU 3"
    )
    (run_dir / "hosts").mkdir()
    done = gpufleet(
        "check",
        "--group",
        "gpu_inventory",
        "--group",
        "gpu_health",
        "--readings",
        str(healthy_readings(tmp_path / "ok.json")),
        "--host",
        "new",
        "--json",
        "--thresholds",
        THRESHOLDS,
    )
    (run_dir / "hosts" / "new.json").write_text(done.stdout)
    assert json.loads(gpufleet("report", str(run_dir), "--no-store", "--json").stdout)["verdict"] != "fail"
    done = act(cluster, run_dir, "--action", "drain_resume", "--slurm-name", "new=sn1")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: cluster.node_state("sn1") == "IDLE", 120, "the accepted replacement back in service")
    kept = json.loads((run_dir / "slurm.json").read_text())["actions"]
    assert [a["action"] for a in kept] == ["take_over", "drain_resume"]
    assert kept[0]["decisions"][0]["reason_before"].startswith("admin: GPU 3 replaced")
    assert kept[1]["decisions"][0]["do"] == "resume" and kept[1]["decisions"][0]["done"]


@needs_slurm
@pytest.mark.slow
def test_fleet_accept_slurm_takes_the_node_over_and_drains_it_with_the_runs_reason(cluster, tmp_path):
    """`gpufleet fleet accept sn1 --slurm`: a real validate.yml over the test host sn1 (ssh into its namespace). On a
    machine without a GPU the node is not accepted: taken over from the administrator's drain before the checks,
    drained with the run's reason after the report (which fails the run); the other nodes untouched."""
    pytest.importorskip("ansible_runner")
    cluster.scontrol("update", "nodename=sn1", "state=drain", "reason=admin: GPU 3 replaced")
    cluster.scontrol("update", "nodename=sn3", "state=drain", "reason=admin: leave me")
    nodes = {
        n: {"gpufleet_node_env": dict(cluster.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"))}
        for n in cluster.names
    }
    inv = cluster.inventory(tmp_path / "inventory.yml", host_vars=nodes, gpufleet_benchmarks=[])
    env = dict(
        cluster.env(),
        PYTHONPATH=str(REPO / "src"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        **cluster.ssh_env(),
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "gpufleet"),
            "fleet",
            "accept",
            "sn1",
            "-i",
            str(inv),
            "--reports-dir",
            str(tmp_path / "reports"),
            "--run-id",
            "accept-1",
            "--slurm",
            "--plain",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    sn1 = cluster.node("sn1")
    assert sn1["State"] == "IDLE+DRAIN" and sn1["Reason"].startswith("gpufleet: accept-1 "), sn1
    assert "accepting" not in sn1["Reason"]
    assert cluster.node_state("sn2") == "IDLE" and cluster.node("sn3")["Reason"].startswith("admin: leave me")
    kept = json.loads((tmp_path / "reports" / "accept-1" / "slurm.json").read_text())["actions"]
    assert [a["action"] for a in kept] == ["take_over", "drain_resume"]
    assert kept[0]["decisions"][0]["reason_before"].startswith("admin: GPU 3 replaced")
    assert [d["slurm_node"] for d in kept[1]["decisions"]] == ["sn1"] and kept[1]["decisions"][0]["done"]


@needs_slurm
@pytest.mark.slow
def test_playbook_check_mode_names_the_action_and_changes_nothing_and_bad_input_stops_first(cluster, tmp_path):
    """validate.yml itself (ansible-playbook): a bad gpufleet_slurm_max_drain stops the run before any node is
    touched, naming the variable; --check measures nothing (docs/slurm.md), so it names the action a real run would
    take, leaves no run behind, and the node stays idle. `gpufleet slurm RUN --check` shows the drains of a run
    (test_failing_drained_with_reason_own_drain_resumed_admin_drain_left_alone)."""
    nodes = {
        n: {"gpufleet_node_env": dict(cluster.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"))}
        for n in cluster.names
    }
    inv = cluster.inventory(tmp_path / "inventory.yml", host_vars=nodes, gpufleet_benchmarks=[])
    env = playbook_env(tmp_path, cluster.env(), PYTHONPATH=str(REPO / "src"), **cluster.ssh_env())

    def playbook(run_id: str, *args: str) -> subprocess.CompletedProcess:
        return run_playbook(
            "validate.yml",
            inv,
            "--limit",
            "sn2",
            "-e",
            "gpufleet_slurm_action=drain_resume",
            *args,
            env=env,
            timeout_s=900,
            run_id=run_id,
            reports=tmp_path / "reports",
        )

    done = playbook("bad", "-e", "gpufleet_slurm_max_drain=lots")
    assert done.returncode != 0 and 'gpufleet_slurm_max_drain is "lots"' in done.stdout, done.stdout[-3000:]
    assert not (tmp_path / "reports" / "bad" / "hosts").exists()
    done = playbook("checked", "--check")
    # The node answered; nothing was judged, and check mode names what a real run lacks there (no NVIDIA driver).
    assert done.returncode == 2 and "(lacks: gpu_inventory.gpu_count: no NVIDIA driver" in " ".join(done.stdout.split())
    assert "in Slurm: gpufleet_slurm_action drain_resume." in " ".join(done.stdout.split()), done.stdout[-3000:]
    assert cluster.node_state("sn2") == "IDLE" and sinfo(cluster)["sn2"][0] == "idle"
    assert not (tmp_path / "reports" / "checked").exists()
