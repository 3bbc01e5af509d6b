"""The fleet kept in service, against a real Slurm (tests/slurm_cluster.py: Debian's slurmctld, slurmd and munged on
the network-namespace test hosts, with a sweep partition that the partition `gpu` preempts): sweeps of idle nodes as
Slurm jobs running the real engine inside them (`srun gpufleet node-stage`), the remediation ladder over recorded
readings with the site's commands as stand-in scripts that record their calls, a replaced GPU sent back through
acceptance, and the evidence bundle with secrets passed in and grepped for.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.base import registry, schema, slurm
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet import service_log
from gpufleet.fleet.store import Store
from gpufleet.service import commands, ladder, policy, retest, sweep
from service_runs import (
    REPO,
    SERIAL,
    SWEEP,
    calls_of,
    gpufleet,
    job_state,
    judged_run,
    ladder_cmd,
    needs_slurm,
    readings,
    sbatch,
    slurm_fields,
    stand_in,
    steps_of,
    sweep_args,
    sweep_started,
)
from playbooks import playbook_env, run_playbook
from slurm_cluster import SlurmCluster
from waiting import wait_for

NET, TAG = 247, "gfw"


@pytest.fixture
def cluster():
    with SlurmCluster(["sn1", "sn2", "sn3"], net=NET, tag=TAG, sweep_partition=SWEEP) as c:
        c.wait_idle()
        yield c


@pytest.mark.slow
@needs_slurm
def test_a_sweep_takes_idle_nodes_only_and_each_document_reaches_the_report(cluster, tmp_path):
    busy = sbatch(cluster, "-p", "gpu", "-w", "sn2", "--wrap", "sleep 100000")
    wait_for(lambda: job_state(cluster, busy) == "RUNNING", 120, "a user's job running on sn2")
    args = sweep_args(tmp_path, sys.executable, "--max-share", "50%")

    # The plan alone: sn1 taken (two idle nodes, 50%: one at once), sn3 deferred, sn2 skipped as busy; nothing submitted.
    done = gpufleet(*args, "--json", env=cluster.env())
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)["plan"]
    assert planned["chosen"] == ["sn1"] and planned["skipped"] == {"sn2": "running a job (ALLOCATED)"}
    assert list(planned["deferred"]) == ["sn3"] and "over the share" in planned["deferred"]["sn3"]
    assert cluster.scontrol("show", "job", "-o").count("JobId=") == 1  # the user's job alone
    assert not (tmp_path / "reports" / "sw-1").exists()

    # Submitted: one exclusive job on sn1, the real engine inside it (checks, counters, the smoke benchmarks on CPU);
    # the node accepted, its certificate renewed with the site's key (docs/certificates.md).
    key = tmp_path / "keys" / "site.key"
    assert gpufleet("keygen", str(key)).returncode == 0
    done = gpufleet(*args, "--submit", "--run-id", "sw-1", "--certify-key", str(key), env=cluster.env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "reports" / "sw-1"
    cert = run_dir / "certificates" / "nodes" / "sn1.intoto.json"
    verified = gpufleet(
        "verify", str(cert), "--pubkey", f"{key}.pub", "--document", str(run_dir / "hosts" / "sn1.json")
    )
    assert verified.returncode == 0 and "run sw-1 (smoke)" in verified.stdout, verified
    record = json.loads((run_dir / "sweep.json").read_text())
    [job] = record["jobs"]
    assert job["node"] == "sn1" and job["state"] == "COMPLETED" and job["judged"] and job["gpus"] == 1
    assert job["gpu_hours"] > 0 and "--exclusive" in job["sbatch"] and "--no-requeue" in job["sbatch"]
    shown = slurm_fields(cluster, job["job_id"])
    assert shown["Partition"] == SWEEP and shown["NodeList"] == "sn1" and shown["Nice"] == str(sweep.DEFAULT_NICE)
    doc = json.loads((run_dir / "hosts" / "sn1.json").read_text())
    groups = {r["group"] for r in doc["results"]}
    assert {"lock", "gpu_inventory", "gpu_health", "host_hygiene", "counters", "benchmark"} <= groups, groups
    rep = json.loads((run_dir / "report.json").read_text())
    assert list(rep["nodes"]) == ["sn1"] and rep["nodes"]["sn1"]["verdict"] in ("pass", "warn"), rep["nodes"]["sn1"]
    assert rep["service"]["sweep"]["plan"]["skipped"]["sn2"] == "running a job (ALLOCATED)"
    md = (run_dir / "report.md").read_text()
    assert "## Fleet in service" in md and "- skipped sn2: running a job (ALLOCATED)" in md and "- deferred sn3:" in md
    prom = {
        f.name: f
        for f in text_string_to_metric_families((run_dir / "prometheus" / "gpufleet-service.prom").read_text())
    }
    [gpu_s] = [
        x.value for x in prom["gpufleet_sweep_gpu_seconds"].samples if x.labels == {"node": "sn1", "window": "all"}
    ]
    # GPU-seconds from the job's seconds, not from its GPU-hours rounded to four decimals (17 s, not 16.92).
    assert gpu_s == job["gpu_seconds"] == job["elapsed_s"] * job["gpus"]
    assert all(name.endswith(("_seconds", "_sweeps", "_service", "_taken", "_rung")) for name in prom), list(prom)
    assert job_state(cluster, busy) == "RUNNING"  # the user's job never noticed

    # The sweep's cost per node is in the history too, and the store holds the job.
    hist = json.loads(gpufleet("history", "sn1", "--reports-dir", str(tmp_path / "reports"), "--json").stdout)
    assert hist["service"]["costs"]["sweeps"] == 1 and hist["service"]["costs"]["sweep_gpu_hours"] == job["gpu_hours"]
    assert "sweeps 1" in gpufleet("history", "sn1", "--reports-dir", str(tmp_path / "reports")).stdout
    # The run folder is the record: a store rebuilt from the folders holds the same events.
    (tmp_path / "reports" / "gpufleet.db").unlink()
    assert gpufleet("store", "rebuild", "--reports-dir", str(tmp_path / "reports")).returncode == 0
    again = json.loads(gpufleet("history", "sn1", "--reports-dir", str(tmp_path / "reports"), "--json").stdout)
    assert again["service"] == hist["service"]


@pytest.mark.slow
@needs_slurm
def test_a_normal_job_preempts_a_sweep_job_and_the_node_gets_no_verdict(cluster, tmp_path):
    # The node's interpreter is the real one, and then the job stays on the node until preempted: the engine has
    # written the node's document by the time a user's job comes.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n{sys.executable} "$@" || exit $?\nexec sleep 100000\n')
    python.chmod(0o755)
    args = sweep_args(tmp_path, str(python), "--max-share", "1", "--submit", "--run-id", "sw-2")
    with sweep_started(cluster, args) as sweeping:
        run_dir = tmp_path / "reports" / "sw-2"
        wait_for(
            lambda: (run_dir / "hosts" / "sn1.json").exists() and (run_dir / "sweep.json").exists(),
            300,
            "the sweep job's document of sn1",
        )
        [job] = json.loads((run_dir / "sweep.json").read_text())["jobs"]
        wait_for(
            lambda: json.loads((run_dir / "hosts" / "sn1.json").read_text()).get("seconds") is not None,
            300,
            "the node stage finished",
        )
        user = sbatch(cluster, "-p", "gpu", "-w", "sn1", "--wrap", "sleep 100000")
        wait_for(lambda: job_state(cluster, user) == "RUNNING", 180, "the user's job running on sn1")
        out, err = sweeping.communicate(timeout=600)
    assert sweeping.returncode == 0, out[-3000:] + err[-3000:]
    assert job_state(cluster, job["job_id"]) == "PREEMPTED"
    [ended] = json.loads((run_dir / "sweep.json").read_text())["jobs"]
    assert ended["state"] == "PREEMPTED" and not ended["judged"] and ended["note"].startswith("preempted by real work")
    # No verdict: no report, no document among the run's hosts; what it measured is kept aside, and said so.
    assert not (run_dir / "report.json").exists() and not (run_dir / "hosts" / "sn1.json").exists()
    assert (run_dir / "sweep" / "not-judged" / "sn1.json").exists() and "sweep/not-judged/sn1.json" in ended["note"]
    assert "no job left a verdict" in out and "preempted by real work" in out
    with Store(tmp_path / "reports" / "gpufleet.db") as store:
        assert store.documents("sw-2") == []
        [event] = store.events("sn1", "sweep_job")
        assert event["step"] == "PREEMPTED" and not event["done"] and event["detail"]["gpu_hours"] > 0
    # The node lock was given back before the job was stopped.
    assert not (tmp_path / "node.lock").exists()


@pytest.mark.slow
@needs_slurm
def test_the_same_sweep_from_ansible_shows_its_plan_in_check_mode_and_submits_when_asked(cluster, tmp_path):
    recorded = tmp_path / "readings"
    recorded.mkdir()
    for name in ("sn1", "sn2", "sn3"):
        readings(recorded / f"{name}.json")
    extra = {
        "gpufleet_sweep_partitions": ["gpu"],
        "gpufleet_sweep_partition": SWEEP,
        "gpufleet_sweep_max_share": "1",
        "gpufleet_sweep_submit": True,
        "gpufleet_python": sys.executable,
        "gpufleet_lock_path": str(tmp_path / "node.lock"),
        "gpufleet_thresholds": {"gpus_expected": 1},
        "gpufleet_reports_dir": str(tmp_path / "reports"),
        "gpufleet_sweep_node_args": [f"--readings={recorded}/{{node}}.json"],
        "gpufleet_ladder_commands": {"reboot": "scontrol reboot {slurm_node}"},
    }
    env = playbook_env(tmp_path, cluster.env(), PYTHONPATH=str(REPO / "src"))

    def playbook(*more: str) -> subprocess.CompletedProcess:
        return run_playbook("sweep.yml", None, "-e", json.dumps(extra), *more, env=env, timeout_s=900)

    done = playbook("--check")
    # The plan: the job it would submit on sn1 (one node at once), with the run's name still to come.
    assert (
        done.returncode == 0 and "node-stage --tier smoke --run-dir RUN_DIR --run-id RUN_ID --host sn1" in done.stdout
    ), done.stdout[-3000:]
    assert "JobId=" not in cluster.scontrol("show", "job", "-o") and not (tmp_path / "reports").exists()
    done = playbook()
    assert done.returncode == 0 and "changed=1" in done.stdout, done.stdout[-3000:]
    [run_dir] = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    [job] = json.loads((run_dir / "sweep.json").read_text())["jobs"]
    assert job["state"] == "COMPLETED" and job["judged"] and json.loads((run_dir / "report.json").read_text())["nodes"]


@pytest.mark.slow
@needs_slurm
def test_a_node_another_run_holds_is_not_measured_and_gets_no_verdict(cluster, tmp_path):
    lock = tmp_path / "node.lock"
    done = gpufleet(
        "lock", "acquire", "--path", str(lock), "--run-id", "validate-7", "--holder", "sn1", "--ttl-s", "3600"
    )
    assert json.loads(done.stdout)["acquired"]
    done = gpufleet(
        *sweep_args(tmp_path, sys.executable, "--max-share", "1", "--submit", "--run-id", "sw-3"), env=cluster.env()
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [job] = json.loads((tmp_path / "reports" / "sw-3" / "sweep.json").read_text())["jobs"]
    assert job["state"] == "COMPLETED" and not job["judged"]
    assert (
        "not measured: the node is held by run 'validate-7'" in job["note"] and "no verdict for the node" in job["note"]
    )
    assert not (tmp_path / "reports" / "sw-3" / "report.json").exists()
    assert json.loads(lock.read_text())["run_id"] == "validate-7"  # still the other run's


# ---------------------------------------------------------------- the ladder


@pytest.mark.slow
@needs_slurm
def test_the_ladder_climbs_from_retest_through_reset_and_reboot_to_rma_over_a_recurring_xid(cluster, tmp_path):
    reports, calls = tmp_path / "reports", tmp_path / "calls"
    bad, good = readings(tmp_path / "xid.json", xids=1), readings(tmp_path / "ok.json")
    act = ["--act", "retest,reset_gpu,reboot,rma"]

    def failing_run(run_id: str) -> Path:
        run_dir = judged_run(reports, run_id, {"sn1": bad, "sn2": good, "sn3": good}, cluster.env())
        assert gpufleet("slurm", str(run_dir), "--action", "drain_resume", env=cluster.env()).returncode == 0
        return run_dir

    run_dir = failing_run("r1")
    assert cluster.node("sn1")["Reason"].startswith("gpufleet hw xid; run r1")
    # Proposed only: nothing is run without --act.
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls), "sn1")
    assert step["step"] == "retest" and step["proposed"] and not step["done"] and calls_of(calls) == []
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls, *act), "sn1")
    assert step["step"] == "retest" and step["done"] and calls_of(calls) == []  # a re-test is the next run

    run_dir = failing_run("r2")
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls, *act), "sn1")
    assert step["step"] == "reset_gpu" and step["rung"] == 2 and step["done"] and "the fault came again" in step["why"]
    assert calls_of(calls) == ["reset 0 sn1"]

    run_dir = failing_run("r3")
    # The breaker counts the ladder's actions: with none allowed, nothing is done and the judgement fails.
    done = ladder_cmd(cluster, run_dir, calls, *act, "--max-drain", "0")
    assert done.returncode == 1 and json.loads(done.stdout)["breaker"]["tripped"] and calls_of(calls) == ["reset 0 sn1"]
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls, *act), "sn1")
    assert step["step"] == "reboot" and step["done"] and calls_of(calls) == ["reset 0 sn1", "reboot sn1"]

    run_dir = failing_run("r4")
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls, *act), "sn1")
    assert step["step"] == "rma" and step["done"]
    sn1 = cluster.node("sn1")
    assert sn1["State"] == "IDLE+DRAIN" and sn1["Reason"].startswith(
        f"gpufleet RMA hw xid GPU 0 serial {SERIAL}; run r4"
    )

    # Accepted by a later run, it stays drained for repair: neither the Slurm action nor the ladder lets it go.
    run_dir = judged_run(reports, "r5", {"sn1": good, "sn2": good, "sn3": good}, cluster.env())
    done = gpufleet("slurm", str(run_dir), "--action", "drain_resume", "--json", env=cluster.env())
    assert (
        "left alone: held for repair"
        in {d["slurm_node"]: d for d in json.loads(done.stdout)["decisions"]}["sn1"]["why"]
    )
    [step] = steps_of(ladder_cmd(cluster, run_dir, calls, *act), "sn1")
    assert step["step"] == "hold" and cluster.node("sn1")["Reason"].startswith("gpufleet RMA hw xid")
    assert calls_of(calls) == ["reset 0 sn1", "reboot sn1"]

    # The node's history: each step with its time and outcome; the fault's cost.
    hist = json.loads(gpufleet("history", "sn1", "--reports-dir", str(reports), "--json").stdout)["service"]
    taken = [s for s in ladder.with_outcomes(hist["ladder"]) if s.get("done") and s["step"] in policy.STEPS]
    assert [s["step"] for s in taken] == ["retest", "reset_gpu", "reboot", "rma"]
    assert [s["outcome"] for s in taken[:3]] == [f"fault again in run r{i} (gpu_health.xid)" for i in (2, 3, 4)]
    assert all(s["at"] for s in taken)
    [fault] = hist["costs"]["faults"]
    assert fault["first_sign_run"] == "r1" and fault["fault_to_drain_s"] is not None and hist["costs"]["out_of_service"]
    prom = (run_dir / "prometheus" / "gpufleet-service.prom").read_text()
    assert 'gpufleet_out_of_service{cause="gpufleet",node="sn1"} 1.0' in prom, prom
    # What was tried reaches the vendor's summary.
    bundle = tmp_path / "e.tar.gz"
    assert gpufleet("evidence", "sn1", "--reports-dir", str(reports), "--out", str(bundle)).returncode == 0
    with tarfile.open(bundle) as tar:
        summary = next(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("/summary.md"))
    assert "reset_gpu in run r2" in summary and "reboot in run r3" in summary and "rma in run r4" in summary
    # The Slurm drain record: every action of `gpufleet slurm` on the node, the last drain with its reason.
    with tarfile.open(bundle) as tar:
        drains = json.loads(next(tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith("/slurm.json")))
    # Drained once, by r1: a re-test failing on the same cause keeps the reason and its time (docs/slurm.md).
    assert [d["run_id"] for d in drains if d["do"] == "drain"] == ["r1"] and drains[-1]["run_id"] == "r5"
    slurm_line = next(line for line in summary.splitlines() if line.startswith("- Slurm: "))
    assert (
        "last drain: drain done" in slurm_line
        and 'in run r1 (drain_resume) with reason "gpufleet hw xid; run r1"' in slurm_line
    )
    assert "latest: nothing (left alone: held for repair" in slurm_line, slurm_line

    # A person clears it once repaired: still drained, now for the acceptance that alone resumes it; its ladder restarts.
    done = gpufleet(
        "ladder",
        "--clear",
        "sn1",
        "--by",
        "alice",
        "--note",
        "GPU 0 replaced, ticket 42",
        "--reports-dir",
        str(reports),
        env=cluster.env(),
    )
    assert done.returncode == 0, done.stderr
    sn1 = cluster.node("sn1")
    assert sn1["State"] == "IDLE+DRAIN" and sn1["Reason"].startswith("gpufleet REACCEPT RMA cleared by alice; run "), (
        sn1
    )
    assert "; run ladder-clear-sn1-" in sn1["Reason"]
    hist = json.loads(gpufleet("history", "sn1", "--reports-dir", str(reports), "--json").stdout)["service"]
    assert ladder.open_steps([{"step": s["step"], "detail": s} for s in hist["ladder"]]) == []


@pytest.mark.slow
@needs_slurm
def test_the_ladder_clears_when_the_fault_is_gone_and_starts_again_at_retest(cluster, tmp_path):
    reports, calls = tmp_path / "reports", tmp_path / "calls"
    bad, good = readings(tmp_path / "xid.json", xids=1), readings(tmp_path / "ok.json")
    for run_id, sn1 in (("r1", bad), ("r2", bad), ("r3", good), ("r4", bad)):
        run_dir = judged_run(reports, run_id, {"sn1": sn1, "sn2": good}, cluster.env())
        assert gpufleet("slurm", str(run_dir), "--action", "drain_resume", env=cluster.env()).returncode == 0
        steps = steps_of(ladder_cmd(cluster, run_dir, calls, "--act", "all"), "sn1")
        if run_id == "r2":
            assert [s["step"] for s in steps] == ["reset_gpu"] and calls_of(calls) == ["reset 0 sn1"]
        if run_id == "r3":
            assert [s["step"] for s in steps] == ["clear"] and "the ladder clears (it was at reset_gpu)" in steps[0][
                "why"
            ]
            wait_for(lambda: cluster.node_state("sn1") == "IDLE", 120, "sn1 resumed once accepted")
    assert [s["step"] for s in steps] == ["retest"] and steps[0]["rung"] == 1  # r4: a new fault starts at the bottom
    costs = json.loads(gpufleet("history", "sn1", "--reports-dir", str(reports), "--json").stdout)["service"]["costs"]
    first, second = costs["faults"]
    assert first["first_sign_run"] == "r1" and first["return_s"] is not None and first["resumed_at"]
    assert second["first_sign_run"] == "r4" and second["resumed_at"] is None and costs["out_of_service"]


# ---------------------------------------------------------------- back in service after repair


@pytest.mark.slow
@needs_slurm
def test_a_replaced_serial_sends_the_node_back_through_acceptance(cluster, tmp_path):
    reports, calls = tmp_path / "reports", tmp_path / "calls"
    good = readings(tmp_path / "ok.json")
    judged_run(reports, "a1", {"sn1": good, "sn2": good}, cluster.env())
    # A sweep finds sn1 with another board: accepted by the sweep's checks, but not by an acceptance with its peers.
    run_dir = judged_run(
        reports,
        "s2",
        {"sn1": readings(tmp_path / "new.json", serial="9990001112223"), "sn2": good},
        cluster.env(),
        playbook="sweep",
    )
    accept = stand_in(tmp_path / "accept", calls, "accept")
    done = gpufleet(
        "ladder",
        str(run_dir),
        "--json",
        "--act",
        "reaccept",
        f"--command=reaccept={accept} {{host}}",
        env=cluster.env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = steps_of(done, "sn1")
    assert [s["step"] for s in steps] == ["restart", "reaccept"] and steps[1]["done"]
    assert f"GPU 0 serial {SERIAL} -> 9990001112223" in steps[0]["why"] and calls_of(calls) == ["accept sn1"]
    sn1 = cluster.node("sn1")
    assert sn1["State"] == "IDLE+DRAIN" and sn1["Reason"].startswith("gpufleet REACCEPT GPU 0 serial"), sn1
    # A passing run that is no acceptance does not resume it.
    done = gpufleet("slurm", str(run_dir), "--action", "drain_resume", env=cluster.env())
    assert done.returncode == 0 and cluster.node_state("sn1") == "IDLE+DRAIN"

    # The replacement flow (`gpufleet fleet accept sn1 --slurm`): taken over, accepted, resumed.
    run_dir = reports / "a3"
    assert gpufleet("run", "start", str(reports), "a3", "--host", "sn1", "--tier", "acceptance").returncode == 0
    assert gpufleet("slurm", str(run_dir), "--take-over", "sn1", env=cluster.env()).returncode == 0
    judged_run(reports, "a3-report", {"sn1": tmp_path / "new.json"}, cluster.env())  # the same documents, judged
    (run_dir / "hosts").mkdir(exist_ok=True)
    (run_dir / "hosts" / "sn1.json").write_text((reports / "a3-report" / "hosts" / "sn1.json").read_text())
    assert gpufleet("report", str(run_dir), env=cluster.env()).returncode == 0
    assert gpufleet("slurm", str(run_dir), "--action", "drain_resume", env=cluster.env()).returncode == 0
    wait_for(lambda: cluster.node_state("sn1") == "IDLE", 120, "sn1 resumed once accepted")
    steps = steps_of(gpufleet("ladder", str(run_dir), "--json", env=cluster.env()), "sn1")
    assert all(s["step"] != "reaccept" for s in steps)  # an acceptance run accepted it: nothing more to do


# ---------------------------------------------------------------- units


def test_the_plan_names_every_node_it_skips_and_keeps_to_its_share():
    shown = slurm.parse_nodes(
        "\n".join(
            [
                "NodeName=a State=IDLE Partitions=gpu",
                "NodeName=b State=ALLOCATED Partitions=gpu",
                "NodeName=c State=IDLE+DRAIN Partitions=gpu Reason=admin: fan [root@t]",
                "NodeName=d State=DOWN* Partitions=gpu",
                "NodeName=e State=MIXED Partitions=gpu",
                "NodeName=f State=IDLE Partitions=gpu",
                "NodeName=g State=IDLE Partitions=cpu",
                "NodeName=h State=IDLE+RESERVED Partitions=gpu",
                "NodeName=i State=IDLE Partitions=gpu",
            ]
        )
    )
    queued = [{"job_id": "7", "state": "RUNNING", "node": "i", "comment": "sw-0"}]
    planned = sweep.plan(shown, ["gpu"], queued, (100, True), {"f": "2026-11-01T00:00:00Z"})
    assert planned["skipped"] == {
        "b": "running a job (ALLOCATED)",
        "c": "not idle: IDLE+DRAIN: admin: fan [root@t]",
        "d": "not idle: DOWN*",
        "e": "running a job (MIXED)",
        "h": "not idle: IDLE+RESERVED",
        "i": "a sweep job (7, RUNNING) is already there",
    }
    # Three nodes in the pool (a, f idle; i swept): 100% is three at once, one of them already taken.
    assert planned["chosen"] == ["a", "f"] and planned["allowed"] == 3  # never tested first, then the oldest
    planned = sweep.plan(shown, ["gpu"], queued, (50, True), {})
    assert planned["chosen"] == [] and set(planned["deferred"]) == {"a", "f"}
    assert sweep.plan(shown, ["gpu"], [], (1, False), {"a": "2026-11-02T00:00:00Z"})["chosen"] == ["f"]
    with pytest.raises(Exception, match="partition gpu2 holds no node"):
        sweep.plan(shown, ["gpu2"], [], (1, False), {})


def test_sweeps_need_preemption_and_bad_input_names_the_variable():
    parts = {"gpu": {"priority_tier": 10}, "sweep": {"priority_tier": 1}}
    assert "PreemptType is preempt/none" in sweep.preemption_problem(
        {"PreemptType": "preempt/none"}, parts, ["sweep"], None
    )
    assert sweep.preemption_problem({"PreemptType": "preempt/partition_prio"}, parts, ["sweep"], None) is None
    assert "partition gpu has the highest PriorityTier" in sweep.preemption_problem(
        {"PreemptType": "preempt/partition_prio"}, parts, ["gpu"], None
    )
    assert "--qos" in sweep.preemption_problem({"PreemptType": "preempt/qos"}, parts, ["gpu"], None)
    for bad in ("0", "0%", "150%", "many"):
        with pytest.raises(Exception, match="gpufleet_sweep_max_share"):
            sweep.parse_share(bad)
    with pytest.raises(Exception, match="gpufleet_ladder_act .* 'reboots'"):
        policy.parse_act(["retest,reboots"])
    assert policy.parse_act(["all"]) == set(policy.ACTABLE)
    with pytest.raises(Exception, match=r"unknown placeholder \{node\}"):
        commands.parse(["reboot=scontrol reboot {node}"], policy.ACTABLE)
    with pytest.raises(Exception, match="STEP one of"):
        commands.parse(["rebot=x"], policy.ACTABLE)
    assert commands.words("ssh {host} nvidia-smi -r -i {gpu_index}", {"host": "n1", "gpu_index": 3}) == [
        "ssh",
        "n1",
        "nvidia-smi",
        "-r",
        "-i",
        "3",
    ]
    # A value of another shape stops the command, named; the words ssh hands to the node's shell are quoted.
    with pytest.raises(Exception, match=r"\{host\} would be 'n 1; rm'; expected a host name"):
        commands.words("ssh {host} nvidia-smi", {"host": "n 1; rm"})
    assert commands.words("ssh -i k -p22 -- {host} echo {reason}", {"host": "n1", "reason": "a; b"}) == [
        *["ssh", "-i", "k", "-p22", "--", "n1", "echo", "'a; b'"]
    ]
    done = gpufleet("slurm", "sweep", "--tier", "smoke", "--partition", "gpu", "--max-share", "200%")
    assert done.returncode == 2 and "gpufleet_sweep_max_share (--max-share) is '200%'" in done.stderr
    # Each error names its command (the option --command once hid it: `gpufleet None:`).
    assert gpufleet("slurm", "sweep", "--tier", "smoke").stderr.startswith("gpufleet slurm sweep: --partition")
    done = gpufleet("ladder", "--command", "reboot=scontrol reboot {slurm_node}")
    assert done.returncode == 2 and done.stderr == "gpufleet ladder: give RUN_DIR (a reported run) or --clear NODE\n"
    # The tiers a sweep runs are the registry's with a job time limit; the soak, which lasts hours, is never swept.
    assert list(sweep.TIERS) == list(sweep.TIME_LIMIT_MIN) == ["smoke", "acceptance"]
    assert gpufleet("slurm", "sweep", "--tier", "soak", "--partition", "gpu").returncode == 2
    # What its jobs run is looked up once, here, before any job (registry.stage_plan): the jobs' node stage trusts it.
    done = gpufleet("slurm", "sweep", "--tier", "smoke", "--partition", "gpu", "--benchmarks", "matmul", "bogus")
    may = ", ".join(registry.benchmark_names(selectable=True))
    assert done.stderr == f"gpufleet slurm sweep: --benchmarks names 'bogus'; expected some of {may}, or none\n"


def test_the_ladder_comes_from_the_profile_and_a_bad_one_is_named(tmp_path):
    pol = policy.policy("h100-sxm")
    assert policy.steps_for(pol, {"class": "hardware", "check": "gpu_health.xid"}) == [
        "retest",
        "reset_gpu",
        "reboot",
        "rma",
    ]
    assert policy.steps_for(pol, {"class": "hardware", "check": "gpu_health.row_remapping"}) == [
        "retest",
        "reset_gpu",
        "rma",
    ]
    assert policy.steps_for(pol, {"class": "configuration", "check": "gpu_inventory.mig_mode"}) == []
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    generic = (REPO / "files" / "profiles" / "generic.yml").read_text()
    (profiles / "generic.yml").write_text(
        generic.replace("hardware: [retest, reset_gpu, reboot, rma]", "hardware: [retest, reboot, reboot, rma]")
    )
    (profiles / "site.yml").write_text(
        "name: site\nmatch: []\nthresholds: {}\nremediation:\n  checks:\n    gpu_health.xid: [retest, rmaa]\n"
    )
    assert policy.steps_for(policy.policy(None, profiles), {"class": "hardware", "check": "x"}) == [
        "retest",
        "reboot",
        "reboot",
        "rma",
    ]
    with pytest.raises(Exception, match=r"site.yml: remediation.checks.gpu_health.xid = \['retest', 'rmaa'\]"):
        policy.policy("site", profiles)


@pytest.mark.slow
def test_an_unconfirmed_failure_gets_a_re_test_never_a_reset_and_is_not_drained(tmp_path):
    """A figure measured once (trust clean) that failed as hardware: the ladder proposes a re-test at every rung and
    the Slurm action leaves the node in service; a finding read from the node (no trust) climbs and drains."""
    figure = schema.result(
        "matmul",
        schema.FAIL,
        "bf16 matmul 12% below its siblings",
        group="benchmark",
        remedy="measure it again",
        trust=schema.CLEAN,
        failure_class="hardware",
        detail={"flagged_gpus": [{"index": 0, "uuid": None, "serial": SERIAL}]},
    )
    xid = dict(figure, check="xid", group="gpu_health", trust=None, reason="Xid 79 on GPU 0")
    reports = tmp_path / "reports"
    for run_id in ("r1", "r2"):
        assert gpufleet("run", "start", str(reports), run_id, "--host", "n1", "--host", "n2").returncode == 0
        nodes = {"n1": {"verdict": "fail", "results": [figure]}, "n2": {"verdict": "fail", "results": [xid]}}
        (reports / run_id / "report.json").write_text(json.dumps({"run_id": run_id, "nodes": nodes}))
        done = gpufleet("ladder", str(reports / run_id), "--act", "retest", "--json")
        steps = {s["host"]: s for s in json.loads(done.stdout)["steps"]}
    assert steps["n1"]["step"] == "retest" and "not confirmed" in steps["n1"]["why"], steps["n1"]
    assert "a re-test, not reset_gpu" in steps["n1"]["why"] and not steps["n1"]["fault"]["confirmed"]
    assert steps["n2"]["step"] == "reset_gpu" and steps["n2"]["fault"]["confirmed"]  # a finding stands
    shown = slurm.parse_nodes("NodeName=n1 State=IDLE Partitions=gpu\nNodeName=n2 State=IDLE Partitions=gpu")
    decided = {
        d["host"]: d
        for d in fleet_slurm.plan({"run_id": "r2", "nodes": nodes}, shown, "drain", (100, True))["decisions"]
    }
    assert decided["n1"]["do"] == "nothing" and "figures not confirmed" in decided["n1"]["why"]
    assert decided["n2"]["do"] == "drain"


def test_a_re_test_is_left_to_the_sweep_that_runs_it_and_taken_again_once_that_sweep_is_gone(tmp_path):
    """Two sweeps at once: the second neither re-tests a node the first is measuring (it would climb the ladder
    twice) nor closes its reservation; once the first is gone without a judgement, the node is measured again."""
    stand_in_sweep = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)", "gpufleet-sweep"],
        stdout=subprocess.PIPE,
    )
    # its command line is readable once it runs (right after the fork, /proc shows it empty)
    assert stand_in_sweep.stdout.readline() == b"up\n"
    at = "2026-11-27T10:00:00Z"
    record = {"run_id": "s1", "jobs": [{"node": "sn1", "retest": {"opened": "2026-11-27T10:05:00Z"}}]}
    retest_record = record["jobs"][0]["retest"]
    (tmp_path / "s1").mkdir()
    try:
        for host, pid, running in (
            (socket.gethostname(), stand_in_sweep.pid, True),
            ("another-controller", stand_in_sweep.pid, True),  # cannot tell: left to it, the node stays reserved
        ):
            retest_record.update(sweep_host=host, sweep_pid=pid)
            (tmp_path / "s1" / "sweep.json").write_text(json.dumps(record))
            assert retest._in_progress(tmp_path, "sweep.json", "sn1", at) is running
        retest_record.update(sweep_host=socket.gethostname())
        (tmp_path / "s1" / "sweep.json").write_text(json.dumps(record))
        assert not retest._in_progress(tmp_path, "sweep.json", "sn1", "2026-11-27T10:06:00Z")  # opened before
        assert not retest._in_progress(tmp_path, "sweep.json", "sn2", at)
    finally:
        stand_in_sweep.kill()
        stand_in_sweep.wait()
    assert not retest._in_progress(tmp_path, "sweep.json", "sn1", at)  # its sweep gone: measured again


def test_a_ladder_left_open_closes_once_a_later_run_accepted_the_node():
    """The replacement flow accepted the node in a run no ladder judged: its next failure starts at the bottom."""
    steps = [
        {"run_id": "r1", "step": "reboot", "done": "x", "at": "2026-11-01T01:00:00Z"},
        {"run_id": "r2", "step": "rma", "done": "x", "at": "2026-11-01T02:00:00Z"},
    ]
    runs = [
        {"run_id": "r2", "started": "2026-11-01T01:30:00Z", "verdict": "fail"},
        {"run_id": "a3", "started": "2026-11-02T00:00:00Z", "verdict": "pass"},
        {"run_id": "s4", "started": "2026-11-03T00:00:00Z", "verdict": "fail"},
    ]
    assert ladder.accepted_since(runs, steps, "s4")["run_id"] == "a3"
    assert (
        ladder.accepted_since(runs[:1] + runs[2:], steps, "s4") is None
        and ladder.accepted_since(runs, [], "s4") is None
    )


def test_costs_from_the_events_first_sign_to_drain_and_back_in_service():
    runs = [
        {"run_id": "r1", "started": "2026-11-01T00:00:00Z", "clean": True},
        {"run_id": "r2", "started": "2026-11-01T01:00:00Z", "clean": False},  # a warn: the first sign
        {"run_id": "r3", "started": "2026-11-01T02:00:00Z", "clean": False},
    ]
    events = [
        {
            "run_id": "s",
            "kind": "sweep_job",
            "at": "2026-11-01T01:00:30Z",
            "step": "COMPLETED",
            "done": 1,
            "detail": {"gpu_hours": 0.08},
        },
        {
            "run_id": "r3",
            "kind": "drain",
            "at": "2026-11-01T02:30:00Z",
            "step": "drain_resume",
            "done": 1,
            "detail": {},
        },
        {
            "run_id": "r3",
            "kind": "drain",
            "at": "2026-11-01T03:00:00Z",
            "step": "drain_resume",
            "done": 1,
            "detail": {},
        },
        {
            "run_id": "r9",
            "kind": "resume",
            "at": "2026-11-02T02:30:00Z",
            "step": "drain_resume",
            "done": 1,
            "detail": {},
        },
    ]
    now = service_log.epoch("2026-11-03T00:00:00Z")
    costs = service_log.node_costs("n1", events, runs, now_s=now)
    [fault] = costs["faults"]
    assert fault["first_sign_run"] == "r2" and fault["fault_to_drain_s"] == 5400 and fault["return_s"] == 86400
    assert costs["sweep_gpu_hours"] == 0.08 and costs["sweep_gpu_hours_7d"] == 0.08 and not costs["out_of_service"]
    fleet = service_log.fleet_costs([costs, service_log.node_costs("n2", [], [], now_s=now)])
    assert fleet["fault_to_drain_s_median"] == 5400 and fleet["return_s_median"] == 86400 and fleet["sweeps"] == 1
