"""Sweeps when Slurm itself falters, against a real Slurm (tests/slurm_cluster.py: Debian's slurmctld, slurmd and
munged on the network-namespace test hosts, a sweep partition that `gpu` preempts), one cluster for the whole file:
the controller stopped and started during a sweep, down past the sweep's bound and during its collect; munged
stopped; a node's slurmd killed; a node set DOWN or FAIL, a sweep job cancelled by an administrator or preempted by
real work; a job slurmctld has forgotten (MinJobAge, no accounting); a node stage that hangs to its time limit. The
scheduler's failure is never the node's: no healthy node is drained, no finished verdict lost. And the words that
say what happened: the breaker's console line and ladder.json agree.

Slurm's timeouts are low (SETTINGS) so that each fault shows in seconds. The tests hold jobs where they need them,
with files they make and remove (`holds`): the cluster's Prolog waits while `prolog-<node>` exists (the job RUNNING,
its batch script not started), and the node's interpreter (`--python`) while `engine-<node>` exists (the job's step
started, the engine not yet); each says it is holding (`held-prolog-<node>`, `held-engine-<node>`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.base import slurm
from gpufleet.fleet import history_text
from gpufleet.service import outputs, sweep_end
from service_runs import (
    SWEEP,
    calls_of,
    gpufleet,
    job_state,
    judged_run,
    needs_slurm,
    readings,
    sbatch,
    stand_in,
    sweep_args,
    sweep_started,
)
from slurm_cluster import SlurmCluster
from waiting import wait_for

NET, TAG = 249, "gfy"
NODES = ("sn1", "sn2", "sn3", "sn4")
# A slurmd that stops answering is DOWN after 20 s; a message waits 5 s at most; a finished job is forgotten two
# seconds after its end (no accounting runs here, as on many sites).
SETTINGS = {"SlurmdTimeout": 20, "MessageTimeout": 5, "MinJobAge": 2}


@pytest.fixture(scope="module")
def holds(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("holds")
    for name, where, then in (("prolog", "prolog", "exit 0"), ("python", "engine", f'exec {sys.executable} "$@"')):
        held = f"{folder}/{where}-$SLURMD_NODENAME"
        (folder / name).write_text(
            f"#!/bin/sh\n[ -e {held} ] && touch {folder}/held-{where}-$SLURMD_NODENAME\ni=0\n"
            f"while [ -e {held} ] && [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); done\n{then}\n"
        )
    # The interpreter of the node stage's steps: on a node with `hang-<node>`, a step that never ends.
    (folder / "steps-python").write_text(
        f'#!/bin/sh\n[ -e {folder}/hang-$SLURMD_NODENAME ] && exec sleep 100000\nexec {sys.executable} "$@"\n'
    )
    for name in ("prolog", "python", "steps-python"):
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def cluster(holds):
    settings = dict(SETTINGS, Prolog=str(holds / "prolog"))
    with SlurmCluster(list(NODES), net=NET, tag=TAG, sweep_partition=SWEEP, settings=settings) as c:
        c.wait_idle()
        yield c


@pytest.fixture
def sc(cluster, holds):
    """The cluster, whole again after the test: every hold gone, every daemon running, every node idle."""
    yield cluster
    for path in holds.glob("*-sn*"):
        path.unlink()
    for daemon in ("munged", "slurmctld", *(f"slurmd-{n}" for n in NODES)):
        if cluster.daemons[daemon].poll() is not None:
            cluster.start(daemon)
    left = [line.split("|")[0] for line in squeue(cluster)]
    subprocess.run(["scancel", *left], env=cluster.env(), capture_output=True) if left else None
    wait_for(lambda: not squeue(cluster), 180, "no job left in Slurm")
    for name in NODES:
        if cluster.node_state(name) != "IDLE":
            subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"], env=cluster.env())
    # A resumed node reads IDLE+NOT_RESPONDING until Slurm has pinged its slurmd, and a sweep passes it over then.
    wait_for(lambda: all(cluster.node_state(n) == "IDLE" for n in NODES), 180, "every node IDLE, nothing more")


def hold(holds: Path, where: str, *nodes: str) -> None:
    for node in nodes:
        (holds / f"{where}-{node}").touch()


def release(holds: Path, where: str, *nodes: str) -> None:
    for node in nodes:
        (holds / f"{where}-{node}").unlink()


def held(holds: Path, where: str, *nodes: str) -> bool:
    """The job of each of `nodes` is held there now."""
    return all((holds / f"held-{where}-{node}").exists() for node in nodes)


def wait_held(sweeping: subprocess.Popen, what: str, predicate) -> None:
    """Wait until `predicate` (the jobs held where the test needs them); the sweep's words should it end first."""
    if wait_for(lambda: predicate() or sweeping.poll() is not None, 300, what) is True and not predicate():
        out, err = sweeping.communicate()
        raise AssertionError(f"the sweep ended (exit {sweeping.returncode}) before {what}: {out[-3000:]}{err[-3000:]}")


