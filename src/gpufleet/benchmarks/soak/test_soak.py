"""The soak: real runs on the CPU (two processes with gloo, seconds), how a run's end is told apart when a process
dies or hangs, and the sampler without NVML. Its verdict on GPU-shaped soaks: test_soak_judge.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.soak import soak_measure as soak  # noqa: E402
from gpufleet.benchmarks.soak import soak_outcome as outcome  # noqa: E402
from gpufleet.bench.monitor import SoakSampler  # noqa: E402
from gpufleet.benchmarks.soak import soak_judge as soak_check  # noqa: E402
from waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.fixture(scope="module")
def h200():
    return profiles.resolve("NVIDIA H200")


@pytest.fixture(scope="module")
def cpu_soak():
    t0 = time.monotonic()
    out = soak.run(3)
    return out, time.monotonic() - t0


# --- real runs on the CPU -------------------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_soak_runs_for_its_duration_in_windows_with_all_reduce_rounds(cpu_soak, h200):
    out, took = cpu_soak
    assert out["device"] == "cpu" and out["world_size"] == 2 and out["setup_error"] is None
    assert not out["stopped_early"] and 3 <= out["ran_s"] < 3 + 5
    assert took < soak.SETUP_TIMEOUT_S  # it ended: set-up (slow on a busy machine) and the 3 s
    assert out["window_s"] == 0.5 and out["n_windows"] == 6 and out["method"]["windows"] == 6
    for rank in ("0", "1"):
        g = out["gpus"][rank]
        assert g["error"] is None and g["done_s"] >= 3
        assert [w["index"] for w in g["windows"]] == list(range(6))
        # A burst takes longer on a busy machine: how many fit in 3 s is not the point, that they are counted is.
        assert sum(w["matmul_bursts"] for w in g["windows"]) >= 1 and g["matmul_tflops_median"] > 0
    assert out["nccl"]["rounds"] >= 1 and out["nccl"]["wrong"] == [] and out["nccl"]["busbw_gbps_median"] > 0
    results = {r["check"]: r for r in soak_check.soak(out, h200)}
    assert list(results) == ["soak_throttle", "soak_errors", "soak_slowdown"]
    for r in results.values():
        assert r["status"] == "skip" and "not a performance figure" in r["reason"], r
        assert r["detail"]["method"] == out["method"]
    assert multiprocessing.active_children() == []  # every process of the soak is gone


@pytest.mark.slow
def test_soak_cli_prints_a_host_document():
    cp = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "soak", "--duration-s", "2", "--json", "--host", "cpu-box"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=180,
    )
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [(r["check"], r["group"], r["status"]) for r in doc["results"]] == [
        ("soak_throttle", "benchmark", "skip"),
        ("soak_errors", "benchmark", "skip"),
        ("soak_slowdown", "benchmark", "skip"),
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "soak", "--duration-s", "0"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert (
        bad.returncode == 2
        and "soak duration 0.0 s; expected a positive number of seconds (--duration-s)" in bad.stderr
    )


def _cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _soak_in_thread(**kwargs):
    """soak.run in a thread; returns (thread, result holder, pids of its processes) once both processes are
    soaking. Setting up (torch imported and the group formed in each process) takes seconds on a quiet CPU, a
    minute or more on a busy one: the set-up timeout is generous, and the test waits for the start itself, then
    for half a CPU second of load in each process (bursts of 0.05 s), however long a busy machine takes."""
    import threading

    got, started = {}, threading.Event()

    def on_start(pids):
        got.update(pids=pids, cpu_s=[_cpu_s(p) for p in pids])
        started.set()

    runner = threading.Thread(target=lambda: got.update(out=soak.run(**kwargs, setup_timeout_s=240, on_start=on_start)))
    runner.start()
    wait_for(lambda: started.is_set() or not runner.is_alive(), 300, "the soak's start")
    assert started.is_set(), got.get("out", {}).get("setup_error")
    wait_for(
        lambda: all(_cpu_s(p) >= s + 0.5 for p, s in zip(got["pids"], got["cpu_s"])), 120, "load in both processes"
    )
    return runner, got, got["pids"]


@pytest.mark.slow
def test_a_process_killed_mid_soak_ends_it_and_is_named():
    import signal

    runner, got, pids = _soak_in_thread(duration_s=60, step_timeout_s=30)
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    runner.join(timeout=120)
    assert not runner.is_alive()
    out = got["out"]
    assert out["ran_s"] < 30  # not the 60 s asked for, nor the collective timeout
    assert out["setup_error"] is None and out["stopped_early"] and multiprocessing.active_children() == []
    (rank,) = [r for r, g in out["gpus"].items() if g["pid"] == victim]
    assert out["gpus"][rank]["error"]["error"] == "process exited with code -9 during the soak"
    assert out["stop_reason"] == f"process {rank} failed: process exited with code -9 during the soak"
    other = "1" if rank == "0" else "0"
    assert out["gpus"][other]["error"] is None  # the survivor lost its peer: not its fault
    assert [e["rank"] for e in out["after_effects"]] in ([], [int(other)])
    errs = {r["check"]: r for r in soak_check.soak(out, profiles.resolve(None))}["soak_errors"]
    assert errs["status"] == "fail" and f"process {rank}: the load stopped at 2026" in errs["reason"]
    assert f"process {other}" not in errs["reason"]


@pytest.mark.slow
def test_a_process_that_hangs_is_named_and_killed_after_the_grace():
    """A frozen process (SIGSTOP) sends nothing more; its peer waits in the next vote. Past the grace both are
    killed, and the one that fell behind is named."""
    import signal

    runner, got, pids = _soak_in_thread(duration_s=10, grace_s=1, step_timeout_s=60)
    victim = pids[0]
    os.kill(victim, signal.SIGSTOP)
    runner.join(timeout=120)
    assert not runner.is_alive()
    out = got["out"]
    assert out["setup_error"] is None and out["stopped_early"] and multiprocessing.active_children() == []
    (rank,) = [r for r, g in out["gpus"].items() if g["pid"] == victim]
    other = "1" if rank == "0" else "0"
    if out["gpus"][rank]["bursts"] < out["gpus"][other]["bursts"]:  # stopped inside a burst: it fell behind
        assert out["gpus"][rank]["error"]["error"].startswith("stopped answering: no burst after this time")
        assert out["gpus"][other]["error"] is None
        assert out["gpus"][rank]["last_burst_s"] < 8
    else:
        # Stopped while both waited in the same vote (likelier on a busy machine): the bursts are even and nothing
        # tells the two apart, so both are named as not finished, neither blamed alone.
        assert out["gpus"][rank]["bursts"] == out["gpus"][other]["bursts"], out["gpus"]
        for r in (rank, other):
            assert out["gpus"][r]["error"]["error"] == "not finished 1 s after the end; killed", out["gpus"][r]


class _Exited:
    """What _attribute reads of a worker process: its exit code (None while alive)."""

    def __init__(self, exitcode):
        self.exitcode = exitcode


def _ranks(bursts_per_rank: list, last_s: list) -> dict:
    return {
        r: {
            "info": None,
            "matmul": [(0.0, 0.1, 1.0)] * (n - n // 2),
            "copy": [(0.0, 0.1, 1.0)] * (n // 2),
            "nccl": [],
            "done_s": None,
            "error": None,
            "last_s": last,
        }
        for r, (n, last) in enumerate(zip(bursts_per_rank, last_s))
    }


def test_a_killed_rank_is_named_even_when_a_slow_peer_has_fewer_bursts():
    """Two cores under load: rank 1 was still in its round (one burst fewer) when rank 0 was killed, and had
    not reported its failed collective yet. The death decides."""
    ranks = _ranks([41, 40], [7.3, 7.1])
    out = {"after_effects": []}
    outcome.attribute(
        out, ranks, {}, [_Exited(-9), _Exited(None)], {0: 7.9}, False, (30.0, 180.0), time.monotonic() - 12
    )
    assert ranks[0]["error"]["error"] == "process exited with code -9 during the soak" and ranks[1]["error"] is None
    assert out["stop_reason"] == "process 0 failed: process exited with code -9 during the soak"


def test_a_rank_that_died_a_collective_timeout_after_the_hung_one_stopped_is_an_after_effect():
    """NCCL's watchdog ends a rank that waited a whole collective timeout for a hung one: the hung one is named."""
    ranks = _ranks([40, 41], [7.1, 7.3])
    out = {"after_effects": []}
    outcome.attribute(
        out, ranks, {}, [_Exited(None), _Exited(-6)], {1: 128.0}, True, (120.0, 180.0), time.monotonic() - 130
    )
    assert (
        ranks[0]["error"]["error"].startswith("stopped answering: no burst after this time")
        and ranks[1]["error"] is None
    )
    assert [(e["rank"], e["error"]) for e in out["after_effects"]] == [(1, "process exited with code -6")]
    assert out["stop_reason"].startswith("GPU 0 failed: stopped answering")


@pytest.mark.slow
def test_a_soak_that_cannot_set_up_is_one_failure():
    t0 = time.monotonic()
    out = soak.run(30, setup_timeout_s=0.2)
    assert time.monotonic() - t0 < 60  # the set-up timeout and the processes' end, not the 30 s
    assert out["setup_error"] == "processes [0, 1] not ready within 0.2 s"
    assert multiprocessing.active_children() == []
    (res,) = soak_check.soak(out, profiles.resolve(None))
    assert (res["check"], res["status"]) == ("soak", "fail")
    assert res["reason"] == "soak could not start: processes [0, 1] not ready within 0.2 s"


def test_sampler_without_nvml_says_so():
    sampler = SoakSampler().open()
    assert sampler.error and sampler.error.startswith("NVML unavailable")
    sampler.start(time.monotonic())
    sampler.stop()
    s = sampler.summary(30.0, 2)
    assert s["per_gpu"] == {} and s["events"] == [] and s["samples"] == 0
