"""The remediation ladder climbed by sweeps alone, against a real Slurm (tests/slurm_cluster.py, with a sweep
partition that `gpu` preempts): a node gpufleet drained is measured again by a sweep job on the drained node, inside
a reservation no user's job can enter, while a real user's job waits for that node; a hand resume ends the node's
episode; two nodes' faults stay apart; the missing driver is one cause of one class; a value from a document
cannot run anything in a node's shell over ssh.

The hardware path replays recorded H100 readings inside the Slurm jobs (`gpufleet node-stage --readings`), the
site's commands are stand-ins that record their calls, and the site's acceptance is the real replacement flow
(`gpufleet slurm --take-over`, the report, `gpufleet slurm --action drain_resume`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.base import schema, slurm
from gpufleet.collect import nvml
from gpufleet.fleet import service_log
from gpufleet.service import commands
from gpufleet.service.ladder import with_outcomes
from service_runs import (
    SERIAL,
    SWEEP,
    THRESHOLDS,
    calls_of,
    gpufleet,
    job_state,
    judged_run,
    needs_slurm,
    readings,
    sbatch,
    stand_in,
    sweep_args,
)
from slurm_cluster import SlurmCluster
from waiting import wait_for

pytestmark = pytest.mark.slow  # a real Slurm in test hosts

NET, TAG = 248, "gfx"
NEW_SERIAL = "9990001112223"


@pytest.fixture
def cluster():
    with SlurmCluster(["sn1", "sn2", "sn3"], net=NET, tag=TAG, sweep_partition=SWEEP) as c:
        c.wait_idle()
        yield c


class JobWatch:
    """Every state a job shows (squeue, read back all the time) until stopped: a user's job that ran even for a
    moment on a node meant to be closed to it is seen."""

    def __init__(self, cluster: SlurmCluster, job_id: str):
        self.cluster, self.job_id, self.seen = cluster, job_id, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(
                ["squeue", "-h", "-j", self.job_id, "-o", "%T|%N"],
                env=self.cluster.env(),
                capture_output=True,
                text=True,
            ).stdout.strip()
            if out and (not self.seen or self.seen[-1] != out):
                self.seen.append(out)
            self.stop.wait(0.2)

    def states(self) -> set[str]:
        return {s.split("|")[0] for s in self.seen}


def sweep(cluster, args: list[str], run_id: str, *more: str) -> subprocess.CompletedProcess:
    done = gpufleet(*args, "--run-id", run_id, *more, env=cluster.env())
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return done


def ladder_steps(run_dir: Path, host: str = "sn1") -> list[dict]:
    return [s for s in json.loads((run_dir / "ladder.json").read_text())["steps"] if s["host"] == host]


def prometheus(run_dir: Path) -> dict:
    text = (run_dir / "prometheus" / "gpufleet-service.prom").read_text()
    return {
        (f.name, tuple(sorted(x.labels.items()))): x.value
        for f in text_string_to_metric_families(text)
        for x in f.samples
    }


def acceptance_command(path: Path, reports: Path, recorded: Path, calls: Path) -> Path:
    """The site's acceptance of a node, as `gpufleet fleet accept NODE --slurm` does it: a run of its own that takes
    the node over, checks it (here its recorded readings), reports, and resumes it only when accepted."""
    run = f"{reports}/accept-$1"
    gf = f"{sys.executable} -m gpufleet"
    path.write_text(
        f'#!/bin/sh\nset -e\necho "accept $1" >> {calls}\n'
        f"{gf} run start {reports} accept-$1 --host $1 --tier acceptance\n"
        f"{gf} slurm {run} --take-over $1\nmkdir -p {run}/hosts\n"
        f"{gf} check --readings {recorded}/$1.json --host $1 --json --exit-zero --thresholds '{THRESHOLDS}'"
        f" > {run}/hosts/$1.json\n{gf} report {run} > /dev/null\n{gf} slurm {run} --action drain_resume\n"
    )
    path.chmod(0o755)
    return path


@needs_slurm
def test_the_ladder_climbs_through_sweeps_alone_and_no_user_job_lands_on_the_node(cluster, tmp_path):
    reports, calls = tmp_path / "reports", tmp_path / "calls"
    args = sweep_args(tmp_path, sys.executable, "--benchmarks", "--max-share", "1", "--submit")
    recorded = tmp_path / "readings"
    readings(recorded / "sn1.json", xids=1)  # a recurring Xid 79, replayed in every sweep job on sn1
    args += [
        "--action",
        "drain_resume",
        "--act",
        "all",
        f"--command=reset_gpu={stand_in(tmp_path / 'reset', calls, 'reset')} {{gpu_index}} {{slurm_node}}",
        f"--command=reboot={stand_in(tmp_path / 'reboot', calls, 'reboot')} {{slurm_node}}",
        f"--command=reaccept={acceptance_command(tmp_path / 'accept', reports, recorded, calls)} {{host}}",
    ]
    # sn2 and sn3 run users' jobs throughout: every sweep has sn1 alone to look at.
    for node in ("sn2", "sn3"):
        busy = sbatch(cluster, "-p", "gpu", "-w", node, "--wrap", "sleep 100000")
        wait_for(lambda job=busy: job_state(cluster, job) == "RUNNING", 120, f"a user's job on {node}")

    # The fault found by a sweep of the idle node, drained, its first step (a re-test) taken; the console says why.
    done = sweep(cluster, args, "s1")
    assert "sn1 not accepted: gpu_health.xid: " in done.stdout and "Xid 79" in done.stdout, done.stdout[-3000:]
    assert cluster.node("sn1")["Reason"].startswith("gpufleet hw xid; run s1")
    assert [s["step"] for s in ladder_steps(reports / "s1") if s.get("done")] == ["retest"]
    drained_at = prometheus(reports / "s1")[("gpufleet_drained_timestamp_seconds", (("node", "sn1"),))]
    # A user's job that wants sn1 waits from now on; it must not start there until the node is back in service.
    user = sbatch(cluster, "-p", "gpu", "-w", "sn1", "--wrap", "sleep 100000")
    watch = JobWatch(cluster, user)
    try:
        # Each sweep measures the drained node again in its reservation, and the ladder climbs.
        for run_id, step, called in (
            ("s2", "reset_gpu", ["reset 0 sn1"]),
            ("s3", "reboot", ["reset 0 sn1", "reboot sn1"]),
            ("s4", "rma", ["reset 0 sn1", "reboot sn1"]),
        ):
            done = sweep(cluster, args, run_id)
            record = json.loads((reports / run_id / "sweep.json").read_text())
            assert (
                record["plan"]["retest"].keys() == {"sn1"} and "not measured since" in record["plan"]["retest"]["sn1"]
            )
            [job] = record["jobs"]
            assert job["judged"] and f"--reservation={job['retest']['reservation']}" in job["sbatch"], job
            assert job["retest"]["closed"] and job["retest"]["reservation"] not in slurm_reservations(cluster)
            assert [s["step"] for s in ladder_steps(reports / run_id) if s.get("done")] == [step], done.stdout[-2000:]
            assert calls_of(calls) == called and cluster.node_state("sn1") == "IDLE+DRAIN"
            assert job_state(cluster, user) == "PENDING"
            # Each re-test drains the node again (Slurm's reason time moves); the first drain's time stays here.
            assert (
                prometheus(reports / run_id)[("gpufleet_drained_timestamp_seconds", (("node", "sn1"),))] == drained_at
            )
        assert cluster.node("sn1")["Reason"].startswith(f"gpufleet RMA hw xid GPU 0 serial {SERIAL}; run s4")

        # Handed over for repair: the next sweep leaves it alone, and says so.
        done = gpufleet(*args[: args.index("--submit")], "--json", env=cluster.env())
        assert "sn1" not in json.loads(done.stdout)["plan"]["retest"]
        # A person clears it once the board is replaced; it stays drained for the acceptance that alone resumes it.
        done = gpufleet(
            *["ladder", "--clear", "sn1", "--by", "alice", "--note", "GPU 0 replaced", "--reports-dir", str(reports)],
            env=cluster.env(),
        )
        assert done.returncode == 0, done.stderr
        readings(recorded / "sn1.json", serial=NEW_SERIAL)  # the new board: healthy

        # A sweep stopped (killed) once it had reserved and resumed the node leaves the node reserved, never open.
        stopped = subprocess.Popen([sys.executable, "-m", "gpufleet", *args, "--run-id", "s5"], env=cluster.env())
        try:
            wait_for(lambda: _opened(reports / "s5"), 300, "the sweep's reservation of sn1")
        finally:
            stopped.send_signal(signal.SIGKILL)
            stopped.wait()
        wait_for(lambda: not _sweep_jobs(cluster), 300, "no sweep job left in Slurm")
        assert "gpufleet-retest-sn1" in slurm_reservations(cluster) and "DRAIN" not in cluster.node_state("sn1")
        assert job_state(cluster, user) == "PENDING"

        # The next sweep closes what the stopped one left, measures the node again, finds the new serial and sends the
        # node through the site's acceptance, which resumes it: back in service on a serial change.
        done = sweep(cluster, args, "s6")
        record = json.loads((reports / "s6" / "sweep.json").read_text())
        assert [c["reservation"] for c in record["left_over"]] == ["gpufleet-retest-sn1"]
        assert record["left_over"][0]["drained"].startswith("gpufleet REACCEPT RMA cleared by alice; run ladder-clear-")
        steps = ladder_steps(reports / "s6")
        assert [s["step"] for s in steps] == ["restart", "reaccept"] and steps[1]["done"], done.stdout[-3000:]
        assert f"GPU 0 serial {SERIAL} -> {NEW_SERIAL}" in steps[0]["why"]
        assert steps[1]["reason"] == f"gpufleet REACCEPT GPU 0 serial {SERIAL} to {NEW_SERIAL}; run s6"  # not `-_`
        assert calls_of(calls)[-1] == "accept sn1"
        wait_for(lambda: "RUNNING" in watch.states(), 180, "the user's job on sn1, back in service")
    finally:
        watch.stop.set()
        watch.thread.join()
    # Until the node was back, the user's job only ever waited: it never ran on sn1 between the steps.
    assert watch.seen[0].startswith("PENDING") and watch.states() == {"PENDING", "RUNNING"}, watch.seen
    assert [s for s in watch.seen if s.startswith("RUNNING")] == [watch.seen[-1]] == ["RUNNING|sn1"]
    assert slurm_reservations(cluster) == {}

    # The whole ladder in the node's history, each step's outcome; the episode closed by the acceptance's resume.
    hist = json.loads(gpufleet("history", "sn1", "--reports-dir", str(reports), "--json").stdout)["service"]
    taken = [s for s in with_outcomes(hist["ladder"]) if s.get("done") and s["step"] not in ("none",)]
    assert [s["step"] for s in taken] == ["retest", "reset_gpu", "reboot", "rma", "clear", "restart", "reaccept"]
    assert [s["outcome"] for s in taken[:3]] == [f"fault again in run s{i} (gpu_health.xid)" for i in (2, 3, 4)]
    [fault] = hist["costs"]["faults"]
    assert fault["first_sign_run"] == "s1" and fault["resumed_by"] == "gpufleet" and fault["return_s"] is not None
    prom = prometheus(reports / "s6")
    # Every step taken counts (it read 0 once the ladder closed); where the ladder stands now, apart.
    assert prom[("gpufleet_ladder_steps_taken", (("node", "sn1"),))] == 5  # retest, reset, reboot, rma, reaccept
    assert prom[("gpufleet_ladder_rung", (("node", "sn1"),))] == 1  # reaccept, since the restart closed it
    assert prom[("gpufleet_out_of_service", (("cause", "gpufleet"), ("node", "sn1")))] == 0
    assert prom[("gpufleet_return_to_service_seconds", (("node", "sn1"),))] == fault["return_s"]


def slurm_reservations(cluster) -> dict:
    out = cluster.scontrol("show", "reservation", "-o")
    return {slurm.fields(line)["ReservationName"]: line for line in out.splitlines() if "ReservationName=" in line}


def _opened(run_dir: Path) -> bool:
    try:
        jobs = json.loads((run_dir / "sweep.json").read_text())["jobs"]
    except (OSError, ValueError, KeyError):
        return False
    return any((j.get("retest") or {}).get("opened") for j in jobs)


def _sweep_jobs(cluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "--name", "gpufleet-sweep", "-o", "%i"], env=cluster.env(), capture_output=True, text=True
    )
    return out.stdout.split()


@needs_slurm
def test_a_hand_resume_ends_the_episode_and_two_nodes_faults_stay_apart(cluster, tmp_path):
    reports = tmp_path / "reports"
    args = sweep_args(tmp_path, sys.executable, "--benchmarks", "--max-share", "100%", "--submit")
    args += ["--action", "drain_resume"]
    recorded = tmp_path / "readings"
    readings(recorded / "sn3.json", no_driver=True)

    # sn3 has no driver: one cause of one class, which the console, the drain and the ladder name.
    done = sweep(cluster, args, "h1")
    assert done.returncode == 1 and "sn3 not accepted: no NVIDIA driver: libnvidia-ml.so not found (18 checks: " in (
        done.stdout
    ), done.stdout[-3000:]
    doc = json.loads((reports / "h1" / "hosts" / "sn3.json").read_text())
    driver = [r for r in doc["results"] if r.get("reason") == nvml.NO_DRIVER]
    assert len(driver) == 18 and {r["class"] for r in driver} == {"software"}  # gpu_health.processes too
    [step] = ladder_steps(reports / "h1", "sn3")
    assert step["step"] == "retest" and step["fault"]["class"] == "software", step
    assert step["fault"]["check"].startswith("no NVIDIA driver") and "processes" not in step["why"], step
    assert cluster.node("sn3")["Reason"].startswith("gpufleet sw no NVIDIA driver")
    # Its history names the one cause, not its 18 checks one by one.
    text = gpufleet("history", "sn3", "--reports-dir", str(reports)).stdout
    [row] = [line for line in text.splitlines() if line.startswith("h1 ")]
    assert f"{nvml.NO_DRIVER} (18 checks) error (software)" in row and "gpu_inventory.gpu_count" not in row, row
    prom = prometheus(reports / "h1")
    assert prom[("gpufleet_drained_timestamp_seconds", (("node", "sn3"),))] > 0

    # Someone resumes it by hand once the driver is back; the next sweep sees it in service and ends its episode.
    resumed = service_log.epoch(schema.utc_now())
    cluster.scontrol("update", "nodename=sn3", "state=resume")
    readings(recorded / "sn3.json")
    sweep(cluster, args, "h2")
    seen = [a for a in json.loads((reports / "h2" / "slurm.json").read_text())["actions"] if a["action"] == "seen"]
    assert [d["slurm_node"] for a in seen for d in a["decisions"]] == ["sn3"]
    prom = prometheus(reports / "h2")
    assert prom[("gpufleet_out_of_service", (("cause", "gpufleet"), ("node", "sn3")))] == 0
    assert prom[("gpufleet_fleet_nodes_out_of_service", (("cause", "gpufleet"),))] == 0
    costs = history_costs(reports, "sn3")
    [episode] = costs["faults"]
    assert episode["first_sign_run"] == "h1" and episode["resumed_by"].startswith("someone else")
    assert resumed <= service_log.epoch(episode["resumed_at"]) and episode["return_s"] is not None
    assert prom[("gpufleet_return_to_service_seconds", (("node", "sn3"),))] == episode["return_s"]
    assert "| sn3 |" in (md := (reports / "h2" / "report.md").read_text()) and "(resumed by hand, seen)" in md

    # Another node's fault is an episode of its own: drained, re-tested on the drained node, resumed by gpufleet.
    readings(recorded / "sn1.json", xids=1)
    sweep(cluster, args, "h3", "--act", "retest")
    assert cluster.node("sn1")["Reason"].startswith("gpufleet hw xid; run h3")
    readings(recorded / "sn1.json")
    sweep(cluster, args, "h4", "--act", "retest")
    assert json.loads((reports / "h4" / "sweep.json").read_text())["plan"]["retest"].keys() == {"sn1"}
    wait_for(lambda: cluster.node_state("sn1") == "IDLE", 120, "sn1 resumed once the re-test passed")
    sn1, sn3 = history_costs(reports, "sn1"), history_costs(reports, "sn3")
    [fault] = sn1["faults"]
    assert fault["first_sign_run"] == "h3" and fault["resumed_by"] == "gpufleet"
    assert fault["fault_to_drain_s"] is not None and fault["return_s"] is not None
    assert sn3["faults"] == [episode]  # sn3's episode is as it was: nothing of sn1's in it
    fleet = json.loads(gpufleet("history", "sn1", "--reports-dir", str(reports), "--json").stdout)
    assert fleet["service"]["costs"]["out_of_service"] is False
    prom = prometheus(reports / "h4")
    assert prom[("gpufleet_fleet_nodes_out_of_service", (("cause", "gpufleet"),))] == 0
    assert prom[("gpufleet_fleet_median_return_to_service_seconds", ())] == pytest.approx(
        (fault["return_s"] + episode["return_s"]) / 2, abs=0.1
    )


def history_costs(reports: Path, host: str) -> dict:
    return json.loads(gpufleet("history", host, "--reports-dir", str(reports), "--json").stdout)["service"]["costs"]


@needs_slurm
def test_a_value_from_a_document_cannot_run_anything_in_a_node_shell(cluster, tmp_path):
    """Over a real ssh to a test host: a command the operator wrote runs there (the control), a value of the wrong
    shape from a document stops the command, and a value of its shape with shell words in it stays one word."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host sn1\n  HostName {cluster.address('sn1')}\n  User root\n  IdentityFile {cluster.key}\n  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 20\n"
    )
    host_tmp = cluster.root("sn1") / "tmp"
    done = commands.run(commands.words(f"ssh -F {config} {{host}} touch /tmp/control", {"host": "sn1"}))
    assert done["rc"] == 0 and (host_tmp / "control").exists(), done  # the path works: a word the operator wrote runs

    # A reason (of its shape, so it passes) with shell words in it: one word on the node, echoed, nothing run.
    argv = commands.words(f"ssh -F {config} {{host}} echo {{reason}}", {"host": "sn1", "reason": "x; touch /tmp/x"})
    done = commands.run(argv)
    assert done["rc"] == 0 and done["output"].strip() == "x; touch /tmp/x" and not (host_tmp / "x").exists(), done

    # A GPU index from a host document, as the ladder takes it for the site's reset: refused, named, nothing run.
    reports = tmp_path / "reports"
    bad, good = readings(tmp_path / "xid.json", xids=1), readings(tmp_path / "ok.json")
    reset = f"--command=reset_gpu=ssh -F {config} {{host}} touch /tmp/reset-{{gpu_index}}"
    for run_id in ("r1", "r2"):
        run_dir = judged_run(reports, run_id, {"sn1": bad, "sn2": good}, cluster.env())
        host_doc = run_dir / "hosts" / "sn1.json"
        doc = json.loads(host_doc.read_text())
        for r in doc["results"]:
            for gpu in (r.get("detail") or {}).get("flagged_gpus") or []:
                gpu["index"] = "0; touch /tmp/x"
        host_doc.write_text(json.dumps(doc))
        assert gpufleet("report", str(run_dir), env=cluster.env()).returncode == 1
        assert gpufleet("slurm", str(run_dir), "--action", "drain", env=cluster.env()).returncode == 0
        done = gpufleet("ladder", str(run_dir), "--json", "--act", "all", reset, env=cluster.env())
    [step] = [s for s in json.loads(done.stdout)["steps"] if s["host"] == "sn1"]
    assert step["step"] == "reset_gpu" and not step["done"] and step["failed"] and done.returncode == 1, step
    assert "{gpu_index} would be '0; touch /tmp/x'; expected a GPU index" in step["not_done"], step
    assert "run r2's document" in step["not_done"] and not (host_tmp / "x").exists()
    # No reset-* either: nothing ran (the host's /tmp may hold other files of this machine: only ours are counted).
    assert not [p.name for p in host_tmp.iterdir() if p.name.startswith("reset-")]