def squeue(cluster: SlurmCluster) -> list[str]:
    done = subprocess.run(["squeue", "-h", "-o", "%i|%T|%N"], env=cluster.env(), capture_output=True, text=True)
    return done.stdout.split()


def record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "sweep.json").read_text())
    except (OSError, ValueError):
        return {}


def jobs_of(run_dir: Path) -> dict:
    return {j["node"]: j for j in record(run_dir).get("jobs") or []}


def finished(run_dir: Path, host: str) -> bool:
    """The node stage of `host` ran to its end (its document says when)."""
    try:
        return bool(json.loads((run_dir / "hosts" / f"{host}.json").read_text()).get("finished"))
    except (OSError, ValueError):
        return False


def output(run_dir: Path, host: str) -> str:
    path = run_dir / "sweep" / f"{host}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def ended(sweeping: subprocess.Popen) -> tuple[int, str, str]:
    out, err = sweeping.communicate(timeout=600)
    return sweeping.returncode, out, err


def drained(cluster: SlurmCluster) -> dict:
    """The nodes Slurm shows drained, with their reasons."""
    return {n: cluster.node(n).get("Reason") for n in NODES if "DRAIN" in cluster.node_state(n)}


def args_for(tmp_path: Path, holds: Path, *extra: str) -> list[str]:
    return sweep_args(tmp_path, str(holds / "python"), "--benchmarks", "--submit", *extra, nodes=NODES)


# ---------------------------------------------------------------- the controller


