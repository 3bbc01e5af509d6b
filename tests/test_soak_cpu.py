"""The soak: real runs on the CPU (two processes with gloo, seconds), and its verdict on GPU-shaped soaks.

The GPU-shaped soaks go through the real code that builds a soak's output: outcome.finish from the bursts the
worker processes send, and SoakSampler.note_* from the readings its thread takes (NVML and the kernel log),
so only the numbers are made up, never the shape.
"""

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
from gpufleet.collect import kernel_log  # noqa: E402
from waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")

EPOCH = 1795428000.0  # 2026-11-23T10:00:00Z
UUID = [
    "GPU-df63b106-711b-65ab-d334-1175fcbc7655",
    "GPU-755c8ad9-4858-d710-94b4-5641916ac523",
    "GPU-0c2d9a51-6a8e-4a7e-9d59-2f3c3b1d9e01",
    "GPU-4f1e0d2c-3b4a-5968-7a8b-9c0d1e2f3a4b",
]
PCI = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
SERIAL = ["1653724058331", "1653724049352", "1653724049999", "1653724050123"]
ZERO_COUNTERS = {
    c: 0
    for c in (
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "row_remap_correctable",
        "row_remap_uncorrectable",
        "row_remap_pending",
        "row_remap_failure",
        "nvlink_crc_data",
        "nvlink_crc_flit",
        "nvlink_replay",
        "nvlink_recovery",
        "pcie_replay",
    )
}


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


# --- GPU-shaped soaks: the verdict ---------------------------------------------------------------------


def bursts(values_per_window: list, window_s: float, scale: float, per_window: int = 6) -> list:
    """The (t_end, seconds, work) bursts a worker sends, giving `value` (TFLOPS or GB/s) in each window."""
    out = []
    for w, value in enumerate(values_per_window):
        for k in range(per_window):
            out.append((w * window_s + (k + 0.5) * window_s / per_window, 0.5, value * scale * 0.5))
    return out


def gpu_soak(
    tflops: list[list],
    *,
    gbps: list[list] | None = None,
    busbw: list | None = None,
    window_s: float = 30.0,
    errors: dict | None = None,
    wrong: list | None = None,
    sampler: SoakSampler | None = None,
) -> dict:
    """A soak of len(tflops) GPUs over len(tflops[0]) windows, built as soak.run builds it."""
    n_gpus, n_windows = len(tflops), len(tflops[0])
    gbps = gbps or [[4200.0] * n_windows for _ in range(n_gpus)]
    sampler = sampler or sampled(n_gpus, n_windows * window_s)
    out = {
        "benchmark": "soak",
        "device": "cuda",
        "method": {"window_s": window_s},
        "versions": {"torch": "2.11"},
        "duration_s": n_windows * window_s,
        "window_s": window_s,
        "n_windows": n_windows,
        "world_size": n_gpus,
        "started": "2026-11-23T10:00:00Z",
        "started_epoch": EPOCH,
        "ran_s": n_windows * window_s + 0.6,
        "setup_error": None,
        "stopped_early": bool(errors),
        "stop_reason": None,
        "gpus": {},
        "nccl": None,
        "sampler": sampler.summary(window_s, n_windows),
    }
    ranks = {}
    for r in range(n_gpus):
        nccl = []
        if n_gpus > 1:
            factor = 2 * (n_gpus - 1) / n_gpus
            for w, bw in enumerate(busbw or [360.0] * n_windows):
                secs = soak.SIZES["cuda"]["nccl_bytes"] / (bw / factor * 1e9)
                nccl.append((w * window_s + 10, secs, not (wrong and (r, w) in wrong)))
        ranks[r] = {
            "info": {
                "name": "NVIDIA H200",
                "uuid": UUID[r],
                "pci_bus_id": PCI[r][:-2],
                "matmul_ops_per_burst": 360,
                "copy_ops_per_burst": 60,
            },
            "matmul": bursts(tflops[r], window_s, 1e12),
            "copy": bursts(gbps[r], window_s, 1e9),
            "nccl": nccl,
            "done_s": n_windows * window_s + 0.5,
            "error": (errors or {}).get(r),
            "last_s": n_windows * window_s,
        }
    return outcome.finish(out, ranks, soak.SIZES["cuda"]["nccl_bytes"])


