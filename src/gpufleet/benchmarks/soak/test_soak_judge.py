"""The soak's verdict on GPU-shaped soaks (tests/soak_runs.py builds them through the real code): a GPU that slows,
its hardware slowdown, its counters and Xids, a load that stopped, a watch that saw nothing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.benchmarks.soak import soak_measure as soak  # noqa: E402
from gpufleet.collect import kernel_log  # noqa: E402
from soak_runs import SERIAL, UUID, ZERO_COUNTERS, gpu_soak, sampled, verdict  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.fixture(scope="module")
def h200():
    return profiles.resolve("NVIDIA H200")


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
