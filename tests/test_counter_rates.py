"""The fabric's error counters as rates, one rule wherever they are judged (checks.counter_rates): the node stage on
the controller (fleet.counters_during_run, fleet.fabric_during_run) and a soak (benchmark.soak_errors).

The node stage's snapshots are read by collect.counters from the recorded 2 x H200 readings (18 NVLinks a GPU, each
link's own counters), the second with growth added to chosen links; the soak's from the sampler's own reads, and the
recorded 2 x H200 soak (docs/results/calibration/2026-11-26-h200-x2-soak.json.gz) replayed. Limits: DCGM's 100 NVLink
CRC errors a second a GPU (fail), any NVLink replay or recovery (fail during a watched window), 16 PCIe replays a
minute (warn), 16 correctable AER errors a minute (fail, tests/test_fabric.py).
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from gpufleet.base import profiles
from gpufleet.benchmarks.soak import soak_error_events as error_events
from gpufleet.benchmarks.soak.soak_naming import SoakGpus
from gpufleet.collect import counters
from gpufleet.comparisons import metrics
from gpufleet.fleet import counter_growth
from gpufleet.comparisons.thresholds import Thresholds, thresholds_for

import tool_modules
from soak_runs import ZERO_COUNTERS, gpu_soak, sampled, verdict

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "data" / "readings" / "recorded-h200-x2-vm.json"
SOAK = ROOT / "docs" / "results" / "calibration" / "2026-11-26-h200-x2-soak.json.gz"
T0 = "2026-11-28T10:00:00Z"
CRC_LIMIT = "limit 100 a second a GPU, its links together (DCGM, fleet_counter_nvlink_crc_per_s_fail)"


@pytest.fixture(scope="module")
def h200():
    return profiles.resolve("NVIDIA H200")


def snapshots(growth: dict, seconds: int, pcie: dict | None = None) -> list[dict]:
    """The counter snapshots of the recorded readings and of the same read `seconds` later with `growth` {(gpu, link,
    counter): n} added to those links and `pcie` {gpu: (before, after)} PCIe replays."""
    first = json.loads(H200.read_text())
    second = copy.deepcopy(first)
    for (gpu, link, counter), n in growth.items():
        second["nvml"]["gpus"][gpu]["nvlink"][link]["errors"][counter] += n
    for gpu, (a, b) in (pcie or {}).items():
        first["nvml"]["gpus"][gpu]["pcie_replay"], second["nvml"]["gpus"][gpu]["pcie_replay"] = a, b
    results = []
    for phase, readings, at in (("before", first, T0), ("after", second, f"2026-11-28T10:{seconds // 60:02d}:00Z")):
        res = counters.snapshot(phase, readings, boot_id="boot-1")
        res["detail"]["read_at"] = at
        results.append(dict(res, group="counters"))
    return results


def during(growth: dict, seconds: int, pcie: dict | None = None) -> dict:
    """counters_during_run over snapshots(growth, seconds, pcie)."""
    found = metrics.extract(snapshots(growth, seconds, pcie))
    return counter_growth.counters_during_run("n0", found, Thresholds(thresholds_for("h200-sxm")))


def test_the_snapshot_keeps_each_links_counts():
    readings = json.loads(H200.read_text())
    snap = counters.snapshot("before", readings)["detail"]["gpus"][1]
    links = snap["nvlink_links"]
    assert len(links) == 18 and links["1"] == {"crc_data": 26, "crc_flit": 0, "recovery": 0, "replay": 0}
    assert sum(link["crc_data"] for link in links.values()) == snap["counters"]["nvlink_crc_data"]


def test_crc_errors_at_10_a_second_on_a_link_are_information_with_the_rate():
    res = during({(1, 4, "crc_data"): 600}, 60)
    assert res["status"] == "info" and res["class"] is None and res["remedy"] is None
    assert (
        f"NVLink CRC data errors grew in 1 min: GPU 1 10 a second (18 links, most on link 4: 10 a second); {CRC_LIMIT}"
        in res["reason"]
    )
    entry = res["detail"]["per_gpu"][1]["counters"]["nvlink_crc_data"]
    assert entry["status"] == "info" and entry["rated"]["rate"] == 10 and entry["link_growth"]["4"] == 600
    assert entry["judged_by"] == "rate over 60 s"
    assert res["detail"]["per_gpu"][0]["counters"]["nvlink_crc_data"]["status"] == "pass"  # did not move


def test_crc_errors_at_150_a_second_fail_naming_the_gpu_and_link():
    res = during({(0, 7, "crc_flit"): 9000, (1, 2, "crc_data"): 60}, 60)
    assert res["status"] == "fail" and res["class"] == "hardware"
    assert (
        "GPU 0 (GPU-" in res["reason"]
        and "NVLink CRC FLIT errors grew by 9000 in 1 min: 150 a second (18 links, most on link 7: 150 a second)"
        in res["reason"]
    )
    assert CRC_LIMIT in res["reason"] and "nvidia-smi nvlink -e" in res["remedy"]
    assert "NVLink CRC data errors grew in 1 min: GPU 1 1 a second" in res["reason"]  # the other GPU: information
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [0]


@pytest.mark.parametrize("per_link,status", [(5, "info"), (6, "fail")])
def test_the_limit_is_a_gpus_links_together_as_dcgm_reads_them(per_link, status):
    # 18 links at 5 a second: 90 a GPU; at 6: 108, over DCGM's 100 though no link comes near it.
    res = during({(0, link, "crc_data"): per_link * 60 for link in range(18)}, 60)
    assert res["status"] == status
    assert res["detail"]["per_gpu"][0]["counters"]["nvlink_crc_data"]["rated"]["rate"] == 18 * per_link


@pytest.mark.parametrize("growth,status", [(5999, "info"), (6000, "fail")])
def test_at_the_limit_fails(growth, status):
    assert during({(0, 0, "crc_data"): growth}, 60)["status"] == status


@pytest.mark.parametrize("counter", ["replay", "recovery"])
def test_any_nvlink_replay_or_recovery_during_the_run_fails(counter):
    res = during({(1, 9, counter): 1}, 60)
    label = {"replay": "NVLink replays", "recovery": "NVLink recoveries"}[counter]
    assert res["status"] == "fail" and f"{label} grew by 1 in 1 min" in res["reason"]
    assert "fleet_counter_nvlink_replay_recovery_max 0" in res["reason"]


@pytest.mark.parametrize("replays,status", [(5, "info"), (16, "warn")])
def test_pcie_replays_a_minute_warn_from_dcgms_rate(replays, status):
    res = during({}, 60, pcie={0: (2, 2 + replays)})
    assert res["status"] == status
    assert f"{replays} a minute" in res["reason"] and "limit 16 a minute a GPU (DCGM" in res["reason"]


def test_a_window_shorter_than_the_unit_counts_as_one():
    res = during({}, 0, pcie={0: (0, 20)})  # read in the same second: 20 replays against 16 a minute
    entry = res["detail"]["per_gpu"][0]["counters"]["pcie_replay"]
    assert res["status"] == "warn" and entry["rated"]["rate"] == 20
    assert entry["judged_by"].startswith("count: the window (unknown) is shorter than")


# --- the soak ------------------------------------------------------------------------------------------------------


def soak_reads(gpu_rates: dict, seconds: float = 150.0, links: int = 18) -> object:
    """A 150 s soak's sampler that read each GPU's counters every 5 s with NVLink CRC data errors growing at
    `gpu_rates` {gpu: a second}, spread over `links` links, from the issue's starting count (948)."""
    s = sampled(len(gpu_rates), seconds)
    for gpu, rate in gpu_rates.items():
        start = dict(ZERO_COUNTERS, nvlink_crc_data=948, nvlink_links={str(k): {"crc_data": 0} for k in range(links)})
        s.counters_start[gpu] = s.counters_last[gpu] = start
        for t in range(5, int(seconds) + 1, 5):
            grown = round(rate * t)
            per = {str(k): {"crc_data": grown // links + (k < grown % links)} for k in range(links)}
            s.note_counters(gpu, dict(ZERO_COUNTERS, nvlink_crc_data=948 + grown, nvlink_links=per), float(t))
    return s


def test_a_soaks_crc_growth_of_7_to_12_a_second_is_information_not_a_warning(h200):
    # The healthy H200 soaks: 948 -> 2045 in 150 s (7.3 a second) and up to 12 a second a GPU.
    res = verdict(gpu_soak([[790.0] * 5] * 2, sampler=soak_reads({0: 1097 / 150, 1: 12.0})), h200)["soak_errors"]
    assert res["status"] == "info" and res["remedy"] is None and res["class"] is None
    assert res["reason"].startswith("no error counter past its limit, no Xid, every GPU held the load to the end")
    assert (
        "GPU 0: nvlink_crc_data 948 -> 2045, first at 2026-11-23T10:00:05Z (5 s into the soak): 7.28 a second (18 "
        f"links, most on link 0: 0.405 a second) over 151 s, {CRC_LIMIT}"
    ) in res["reason"]
    assert "GPU 1: nvlink_crc_data 948 -> 2748" in res["reason"] and "11.9 a second (18 links" in res["reason"]
    assert res["detail"]["counter_rates"]["1"]["nvlink_crc_data"]["rate"] == pytest.approx(1800 / 150.6, rel=1e-3)


def test_a_soaks_crc_growth_at_150_a_second_fails(h200):
    res = verdict(gpu_soak([[790.0] * 5] * 2, sampler=soak_reads({0: 2.0, 1: 150.0}, links=1)), h200)["soak_errors"]
    assert res["status"] == "fail" and res["class"] == "hardware" and "nvidia-smi nvlink -e" in res["remedy"]
    assert "GPU 1: nvlink_crc_data 948 -> 23448" in res["reason"] and "149 a second (link 0)" in res["reason"]
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [1]


def test_a_replay_during_a_soak_fails(h200):
    s = sampled(2, 150)
    s.note_counters(0, dict(ZERO_COUNTERS, nvlink_replay=1), 75.0)
    res = verdict(gpu_soak([[790.0] * 5] * 2, sampler=s), h200)["soak_errors"]
    assert res["status"] == "fail" and "GPU 0: nvlink_replay 0 -> 1, first at" in res["reason"]


def test_the_sampler_keeps_each_links_counts_without_events_for_them():
    s = soak_reads({0: 10.0}, seconds=20)
    assert [e["to"] for e in s.events] == [998, 1048, 1098, 1148]  # the links' counts are kept, not events
    assert s.summary(10.0, 2)["per_gpu"]["0"]["counters_end"]["nvlink_links"]["3"] == {"crc_data": 11}


def test_the_recorded_h200_soak_replayed_is_information(h200):
    """The 2 x H200 soak of docs/results/2026-11-26-h200-x2-moved-paths, whose soak_errors warned: GPU 0's CRC data
    errors 3840 -> 4135, GPU 1's 2774 -> 3060 in 45.6 s, judged again as rates."""
    doc = json.loads(gzip.decompress(SOAK.read_bytes()))
    recorded = next(r for r in doc["results"] if r["check"] == "soak_errors")
    assert recorded["status"] == "warn"  # what the run said
    d = recorded["detail"]
    out = {
        "device": "cuda",
        "ran_s": d["ran_s"],
        "started_epoch": None,
        "gpus": d["processes"],
        "nccl": None,
        "sampler": {"events": d["events"], "per_gpu": d["per_gpu"], "kernel_log": {}},
    }
    res = error_events.soak_errors(out, h200, {}, SoakGpus(out), cpu=False)
    assert res["status"] == "info"
    assert "GPU 0: nvlink_crc_data 3840 -> 4135" in res["reason"] and "6.47 a second over 46 s" in res["reason"]
    assert "GPU 1: nvlink_crc_data 2774 -> 3060" in res["reason"] and "6.27 a second" in res["reason"]


# --- the calibration table's healthy rates ---------------------------------------------------------------------------


def _calibration_counters():
    return tool_modules.load("calibration_counters")


def test_the_calibration_tables_rates_from_a_recorded_node_stage_and_soak():
    cc = _calibration_counters()
    # A clean acceptance run of `gpufleet fleet run` on 4 x H200: its GPUs' CRC data errors grew by 1285, 815, 1229
    # and 1299 in the 77 s between the snapshots.
    line = gzip.decompress((SOAK.parent / "2026-11-26-h200-x4-fleet-run-1.jsonl.gz").read_bytes()).splitlines()[0]
    rates = cc.stage_rates(json.loads(line)["document"])
    assert rates["nvlink_crc_data"] == pytest.approx([1285 / 77, 815 / 77, 1229 / 77, 1299 / 77], rel=1e-3)
    assert rates["nvlink_replay"] == [0, 0, 0, 0] and rates["pcie_replay"] == [0, 0, 0, 0]
    soak = cc.soak_rates(json.loads(gzip.decompress(SOAK.read_bytes())))
    # The soak (45.6 s) and its windows measured again (60.2 s), two GPUs each.
    crc = soak["NVIDIA H200"]["nvlink_crc_data"]
    assert len(crc) == 4 and crc[:2] == pytest.approx([295 / 45.6, 286 / 45.6], rel=1e-3)
    # Snapshots that hold each link's counts give the busiest link's rate too.
    rates = cc.stage_rates({"results": snapshots({(1, 4, "crc_data"): 600, (1, 5, "crc_data"): 60}, 60)})
    assert rates["nvlink_crc_data"] == [0, 11] and rates["nvlink_crc_data (busiest link)"] == [0, 10]