def sampled(n_gpus: int, seconds: float, throttle: dict | None = None) -> SoakSampler:
    """A sampler that saw the GPUs at 1 Hz: 1980 MHz, 62 C, 690 W, a software power cap (normal under load);
    `throttle` {gpu: (from_s, to_s, mask)} adds hardware slowdown reasons."""
    s = SoakSampler()
    for i in range(n_gpus):
        s.gpus[i] = {"uuid": UUID[i], "serial": SERIAL[i], "pci_bus_id": PCI[i], "name": "NVIDIA H200"}
        s.counters_start[i] = s.counters_last[i] = dict(ZERO_COUNTERS)
        for t in range(int(seconds)):
            mask = 0x4
            lo, hi, extra = (throttle or {}).get(i, (None, None, 0))
            if lo is not None and lo <= t < hi:
                mask |= extra
            s.note_sample(i, float(t), 1980 if not mask & ~0x4 else 1410, 3201, 62, 690.0, mask)
    s.kernel_log_source = "/dev/kmsg"
    return s


def verdict(out, profile) -> dict:
    return {r["check"]: r for r in soak_check.soak(out, profile)}


def test_a_healthy_soak_passes_and_says_what_it_watched(h200):
    out = gpu_soak([[790.0] * 20, [786.0] * 20])
    assert out["gpus"]["1"]["nvml_index"] == 1 and out["gpus"]["0"]["matmul_tflops_median"] == 790.0
    res = verdict(out, h200)
    assert {k: r["status"] for k, r in res.items()} == {
        "soak_throttle": "pass",
        "soak_errors": "pass",
        "soak_slowdown": "pass",
    }
    assert (
        res["soak_throttle"]["reason"]
        == "no hardware or thermal slowdown on 2 GPU(s) over 600.6 s (lowest SM clock 1980 MHz)"
    )
    assert res["soak_errors"]["reason"].startswith("no error counter moved, no Xid, every GPU held the load to the end")
    assert "20 all_reduce rounds correct" in res["soak_errors"]["reason"]
    assert (
        res["soak_slowdown"]["reason"]
        == "every window of every GPU within 10% of its best windows and 10% of its siblings over 20 windows of 30 s"
    )
    assert (
        res["soak_slowdown"]["threshold"]["key"] == "soak_slowdown_pct_max"
        and res["soak_slowdown"]["threshold"]["value"] == 10
    )
    # The software power cap under load is recorded, not judged.
    assert res["soak_throttle"]["detail"]["per_gpu"]["0"]["throttle"]["sw_power_cap"]["seconds"] == 600.0
    assert all("flagged_gpus" not in r["detail"] for r in res.values())


def test_a_gpu_that_slows_is_named_with_the_window_it_happened(h200):
    slow = [790.0] * 12 + [700.0] * 8  # 11.4% below from 360 s on
    res = verdict(gpu_soak([[790.0] * 20, slow]), h200)["soak_slowdown"]
    assert res["status"] == "fail" and res["value"] == 11.4 and res["unit"] == "%"
    assert (
        "GPU 1: bf16 matmul 700 TFLOPS in the window from 2026-11-23T10:06:00Z (360 s into the soak) and 7 window(s) "
        "after it, 11.4% below its best windows' median 790 TFLOPS (lowest 700 TFLOPS, 11.4% below); the sampler saw "
        "then: SM clock median 1980 MHz; power median 690 W; clock event reasons sw_power_cap; no foreign process"
    ) in res["reason"]
    assert res["detail"]["flagged_gpus"] == [{"index": 1, "uuid": UUID[1], "serial": SERIAL[1]}]
    # At the threshold exactly it passes.
    edge = verdict(gpu_soak([[790.0] * 20, [790.0] * 12 + [711.0] * 8]), h200)["soak_slowdown"]
    assert edge["status"] == "pass" and edge["value"] == 10.0


def test_a_gpu_slow_from_the_start_is_named_against_its_siblings(h200):
    res = verdict(gpu_soak([[790.0] * 10, [791.0] * 10, [640.0] * 10]), h200)["soak_slowdown"]
    assert res["status"] == "fail"
    assert (
        "GPU 2: bf16 matmul median 640 TFLOPS over the soak, 19% below the node's median GPU (790 TFLOPS)"
        in res["reason"]
    )
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [2]