@pytest.mark.slow
@needs_slurm
def test_a_controller_stopped_during_a_sweep_drains_no_node_and_the_next_sweep_finishes_the_work(sc, holds, tmp_path):
    """sn1's job has started its engine, sn2's is still in its prolog when slurmctld stops: sn1's engine finishes
    without the controller, sn2's srun cannot confirm its allocation. slurmctld starts again: the sweep, which kept
    asking, judges sn1 from its document and calls sn2 the scheduler's failure: not drained, measured next time."""
    reports = tmp_path / "reports"
    run_dir = reports / "c1"
    hold(holds, "engine", "sn1")
    hold(holds, "prolog", "sn2")
    args = args_for(tmp_path, holds, "--max-share", "2", "--action", "drain_resume", "--act", "all")
    with sweep_started(sc, [*args, "--run-id", "c1"]) as sweeping:
        wait_held(sweeping, "both jobs held", lambda: held(holds, "engine", "sn1") and held(holds, "prolog", "sn2"))
        sc.stop("slurmctld")
        release(holds, "engine", "sn1")
        release(holds, "prolog", "sn2")
        wait_for(lambda: "Unable to confirm allocation" in output(run_dir, "sn2"), 300, "sn2's srun refused")
        wait_for(lambda: finished(run_dir, "sn1"), 300, "sn1's node stage finished")
        wait_for(lambda: record(run_dir).get("controller_lost"), 300, "the sweep seeing slurmctld gone")
        sc.start("slurmctld")
        rc, out, err = ended(sweeping)
    assert rc == 0, out[-3000:] + err[-3000:]

    jobs = jobs_of(run_dir)
    assert jobs["sn1"]["ending"] == "judged" and jobs["sn1"]["judged"], jobs["sn1"]
    assert jobs["sn2"]["ending"] == "scheduler" and not jobs["sn2"]["judged"], jobs["sn2"]
    assert "Unable to confirm allocation" in jobs["sn2"]["note"] and "not drained" in jobs["sn2"]["note"]
    [lost] = record(run_dir)["controller_lost"]
    assert lost["from"] <= lost["to"] and "Unable to contact slurm controller" in lost["error"]
    # The console says what happened and what comes next.
    assert f"sn2: Slurm could not run job {jobs['sn2']['job_id']}" in out and "the next sweep measures it again" in out
    assert "slurmctld did not answer from" in out
    # No node drained, no ladder step for sn2: only sn1 is in the report.
    assert drained(sc) == {}
    assert list(json.loads((run_dir / "report.json").read_text())["nodes"]) == ["sn1"]
    assert all(s["host"] == "sn1" for s in json.loads((run_dir / "ladder.json").read_text())["steps"])

    # The next sweep takes the nodes measured longest ago, sn2 among them, and judges it.
    done = gpufleet(*args, "--run-id", "c2", env=sc.env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert jobs_of(reports / "c2")["sn2"]["judged"]
    assert json.loads((reports / "c2" / "report.json").read_text())["nodes"]["sn2"]["verdict"] in ("pass", "warn")


@pytest.mark.slow
@needs_slurm
def test_a_controller_down_past_the_bound_and_during_the_collect_loses_no_verdict(sc, holds, tmp_path):
    """slurmctld stays down past every job's bound: the sweep stops, names the command that finishes it and marks
    its run unfinished. A collect while it is still down judges the document the job wrote, but drains nothing
    (it cannot) and says so; the next sweep, once slurmctld is back, finishes the run before its own."""
    reports = tmp_path / "reports"
    run_dir = reports / "b1"
    hold(holds, "engine", "sn1")
    args = args_for(tmp_path, holds, "--max-share", "1", "--wait-min", "0.25", "--time-limit-min", "1")
    args += ["--action", "drain_resume"]
    with sweep_started(sc, [*args, "--run-id", "b1"]) as sweeping:
        wait_held(sweeping, "the sweep job of sn1 held before its engine", lambda: held(holds, "engine", "sn1"))
        sc.stop("slurmctld")
        release(holds, "engine", "sn1")
        wait_for(lambda: finished(run_dir, "sn1"), 300, "sn1's node stage finished")
        rc, out, err = ended(sweeping)
    collect = f"gpufleet slurm sweep --collect {run_dir} --action drain_resume"
    assert rc == 2 and "slurmctld did not answer since" in err, out[-2000:] + err[-2000:]
    assert f"Finish it once Slurm answers: {collect}" in err, err
    assert record(run_dir)["unfinished"]["why"].startswith("slurmctld did not answer since")

    # A sweep's plan made meanwhile says Slurm could not be asked, and nothing is submitted.
    done = gpufleet(*sweep_args(tmp_path, str(holds / "python"), "--benchmarks", nodes=NODES), env=sc.env())
    assert done.returncode == 2 and "nothing was submitted; the next sweep tries again" in done.stderr, done.stderr
    assert "Unable to contact slurm controller" in done.stderr

    # The command it names, while slurmctld is still down: the verdict is read from the document, nothing is drained.
    done = gpufleet("slurm", "sweep", "--collect", str(run_dir), "--action", "drain_resume", env=sc.env())
    assert done.returncode == 2 and "Nothing was drained for it" in done.stderr, done.stdout[-2000:] + done.stderr
    assert collect in done.stderr
    assert jobs_of(run_dir)["sn1"]["ending"] == "judged" and record(run_dir)["unfinished"]
    assert json.loads((run_dir / "report.json").read_text())["nodes"]["sn1"]["verdict"] in ("pass", "warn")
    assert not (run_dir / "slurm.json").exists()

    # slurmctld back (its nodes registered again): the next sweep finishes b1 first (its Slurm action, ladder and
    # costs), then sweeps.
    sc.start("slurmctld")
    sc.wait_idle()
    wait_for(lambda: not squeue(sc), 180, "b1's job ended in Slurm")
    done = gpufleet(*args, "--run-id", "b2", env=sc.env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sweep b1: report verdict" in done.stdout and "sweep b2: report verdict" in done.stdout
    kept = record(run_dir)
    assert kept["finished"] and "unfinished" not in kept
    [action] = json.loads((run_dir / "slurm.json").read_text())["actions"]
    assert [d["slurm_node"] for d in action["decisions"]] == ["sn1"] and drained(sc) == {}


@pytest.mark.slow
@needs_slurm
def test_munged_stopped_during_a_sweep_is_waited_out(sc, holds, tmp_path):
    run_dir = tmp_path / "reports" / "m1"
    hold(holds, "engine", "sn1")
    with sweep_started(sc, [*args_for(tmp_path, holds, "--max-share", "1"), "--run-id", "m1"]) as sweeping:
        wait_held(sweeping, "the sweep job of sn1 held before its engine", lambda: held(holds, "engine", "sn1"))
        sc.stop("munged")
        release(holds, "engine", "sn1")
        wait_for(lambda: record(run_dir).get("controller_lost"), 300, "the sweep seeing Slurm unreachable")
        sc.start("munged")
        rc, out, err = ended(sweeping)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert jobs_of(run_dir)["sn1"]["judged"] and "Munge" in record(run_dir)["controller_lost"][0]["error"]


# ---------------------------------------------------------------- the nodes


@pytest.mark.slow
@needs_slurm
def test_a_slurmd_killed_keeps_the_others_verdicts_names_its_node_down_and_a_hung_stage_is_the_nodes(
    sc, holds, tmp_path
):
    """sn2's slurmd is killed while its job is in the prolog; sn1's node stage hangs in a step until the time limit;
    sn3 and sn4 are healthy. Each verdict is judged as it comes (the jobs are forgotten two seconds after their end),
    sn2 is named down with Slurm's own state and reason and not drained by gpufleet, and the hung stage is the
    node's: an error, drained. The sweep ends within its bound."""
    run_dir = tmp_path / "reports" / "d1"
    hold(holds, "hang", "sn1")
    hold(holds, "prolog", "sn2")
    args = args_for(tmp_path, holds, "--max-share", "100%", "--wait-min", "0.5", "--time-limit-min", "1")
    args += ["--action", "drain_resume", f"--node-arg=--python={holds / 'steps-python'}"]
    with sweep_started(sc, [*args, "--node-arg=--check-timeout-s=600", "--run-id", "d1"]) as sweeping:
        wait_held(sweeping, "sn2's job held in its prolog", lambda: held(holds, "prolog", "sn2"))
        sc.stop("slurmd-sn2", signal.SIGKILL)
        release(holds, "prolog", "sn2")
        rc, out, err = ended(sweeping)
    assert rc == 1, out[-3000:] + err[-3000:]  # sn1 not accepted
    kept = record(run_dir)
    jobs = {j["node"]: j for j in kept["jobs"]}
    assert jobs["sn2"]["ending"] == "node_down", jobs["sn2"]
    down = jobs["sn2"]["node_down"]
    assert down["state"].startswith("DOWN") and down["reason"] == "Not responding", down
    assert f"sn2: sn2 stopped responding: Slurm shows it {down['state']} (Not responding)" in out, out[-3000:]
    for node in ("sn3", "sn4"):
        assert jobs[node]["judged"] and jobs[node]["slurm_end"]["left_queue"], jobs[node]
    assert jobs["sn1"]["ending"] == "judged" and jobs["sn1"]["state"] == "TIMEOUT", jobs["sn1"]
    assert slurm.STAGE_STARTED in output(run_dir, "sn1")
    nodes = json.loads((run_dir / "report.json").read_text())["nodes"]
    assert sorted(nodes) == ["sn1", "sn3", "sn4"] and nodes["sn1"]["verdict"] == "fail"
    # Drained by gpufleet: the node whose stage hung alone; sn2 is out of service by Slurm's own hand.
    reasons = drained(sc)
    assert list(reasons) == ["sn1"] and reasons["sn1"].startswith("gpufleet env sweep_job; run d1"), reasons
    # Within its bound: the sweep was done before the last of its jobs' bounds.
    assert kept["finished"] <= max(j["bound"] for j in jobs.values())


@pytest.mark.slow
@needs_slurm
def test_a_job_slurm_has_forgotten_keeps_its_verdict(sc, holds, tmp_path):
    """The sweep is stopped (killed) while its job runs; the job ends and slurmctld forgets it (MinJobAge, no
    accounting); the collect reads the verdict from the document the job wrote."""
    run_dir = tmp_path / "reports" / "f1"
    hold(holds, "engine", "sn1")
    with sweep_started(sc, [*args_for(tmp_path, holds, "--max-share", "1"), "--run-id", "f1"]) as sweeping:
        wait_held(sweeping, "the sweep job of sn1 held before its engine", lambda: held(holds, "engine", "sn1"))
    release(holds, "engine", "sn1")
    wait_for(lambda: finished(run_dir, "sn1"), 300, "sn1's node stage finished")
    show = ["scontrol", "show", "job", jobs_of(run_dir)["sn1"]["job_id"]]
    wait_for(lambda: subprocess.run(show, env=sc.env(), capture_output=True).returncode, 120, "the job forgotten")
    done = gpufleet("slurm", "sweep", "--collect", str(run_dir), env=sc.env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = jobs_of(run_dir)["sn1"]
    assert job["judged"] and job["slurm_end"]["state"] is None and "judged from its document" in job["note"], job
    assert json.loads((run_dir / "report.json").read_text())["nodes"]["sn1"]["verdict"] in ("pass", "warn")


@pytest.mark.slow
@needs_slurm
def test_nodes_set_down_or_fail_a_job_cancelled_or_preempted_and_each_cause_out_of_service(sc, holds, tmp_path):
    """With every job held before its engine: an administrator sets sn1 DOWN (its job ends NODE_FAIL; its slurmd
    answers, and Slurm gives the node back: ReturnToService=2), sets sn2 FAIL, cancels sn3's job and drains sn3; a
    user's job preempts sn4's. sn2's engine then runs to its end. The sweep judges sn2 alone; none is drained by
    gpufleet; the preempted job's GPU-seconds count (its node's GPUs from the store: it wrote nothing); and the
    metrics say each node's cause of being out of service."""
    reports = tmp_path / "reports"
    run_dir = reports / "a1"
    judged_run(reports, "a0", {"sn4": readings(tmp_path / "ok.json")}, sc.env())  # the store knows sn4's GPUs
    hold(holds, "engine", *NODES)
    args = args_for(tmp_path, holds, "--max-share", "100%", "--action", "drain_resume")
    with sweep_started(sc, [*args, "--run-id", "a1"]) as sweeping:
        wait_held(sweeping, "every sweep job held before its engine", lambda: held(holds, "engine", *NODES))
        jobs = jobs_of(run_dir)
        sc.scontrol("update", "nodename=sn1", "state=down", "reason=admin: PSU")
        sc.scontrol("update", "nodename=sn2", "state=fail", "reason=admin: fan")
        subprocess.run(["scancel", jobs["sn3"]["job_id"]], env=sc.env(), check=True)
        sc.scontrol("update", "nodename=sn3", "state=drain", "reason=admin: burn-in")
        user = sbatch(sc, "-p", "gpu", "-w", "sn4", "--wrap", "sleep 100000")
        wait_for(lambda: job_state(sc, user) == "RUNNING", 180, "the user's job running on sn4")
        release(holds, "engine", *NODES)
        rc, out, err = ended(sweeping)
    assert rc == 0, out[-3000:] + err[-3000:]
    jobs = jobs_of(run_dir)
    endings = {n: j["ending"] for n, j in jobs.items()}
    # sn1's job ended NODE_FAIL: the scheduler's; named down as well should a poll see sn1 DOWN before its slurmd
    # answered and Slurm gave it back.
    assert endings["sn1"] in ("scheduler", "node_down") and endings | {"sn1": None} == {
        "sn1": None,
        "sn2": "judged",
        "sn3": "no_verdict",
        "sn4": "no_verdict",
    }, {n: (j["ending"], j["note"]) for n, j in jobs.items()}
    assert (
        f"Slurm could not run job {jobs['sn1']['job_id']} (NODE_FAIL" in jobs["sn1"]["note"]
        if endings["sn1"] == "scheduler"
        else "Slurm shows it DOWN (admin: PSU)" in jobs["sn1"]["note"] and "ended NODE_FAIL" in jobs["sn1"]["note"]
    ), jobs["sn1"]
    assert jobs["sn3"]["note"].startswith("cancelled") and jobs["sn4"]["note"].startswith("preempted by real work")
    assert jobs["sn4"]["gpus"] == 1 and jobs["sn4"]["gpu_seconds"] > 0, jobs["sn4"]
    assert {n: r for n, r in drained(sc).items() if slurm.is_own(r)} == {}
    prom = (run_dir / "prometheus" / "gpufleet-service.prom").read_text()
    for node, cause in (("sn2", "down"), ("sn3", "drained")):
        assert f'gpufleet_out_of_service{{cause="{cause}",node="{node}"}} 1.0' in prom, prom
    assert 'gpufleet_fleet_nodes_out_of_service{cause="gpufleet"} 0.0' in prom
    costs = json.loads(gpufleet("history", "sn4", "--reports-dir", str(reports), "--json").stdout)["service"]["costs"]
    assert costs["sweep_gpu_seconds"] == jobs["sn4"]["gpu_seconds"] > 0


# ---------------------------------------------------------------- the words


@pytest.mark.slow
@needs_slurm
def test_a_step_the_breaker_held_is_said_so_and_never_recorded_as_done(sc, holds, tmp_path):
    """Two failing nodes, --max-drain 1 --act all, swept twice: the run's Slurm action trips its breaker, so the
    ladder takes no step either; the console and ladder.json say the same, and nothing ran."""
    reports, calls = tmp_path / "reports", tmp_path / "calls"
    recorded = tmp_path / "readings"
    recorded.mkdir()
    for node in ("sn1", "sn2"):
        readings(recorded / f"{node}.json", xids=1)
    args = args_for(tmp_path, holds, "--max-share", "100%", "--action", "drain_resume", "--max-drain", "1")
    args += ["--act", "all", f"--command=reset_gpu={stand_in(tmp_path / 'reset', calls, 'reset')} {{slurm_node}}"]
    for run_id in ("w1", "w2"):
        done = gpufleet(*args, "--run-id", run_id, env=sc.env())
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
        steps = [s for s in json.loads((reports / run_id / "ladder.json").read_text())["steps"] if s["step"] != "clear"]
        assert sorted(s["host"] for s in steps) == ["sn1", "sn2"], steps
        for s in steps:
            assert s["step"] == "retest" and not s["done"] and s["not_done"].startswith("held by the breaker: "), s
            assert f"- {s['host']}: retest (NOT done: {s['not_done']})" in done.stdout, done.stdout[-3000:]
        assert "its command failed" not in done.stdout and calls_of(calls) == []
        assert drained(sc) == {}


# ---------------------------------------------------------------- units: the rules over Slurm's own words

# What Slurm 22.05 wrote in the tests above: srun inside a job while slurmctld was down, slurmstepd's line when
# Slurm ended a job, squeue while munged was down.
SRUN_REFUSED = (
    "srun: error: Unable to confirm allocation for job 33: Unable to contact slurm controller (connect failure)\n"
    "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 33\n"
)
ENDED = "slurmstepd-sn1: error: *** JOB 33 ON sn1 CANCELLED AT 2026-11-28T16:56:00{} ***\n"
STARTED = f"{slurm.STAGE_STARTED} on sn1 at 2026-11-28T16:55:00Z\n"
HALF = {"results": [{"check": "gpu_count", "status": "pass", "value": 1}]}  # written after the checks
WHOLE = dict(HALF, finished="2026-11-28T16:55:40Z")


@pytest.mark.parametrize(
    ("end", "doc", "out", "ending", "words"),
    [
        ({"state": "FAILED"}, None, SRUN_REFUSED, "scheduler", "Unable to confirm allocation"),
        ({"state": None}, None, SRUN_REFUSED, "scheduler", "Unable to confirm allocation"),
        ({"state": "NODE_FAIL", "slurm_reason": "NodeDown"}, None, "", "scheduler", "(NODE_FAIL: NodeDown)"),
        (
            {"state": None},
            None,
            ENDED.format(" DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"),
            "scheduler",
            "NODE_FAIL",
        ),
        ({"state": "TIMEOUT"}, None, "", "scheduler", "time limit passed before the node stage started"),
        ({"state": None}, None, ENDED.format(" DUE TO TIME LIMIT"), "scheduler", "before the node stage started"),
        ({"state": None}, HALF, STARTED + ENDED.format(" DUE TO TIME LIMIT"), "judged", "ended TIMEOUT on its node"),
        ({"state": "TIMEOUT"}, HALF, STARTED, "judged", "ended TIMEOUT on its node"),
        ({"state": "FAILED"}, None, STARTED + "Traceback ...\n", "judged", "ended FAILED on its node"),
        ({"state": "COMPLETED"}, None, STARTED, "judged", "ended COMPLETED on its node"),
        ({"state": None}, WHOLE, STARTED, "judged", "judged from its document"),
        ({"state": "COMPLETED"}, WHOLE, STARTED, "judged", "judged from its document"),
        ({"state": None}, HALF, STARTED, "scheduler", "Slurm no longer holds it"),
        ({"state": None}, None, "", "scheduler", "Slurm no longer holds it"),
        ({"state": "PREEMPTED"}, WHOLE, STARTED, "no_verdict", "preempted by real work"),
        ({"state": None}, HALF, STARTED + ENDED.format(" DUE TO PREEMPTION"), "no_verdict", "preempted by real work"),
        ({"state": None}, None, ENDED.format(""), "no_verdict", "cancelled before it ended"),
        ({"state": "DEADLINE"}, None, "", "no_verdict", "could not start before its deadline"),
        ({"state": "RUNNING", "given_up": "still RUNNING past its bound (T)"}, None, "", "scheduler", "given up"),
    ],
)
def test_each_ending_of_a_sweep_job_is_told_from_what_it_wrote(end, doc, out, ending, words):
    job = {"node": "sn1", "host": "sn1", "job_id": "33", "slurm_end": end}
    kind, note = sweep_end.ending(job, doc, out)
    assert (kind, words in note) == (ending, True), note
    if kind == "scheduler":
        assert "not the node's" in note and "not drained" in note


def test_a_node_down_a_node_another_run_holds_and_a_job_never_submitted_leave_no_verdict():
    down = {"since": "T", "state": "DOWN+NOT_RESPONDING", "reason": "Not responding"}
    job = {"node": "sn2", "host": "sn2", "job_id": "31", "slurm_end": {"state": None}, "node_down": down}
    kind, note = sweep_end.ending(job, None, "")
    assert kind == "node_down" and "Slurm shows it DOWN+NOT_RESPONDING (Not responding)" in note
    assert "scontrol update nodename=sn2 state=resume" in note
    assert sweep_end.ending(job, WHOLE, STARTED)[0] == "judged"  # it finished its stage before: its verdict stands
    lock = {"results": [{"check": "node_lock", "status": "error", "reason": "the node is held by run 'v7'"}]}
    assert sweep_end.ending(dict(job, node_down=None), lock, STARTED) == (
        "no_verdict",
        "the node is held by run 'v7': no verdict for the node",
    )
    assert (
        sweep_end.ending({"error": "`sbatch` failed", "node": "sn1"}, None, "")[1] == "not submitted: `sbatch` failed"
    )


def test_slurm_s_own_words_say_the_scheduler_could_not_be_reached_and_how_a_job_ended():
    for said in (
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        'squeue: error: Munge encode failed: Failed to access "/x/munge.socket": No such file or directory',
        "slurm_load_jobs error: Protocol authentication error",
        "slurm_load_node error: Socket timed out on send/recv operation",
    ):
        assert slurm.unreachable_in(f"other\n{said}\n") == said
    assert slurm.unreachable_in("slurm_load_jobs error: Invalid job id specified") is None
    assert [slurm.ended_as(ENDED.format(why)) for why in ("", " DUE TO TIME LIMIT", " DUE TO PREEMPTION")] == [
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
    ]
    assert slurm.ended_as("no such line") is None


def test_each_cause_of_being_out_of_service_has_its_series():
    shown = slurm.parse_nodes(
        "\n".join(
            [
                "NodeName=a State=IDLE+DRAIN Partitions=p Reason=gpufleet hw xid; run r1 [root@t]",
                "NodeName=b State=IDLE+DRAIN Partitions=p Reason=admin: fan [alice@t]",
                "NodeName=c State=DOWN+NOT_RESPONDING Partitions=p Reason=Not responding [slurm@t]",
                "NodeName=d State=IDLE+FAIL Partitions=p Reason=admin: PSU [alice@t]",
                "NodeName=e State=IDLE Partitions=p",
            ]
        )
    )
    costs = {"nodes": {"a": {"out_of_service": True, "faults": [{"slurm_node": "a"}]}}}
    assert outputs.out_of_service(costs, shown) == {
        "a": {"gpufleet": True, "drained": False, "down": False},
        "b": {"gpufleet": False, "drained": True, "down": False},
        "c": {"gpufleet": False, "drained": False, "down": True},
        "d": {"gpufleet": False, "drained": False, "down": True},
        "e": {"gpufleet": False, "drained": False, "down": False},
    }


def test_history_names_a_nodes_one_cause_once_not_each_check_it_failed():
    no_driver = "no NVIDIA driver: libnvidia-ml.so not found"
    results = [
        {"check": f"gpu_health.{c}", "status": "error", "class": "software", "reason": no_driver}
        for c in ("ecc", "xid", "processes")
    ] + [{"check": "host_hygiene.numa", "status": "warn", "class": "configuration", "reason": "x"}]
    assert history_text._not_passing(results) == (
        f"{no_driver} (3 checks) error (software), host_hygiene.numa warn (configuration)"
    )