def test_hbm_and_nccl_slowdowns_are_named(h200):
    gbps = [[4200.0] * 10, [4200.0] * 5 + [3500.0] * 5]
    res = verdict(gpu_soak([[790.0] * 10] * 2, gbps=gbps, busbw=[360.0] * 6 + [250.0] * 4), h200)["soak_slowdown"]
    assert res["status"] == "fail"
    assert "GPU 1: HBM copy 3500 GB/s in the window from 2026-11-23T10:02:30Z (150 s into the soak)" in res["reason"]
    assert (
        "all_reduce busbw 250 GB/s in the window from 2026-11-23T10:03:00Z (180 s into the soak), 30.6% below the best "
        "windows' median 360 GB/s"
    ) in res["reason"]


def test_a_soak_too_short_to_compare_windows_skips_the_slowdown(h200):
    res = verdict(gpu_soak([[790.0]] * 2, window_s=30.0), h200)["soak_slowdown"]
    assert res["status"] == "skip" and "a slowdown needs two or more" in res["reason"]


def test_hardware_slowdown_names_the_gpu_the_reason_and_the_time(h200):
    sampler = sampled(2, 600, throttle={1: (421, 463, 0x40)})  # HW thermal slowdown for 42 s
    res = verdict(gpu_soak([[790.0] * 20] * 2, sampler=sampler), h200)["soak_throttle"]
    assert res["status"] == "fail" and res["value"] == 42.0 and res["unit"] == "s"
    assert res["reason"] == "GPU 1: HW thermal slowdown at 2026-11-23T10:07:01Z (421 s into the soak), 42 s in all"
    assert "cooling" in res["remedy"]
    assert res["detail"]["flagged_gpus"] == [{"index": 1, "uuid": UUID[1], "serial": SERIAL[1]}]
    windows = res["detail"]["per_gpu"]["1"]["windows"]
    assert windows[14]["sm_clock_min_mhz"] == 1410 and "hw_thermal_slowdown" in windows[14]["reasons"]
    assert windows[0]["sm_clock_min_mhz"] == 1980 and windows[0]["reasons"] == ["sw_power_cap"]
    # soak_throttle_s_max tolerates some seconds.
    lenient = profiles.resolve("NVIDIA H200", overrides={"soak_throttle_s_max": 42})
    assert verdict(gpu_soak([[790.0] * 20] * 2, sampler=sampler), lenient)["soak_throttle"]["status"] == "pass"


def test_counters_that_move_and_xids_name_the_gpu_and_time(h200, tmp_path):
    sampler = sampled(2, 600)
    sampler.note_counters(0, dict(ZERO_COUNTERS, nvlink_crc_data=3), 125.0)
    sampler.note_counters(0, dict(ZERO_COUNTERS, nvlink_crc_data=12), 250.0)
    sampler.note_counters(1, dict(ZERO_COUNTERS, ecc_uncorrected_volatile=1), 300.0)
    (tmp_path / "dev").mkdir()
    kmsg = tmp_path / "dev" / "kmsg"
    kmsg.write_text("4,1,1,-;NVRM: Xid (PCI:0000:2a:00): 13, pid=9, Graphics Exception\n")
    sampler.note_kernel_log(kernel_log.read(str(tmp_path)), None)  # at the start: already there, not an event
    kmsg.write_text(
        kmsg.read_text() + "4,2,2,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=9, DBE\n"
        "4,3,3,-;NVRM: Xid (PCI:0000:18:00): 31, pid=9, MMU Fault\n"
    )
    sampler.note_kernel_log(kernel_log.read(str(tmp_path)), 330.0)
    res = verdict(gpu_soak([[790.0] * 20] * 2, sampler=sampler), h200)["soak_errors"]
    assert res["status"] == "fail" and res["value"] == 5 and res["unit"] == "events"
    reason = res["reason"]
    assert "GPU 1: ecc_uncorrected_volatile 0 -> 1, first at 2026-11-23T10:05:00Z (300 s into the soak)" in reason
    assert "GPU 1: Xid 48 at 2026-11-23T10:05:30Z (330 s into the soak)" in reason
    assert "GPU 0: Xid 31 at 2026-11-23T10:05:30Z" in reason
    assert "Xid 13" not in reason
    # NVLink CRC counts that moved are a rate, information under DCGM's limit; they follow the failures.
    assert reason.index("GPU 0: nvlink_crc_data 0 -> 12, first at 2026-11-23T10:02:05Z") > reason.index("Xid 48")
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [1, 0]
    moved = [e for e in res["detail"]["events"] if e["kind"] == "counter" and e["counter"] == "nvlink_crc_data"]
    assert [(e["from"], e["to"], e["t_s"]) for e in moved] == [(0, 3, 125.0), (3, 12, 250.0)]
    assert res["detail"]["per_gpu"]["0"]["counters_end"]["nvlink_crc_data"] == 12
    # Only CRC counts moving, 3 in the 600.6 s soak: information with the rate; corrected ECC errors warn.
    sampler = sampled(2, 600)
    sampler.note_counters(0, dict(ZERO_COUNTERS, nvlink_crc_data=3), 125.0)
    res = verdict(gpu_soak([[790.0] * 20] * 2, sampler=sampler), h200)["soak_errors"]
    assert res["status"] == "info" and res["remedy"] is None and res["class"] is None
    assert res["reason"].startswith("no error counter past its limit, no Xid, every GPU held the load to the end")
    assert (
        "GPU 0: nvlink_crc_data 0 -> 3, first at 2026-11-23T10:02:05Z (125 s into the soak): 0.005 a second over "
        "10 min, limit 100 a second a GPU, its links together (DCGM, fleet_counter_nvlink_crc_per_s_fail)"
    ) in res["reason"]
    sampler.note_counters(1, dict(ZERO_COUNTERS, ecc_corrected_volatile=2), 200.0)
    res = verdict(gpu_soak([[790.0] * 20] * 2, sampler=sampler), h200)["soak_errors"]
    assert res["status"] == "warn" and "GPU 1: ecc_corrected_volatile 0 -> 2" in res["reason"]
    assert "errors corrected under load" in res["remedy"] and [g["index"] for g in res["detail"]["flagged_gpus"]] == [1]


def test_a_gpu_whose_load_stopped_and_a_wrong_all_reduce_fail(h200):
    errors = {1: {"t_s": 754.2, "error": "RuntimeError: CUDA error: an illegal memory access was encountered"}}
    res = verdict(gpu_soak([[790.0] * 30] * 2, errors=errors, wrong=[(0, 7)]), h200)["soak_errors"]
    assert res["status"] == "fail"
    assert (
        "GPU 1: the load stopped at 2026-11-23T10:12:34Z (754 s into the soak): RuntimeError: CUDA error: "
        "an illegal memory access was encountered"
    ) in res["reason"]
    assert "GPU 0: all_reduce gave wrong results at 2026-11-23T10:03:40Z (220 s into the soak)" in res["reason"]
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [1, 0]


def test_no_watch_is_an_error_not_a_pass(h200):
    out = gpu_soak([[790.0] * 10] * 2)
    out["sampler"] = {"error": "NVML unavailable: Driver Not Loaded", "per_gpu": {}, "events": []}
    res = verdict(out, h200)
    assert res["soak_throttle"]["status"] == "error" and "Driver Not Loaded" in res["soak_throttle"]["reason"]
    assert res["soak_errors"]["status"] == "error"
    sampler = sampled(2, 300)
    sampler.note_kernel_log(
        {
            "source": "none",
            "readable": False,
            "error": "kernel log unreadable: /dev/kmsg: Operation not permitted",
            "lines": 0,
            "xid_events": [],
        },
        None,
    )
    res = verdict(gpu_soak([[790.0] * 10] * 2, sampler=sampler), h200)["soak_errors"]
    assert (
        res["status"] == "error"
        and "Xid events not watched: kernel log unreadable" in res["reason"]
        and "root" in res["remedy"]
    )


def test_windows_grow_for_long_soaks():
    assert soak.window_for(600, cpu=False) == 30
    assert soak.window_for(7200, cpu=False) == 60  # 2 h: at most 120 windows
    assert soak.window_for(3, cpu=True) == 0.5
