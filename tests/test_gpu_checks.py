"""GPU inventory and health checks over recorded readings.

The base fixture is one healthy 8 x H100 SXM node in the shape `gpufleet
collect` writes; each failure case changes one thing in a copy of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.node import host_documents
from gpufleet import checks
from gpufleet.checks import gpu_inventory
from gpufleet.collect import kernel_log, nvml
from gpufleet.collect.nvml.nvlinks import NVLINK_COUNTERS
from gpufleet.collect.nvml.processes import visible_indices

DATA = Path(__file__).resolve().parent / "data" / "readings"
HEALTHY = DATA / "h100-sxm-8gpu-healthy.json"
SRC = Path(__file__).resolve().parents[1] / "src"
GROUPS = ["gpu_inventory", "gpu_health"]
GPU_CHECKS = [name for name, _ in checks.GROUPS["gpu_inventory"] + checks.GROUPS["gpu_health"]]


def healthy() -> dict:
    return json.loads(HEALTHY.read_text())


def run(readings: dict, **kwargs) -> dict[str, dict]:
    doc = host_documents.check_host(readings, GROUPS, host="node0", **kwargs)
    return {r["check"]: r for r in doc["results"]}


def gpu(readings: dict, index: int) -> dict:
    return readings["nvml"]["gpus"][index]


def test_healthy_h100_node_passes_everything():
    results = run(healthy())
    assert set(GPU_CHECKS) <= set(results)
    for name in GPU_CHECKS:
        r = results[name]
        want = "skip" if name == "retired_pages" else "pass"  # Hopper remaps rows instead of retiring pages
        assert r["status"] == want, r
        assert r["reason"] and "crashed" not in r["reason"]
        assert r["remedy"] is None
    assert "profile" not in results  # the H100 profile matched the NVML name
    assert results["nvlink"]["reason"] == (
        "18 active NVLinks on each of 8 GPUs; NVLink error counts in detail (no CRC errors counted), "
        "judged as rates by checks.counter_rates"
    )
    assert results["processes"]["reason"] == "no process on the 8 GPUs of this node"
    assert results["gpu_count"]["reason"] == "found 8 GPUs (NVIDIA H100 80GB HBM3)"
    assert schema_verdict(results) == "pass"


def schema_verdict(results: dict) -> str:
    from gpufleet.base.schema import verdict

    return verdict(results.values())


def test_inventory_is_in_gpu_count_detail():
    readings = healthy()
    inv = run(readings)["gpu_count"]["detail"]["inventory"]
    assert inv["driver_version"] == "535.183.01" and inv["cuda_driver_version"] == "12.2"
    assert [g["pci_bus_id"] for g in inv["gpus"]] == [g["pci_bus_id"] for g in readings["nvml"]["gpus"]]
    assert inv["gpus"][3] == {
        "index": 3,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": gpu(readings, 3)["uuid"],
        "serial": gpu(readings, 3)["serial"],
        "pci_bus_id": "0000:5d:00.0",
        "memory_total_mib": 81559,
        "vbios": "96.00.89.00.01",
    }


def test_fixture_has_the_collectors_shape():
    readings = healthy()
    assert set(readings) == {"nvml", "host", "kernel_log"}
    assert set(readings["kernel_log"]) == {"source", "readable", "error", "lines", "xid_events"}
    for g in readings["nvml"]["gpus"]:
        assert set(g) == set(nvml.GPU_FIELDS)


# --- failure cases: one change to the healthy node each ----------------------------------------------


def _set(index, path, value):
    def change(r):
        target = gpu(r, index)
        *parents, last = path.split(".")
        for p in parents:
            target = target[p]
        target[last] = value

    return change


def _link_down(index, link):
    return lambda r: gpu(r, index)["nvlink"][link].update(active=False, remote_pci_bus_id=None)


def _drop_gpu(index):
    return lambda r: r["nvml"]["gpus"].pop(index)


def _all(*changes):
    def change(r):
        for c in changes:
            c(r)

    return change


CASES = [
    # (id, change, check, status, text in reason, text in remedy)
    (
        "ecc-volatile",
        _set(3, "ecc_volatile_uncorrected", 2),
        "ecc",
        "fail",
        "GPU 3: 2 volatile uncorrectable ECC errors",
        "nvidia-smi -r -i 3",
    ),
    (
        "ecc-aggregate",
        _set(3, "ecc_aggregate_uncorrected", 5),
        "ecc",
        "warn",
        "GPU 3: 5 uncorrectable ECC errors over its lifetime (0 row(s) remapped for them, none pending or failed)",
        "gpufleet baseline set",
    ),
    ("ecc-off", _set(1, "ecc_mode_current", False), "ecc", "fail", "GPU 1: ECC off", "-e 1"),
    (
        "remap-pending",
        _set(5, "remapped_rows.pending", True),
        "row_remapping",
        "fail",
        "GPU 5: row remap pending",
        "reset the GPU to apply the remap",
    ),
    (
        "remap-failure",
        _set(5, "remapped_rows.failure", True),
        "row_remapping",
        "fail",
        "GPU 5: row remapping failed",
        "GPU needs replacement (RMA)",
    ),
    ("pcie-x8", _set(2, "pcie.width_current", 8), "pcie_link", "fail", "GPU 2: PCIe link x8 of x16", "lspci -vv"),
    (
        "pcie-gen4-slot",
        _set(2, "pcie.gen_max", 4),
        "pcie_link",
        "fail",
        "GPU 2: PCIe link can reach only gen 4 (GPU can do gen 5), below gen 5",
        "reseat",
    ),
    (
        "pcie-gen-busy",
        _all(
            _set(0, "pcie.gen_current", 3),
            _set(0, "utilization_gpu_pct", 97),
            _set(0, "clock_event_reasons", {"mask": 0, "names": []}),
        ),
        "pcie_link",
        "warn",
        "GPU 0: PCIe gen 3 of 5 while busy",
        "under load",
    ),
    ("nvlink-one-down", _link_down(6, 7), "nvlink", "fail", "GPU 6: 17 active NVLinks, expected 18", "nvlink -s -i 6"),
    (
        "nvlink-all-down",
        lambda r: [link.update(active=False) for link in gpu(r, 4)["nvlink"]],
        "nvlink",
        "fail",
        "GPU 4: no active NVLink",
        "reset the GPUs",
    ),
    (
        "nvlink-fabric",
        _set(7, "fabric", {"state": "in_progress", "status": "Success"}),
        "nvlink",
        "fail",
        "GPU 7: NVLink fabric in progress",
        "fabricmanager",
    ),
    ("mig-on", _set(1, "mig_mode_current", True), "mig_mode", "fail", "GPU 1: MIG enabled", "-mig 0"),
    ("seven-gpus", _drop_gpu(4), "gpu_count", "fail", "found 7 GPUs (NVIDIA H100 80GB HBM3), expected 8", "Xid 79"),
    ("mixed-model", _set(6, "name", "NVIDIA H100 PCIe"), "gpu_model", "fail", "mixed GPU models", "one GPU model"),
    (
        "small-memory",
        _set(0, "memory_total_mib", 40960),
        "gpu_memory",
        "fail",
        "GPU 0: 40960 MiB < 80000 MiB",
        "replace",
    ),
    (
        "old-driver",
        lambda r: r["nvml"].update(driver_version="470.82.01"),
        "driver_version",
        "fail",
        "driver 470.82.01 is older than the minimum 525.60.13",
        "nvidia_driver",
    ),
    (
        "vbios-mix",
        _set(7, "vbios_version", "96.00.74.00.0B"),
        "vbios",
        "warn",
        "VBIOS differs: 96.00.89.00.01 on GPUs 0-6; 96.00.74.00.0B on GPU 7",
        "firmware",
    ),
    (
        "persistence-off",
        _all(_set(0, "persistence_mode", False), _set(1, "persistence_mode", False)),
        "persistence_mode",
        "fail",
        "GPUs 0, 1: persistence mode off",
        "-i 0,1 -pm 1",
    ),
    (
        "prohibited",
        _set(3, "compute_mode", "Prohibited"),
        "compute_mode",
        "fail",
        "GPU 3: compute mode Prohibited",
        "-c DEFAULT",
    ),
    (
        "hw-slowdown",
        _set(5, "clock_event_reasons", {"mask": 0x8 | 0x40, "names": ["hw_slowdown", "hw_thermal_slowdown"]}),
        "clock_events",
        "fail",
        "GPU 5: HW slowdown",
        "cooling",
    ),
    (
        "sw-thermal",
        _set(5, "clock_event_reasons", {"mask": 0x20, "names": ["sw_thermal_slowdown"]}),
        "clock_events",
        "fail",
        "GPU 5: SW thermal slowdown",
        "cooling",
    ),
    (
        "power-cap-busy",
        _all(
            _set(2, "clock_event_reasons", {"mask": 0x4, "names": ["sw_power_cap"]}),
            _set(2, "utilization_gpu_pct", 100),
        ),
        "clock_events",
        "warn",
        "GPU 2: SW power cap while busy (100% utilization)",
        "power_limit",
    ),
    (
        "hot-gpu",
        _set(4, "temperature_c", 88),
        "temperature",
        "fail",
        "GPU 4: 88 C, at or above its slowdown threshold 87 C",
        "airflow",
    ),
    ("warm-gpu", _set(4, "temperature_c", 82), "temperature", "warn", "GPU 4: 82 C >= 80 C", "airflow"),
    ("warm-hbm", _set(4, "memory_temperature_c", 90), "temperature", "warn", "GPU 4: memory 90 C >= 85 C", "airflow"),
    (
        "power-capped",
        _set(6, "power_limit_w", 500.0),
        "power_limit",
        "fail",
        "GPU 6: enforced power limit 500 W is 71% of the default 700 W",
        "-pl",
    ),
]


@pytest.mark.parametrize("case_id, change, check, status, reason, remedy", CASES, ids=[c[0] for c in CASES])
def test_one_fault_is_caught_and_named(case_id, change, check, status, reason, remedy):
    readings = healthy()
    change(readings)
    results = run(readings)
    r = results[check]
    assert r["status"] == status, r
    assert reason in r["reason"], r["reason"]
    assert r["remedy"] and remedy in r["remedy"], r["remedy"]
    assert r["detail"], "the evidence belongs in detail"
    # Only the check that owns the fault moves (seven GPUs also changes nothing else: they are still healthy).
    others = {
        n: results[n]["status"] for n in GPU_CHECKS if n != check and results[n]["status"] not in ("pass", "skip")
    }
    assert others == {}, others


def test_per_gpu_evidence_is_in_detail():
    readings = healthy()
    gpu(readings, 3)["ecc_volatile_uncorrected"] = 2
    r = run(readings)["ecc"]
    assert r["value"] == 2 and r["unit"] == "errors"
    assert r["threshold"]["key"] == "ecc_volatile_uncorrected_max" and r["threshold"]["value"] == 0
    row = next(p for p in r["detail"]["per_gpu"] if p["index"] == 3)
    assert row["ecc_volatile_uncorrected"] == 2 and row["ecc_aggregate_corrected"] == 0
    assert len(r["detail"]["per_gpu"]) == 8


def test_idle_gpu_with_a_slow_link_passes_with_the_reason():
    readings = healthy()
    gpu(readings, 1)["pcie"]["gen_current"] = 1  # idle: pstate 0 but utilization 0 and the idle clock reason
    r = run(readings)["pcie_link"]
    assert r["status"] == "pass"
    assert "GPU 1: gen 1 of 5 while idle (idle GPUs lower their link speed to save power)" in r["reason"]


def test_exclusive_process_passes_with_a_note():
    readings = healthy()
    for g in readings["nvml"]["gpus"]:
        g["compute_mode"] = "Exclusive_Process"
    r = run(readings)["compute_mode"]
    assert r["status"] == "pass" and "GPUs 0-7: compute mode Exclusive_Process" in r["reason"]


def test_power_cap_on_an_idle_gpu_passes():
    readings = healthy()
    gpu(readings, 2)["clock_event_reasons"] = {"mask": 0x1 | 0x4, "names": ["gpu_idle", "sw_power_cap"]}
    r = run(readings)["clock_events"]
    assert r["status"] == "pass" and "SW power cap while idle" in r["reason"]


def test_nvlink_crc_counts_do_not_warn_and_stay_in_detail():
    """Cumulative counts say nothing about a link today: their growth is judged as rates (checks.counter_rates)."""
    readings = healthy()
    gpu(readings, 2)["nvlink"][3]["errors"].update(crc_flit=12, replay=3)
    gpu(readings, 2)["nvlink"][4]["errors"].update(crc_data=204)
    r = run(readings)["nvlink"]
    assert r["status"] == "pass" and r["remedy"] is None
    assert "CRC up to 216, GPU 2" in r["reason"] and "judged as rates by checks.counter_rates" in r["reason"]
    row = next(p for p in r["detail"]["per_gpu"] if p["index"] == 2)
    assert row["crc_errors"] == 216 and row["crc_source"] == "per-link counters"
    assert row["errors"] == {"crc_flit": 12, "crc_data": 204, "replay": 3, "recovery": 0}
    assert r["detail"]["error_counts_judged_by"] == "checks.counter_rates"
    assert "crc_errors_max" not in r["threshold"]


def test_crc_counts_fall_back_to_the_all_links_totals():
    """Where per-link counters are unsupported (Hopper on some drivers), the *_TOTAL fields count."""
    readings = healthy()
    for g in readings["nvml"]["gpus"]:
        for link in g["nvlink"]:
            link["errors"] = dict.fromkeys(NVLINK_COUNTERS)
        g["unreadable"]["nvlink.errors.crc_flit"] = "Not Supported"
    gpu(readings, 5)["nvlink_error_totals"]["crc_data"] = 4
    r = run(readings)["nvlink"]
    assert r["status"] == "pass"
    row = next(p for p in r["detail"]["per_gpu"] if p["index"] == 5)
    assert row["crc_source"] == "all-links totals" and row["crc_errors"] == 4 and row["errors"]["crc_data"] == 4
    for g in readings["nvml"]["gpus"]:  # nothing readable: None, not a made-up zero
        g["nvlink_error_totals"] = dict.fromkeys(NVLINK_COUNTERS)
    r = run(readings)["nvlink"]
    assert r["status"] == "pass" and "no CRC counter readable" in r["reason"]
    assert r["detail"]["per_gpu"][0]["errors"] == dict.fromkeys(NVLINK_COUNTERS)


def test_seven_gpus_compare_links_between_gpus():
    readings = healthy()
    readings["nvml"]["gpus"].pop(4)
    r = run(readings)["nvlink"]
    assert r["status"] == "pass" and "7 of 8 GPUs present" in r["reason"]
    gpu(readings, 0)["nvlink"][0]["active"] = False
    r = run(readings)["nvlink"]
    assert r["status"] == "fail" and "GPU 0: 17 active NVLinks, the other GPUs have 18" in r["reason"]


def test_single_gpu_skips_nvlink():
    readings = healthy()
    del readings["nvml"]["gpus"][1:]
    r = run(readings, overrides={"gpus_expected": 1})["nvlink"]
    assert r["status"] == "skip" and r["reason"] == "single GPU: NVLink has no peer here"


def test_xid_79_from_a_real_kernel_log_line_fails(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(
        "6,1021,4071331,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01\n"
        "4,1874,912345678,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "4,1875,912345679,-;NVRM: Xid (PCI:0000:2a:00): 109, pid=881, name=python, Ch 00000008\n"
    )
    readings = healthy()
    readings["kernel_log"] = kernel_log.read(str(tmp_path))
    r = run(readings)["xid"]
    assert r["status"] == "fail"
    assert "GPU 0: Xid 79 at 0000:18:00" in r["reason"]  # the fail code leads
    assert "GPU 1: Xid 109 at 0000:2a:00" in r["reason"]  # not a hardware code: warn, still reported
    # The GPU behind the failure, by identity: a GPU moved to another node is still recognised.
    assert r["detail"]["flagged_gpus"] == [
        {"index": 0, "uuid": gpu(readings, 0)["uuid"], "serial": gpu(readings, 0)["serial"]}
    ]
    assert "xid-errors" in r["remedy"]
    assert r["value"] == 2 and r["detail"]["events"][0]["message"].endswith("GPU has fallen off the bus.")


def test_xid_on_a_gpu_nvml_no_longer_sees_is_still_reported():
    readings = healthy()
    readings["nvml"]["gpus"].pop(0)
    readings["kernel_log"]["xid_events"] = [
        kernel_log.parse_xid("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.")
    ]
    r = run(readings)["xid"]
    assert r["status"] == "fail" and "PCI 0000:18:00 (not among the GPUs NVML sees): Xid 79" in r["reason"]


def test_unreadable_kernel_log_is_an_error_not_a_pass():
    readings = healthy()
    readings["kernel_log"] = {
        "source": "none",
        "readable": False,
        "error": "kernel log unreadable: /dev/kmsg: Operation not permitted",
        "lines": 0,
        "xid_events": [],
    }
    r = run(readings)["xid"]
    assert r["status"] == "error" and "Operation not permitted" in r["reason"] and "root" in r["remedy"]


def test_unreadable_field_is_an_error_with_the_nvml_text():
    readings = healthy()
    g = gpu(readings, 6)
    g["ecc_volatile_uncorrected"] = None
    g["unreadable"]["ecc_volatile_uncorrected"] = "GPU is lost"
    r = run(readings)["ecc"]
    assert r["status"] == "error" and r["reason"] == "GPU 6: ecc_volatile_uncorrected unreadable (GPU is lost)"


def test_mig_not_supported_counts_as_off():
    readings = healthy()
    for g in readings["nvml"]["gpus"]:
        g["mig_mode_current"] = None
        g["unreadable"]["mig_mode_current"] = "Not Supported"
    r = run(readings)["mig_mode"]
    assert r["status"] == "pass" and "MIG not supported, so off" in r["reason"]


def test_driver_versions_compare_numerically():
    # As strings "535.183.01" < "535.9.0"; as versions it is newer.
    assert run(healthy(), overrides={"driver_version_min": "535.9.0"})["driver_version"]["status"] == "pass"
    assert run(healthy(), overrides={"driver_version_min": "535.183.2"})["driver_version"]["status"] == "fail"
    pinned = run(healthy(), overrides={"driver_version": "550.54.15"})["driver_version"]
    assert pinned["status"] == "fail" and "differs from the pinned 550.54.15" in pinned["reason"]
    assert run(healthy(), overrides={"driver_version": "535.183.01"})["driver_version"]["status"] == "pass"


def test_unset_expectations_warn_and_say_so():
    readings = healthy()
    for g in readings["nvml"]["gpus"]:
        g["name"] = "NVIDIA Z900 Prototype"  # no profile matches: the generic one has no model figures
    results = run(readings)
    assert results["gpu_count"]["status"] == "warn"
    assert results["gpu_count"]["reason"] == "expected count not set, found 8 GPUs (NVIDIA Z900 Prototype)"
    assert results["gpu_memory"]["status"] == "warn" and "no minimum set" in results["gpu_memory"]["reason"]
    assert results["profile"]["status"] == "warn"


def test_nvml_unavailable_every_gpu_check_errors():
    readings = healthy()
    readings["nvml"] = {"available": False, "error": "NVML init failed: Driver Not Loaded", "gpus": []}
    results = run(readings)
    for name in GPU_CHECKS:
        assert results[name]["status"] == "error"
        assert results[name]["reason"] == "NVML init failed: Driver Not Loaded"
        assert (
            results[name]["remedy"]
            == "install the NVIDIA driver (bringup.yml, role nvidia_driver) or run on a GPU node"
        )


# --- the CLI and recordings ---------------------------------------------------------------------------


def test_check_cli_on_a_recording_prints_the_host_document(tmp_path):
    readings = healthy()
    gpu(readings, 2)["pcie"]["width_current"] = 8
    path = tmp_path / "node7.json"
    path.write_text(json.dumps(readings))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "gpufleet", "check", "--readings", str(path), "--json", "--host", "node7"]
    proc = subprocess.run(
        cmd + ["--group", "gpu_inventory", "--group", "gpu_health"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # a check failed: the node would not be accepted
    doc = json.loads(proc.stdout)
    assert doc["host"] == "node7" and doc["profile"]["name"] == "h100-sxm"
    assert doc["versions"]["driver"] == "535.183.01" and doc["versions"]["cuda_driver"] == "12.2"
    statuses = {r["check"]: r["status"] for r in doc["results"]}
    assert list(statuses) == GPU_CHECKS
    assert statuses["pcie_link"] == "fail"
    assert {s for n, s in statuses.items() if n != "pcie_link"} <= {"pass", "skip"}
    assert all(r["group"] in GROUPS and r["seconds"] >= 0 for r in doc["results"])
    zero = subprocess.run(
        cmd + ["--group", "gpu_health", "--exit-zero"], capture_output=True, text=True, env=env, timeout=120
    )
    assert zero.returncode == 0 and "fail" in zero.stdout, zero.stderr
    healthy_only = subprocess.run(
        cmd + ["--group", "gpu_inventory"], capture_output=True, text=True, env=env, timeout=120
    )
    assert healthy_only.returncode == 0 and json.loads(healthy_only.stdout)["results"], healthy_only.stderr


RECORDINGS = sorted(DATA.glob("recorded-*.json"))
# GPU fields the reader gained after these readings were recorded: absent from them, judged as unreadable.
LATER_FIELDS = {
    "pcie_replay",
    "processes",
    "inforom_image_version",
    "c2c",
    "memory_numa_node",
}  # read since these were recorded


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_recorded_readings_replay_through_every_check(path):
    """Readings recorded on real GPU nodes: every check of every group runs, and inventory matches the recording."""
    readings = json.loads(path.read_text())
    assert set(readings) >= {"nvml", "host", "kernel_log"}
    doc = host_documents.check_host(readings, host=path.stem)
    crashed = [r for r in doc["results"] if "check crashed" in r["reason"]]
    assert crashed == []
    by_name = {r["check"]: r for r in doc["results"]}
    assert set(GPU_CHECKS) <= set(by_name)
    nv = readings["nvml"]
    if not nv["available"]:
        assert all(by_name[n]["status"] == "error" for n in GPU_CHECKS)
        return
    for g in nv["gpus"]:
        assert set(g) <= set(nvml.GPU_FIELDS) and set(nvml.GPU_FIELDS) - set(g) <= LATER_FIELDS
    inv = by_name["gpu_count"]["detail"]["inventory"]
    assert inv["driver_version"] == nv["driver_version"]
    assert [(g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_total_mib"]) for g in inv["gpus"]] == [
        (g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_total_mib"]) for g in nv["gpus"]
    ]
    assert by_name["gpu_count"]["value"] == len(nv["gpus"])


# --- processes on the GPUs, the GPUs visible to this node, flagged GPUs ----------------------------------


def _proc(pid, name="python", mib=20480, kinds=("compute",)):
    return {"pid": pid, "name": name, "used_memory_mib": mib, "kinds": list(kinds)}


def test_a_process_on_a_gpu_fails_and_names_gpu_pid_name_and_memory():
    readings = healthy()
    gpu(readings, 3)["processes"] = [_proc(4242, "gpu_disturb", 1536)]
    gpu(readings, 6)["processes"] = [_proc(77, None, None, ("compute", "graphics"))]
    results = run(readings)
    r = results["processes"]
    assert r["status"] == "fail" and r["value"] == 2 and r["unit"] == "processes"
    assert "GPU 3: pid 4242 (gpu_disturb, 1536 MiB)" in r["reason"]
    assert "GPU 6: pid 77 (name unknown: not in this host's /proc, memory not reported)" in r["reason"]
    assert "drain the node" in r["remedy"] and "not the node's" in r["remedy"] and "nvidia-smi -i 3" in r["remedy"]
    assert [(p["index"], p["uuid"], p["pid"]) for p in r["detail"]["processes"]] == [
        (3, gpu(readings, 3)["uuid"], 4242),
        (6, gpu(readings, 6)["uuid"], 77),
    ]
    assert r["detail"]["flagged_gpus"] == [
        {"index": i, "uuid": gpu(readings, i)["uuid"], "serial": gpu(readings, i)["serial"]} for i in (3, 6)
    ]
    others = {
        n: results[n]["status"] for n in GPU_CHECKS if n != "processes" and results[n]["status"] not in ("pass", "skip")
    }
    assert others == {}


def test_processes_unreadable_is_an_error_and_old_recordings_say_so():
    readings = healthy()
    g = gpu(readings, 1)
    g["processes"] = None
    g["unreadable"]["processes"] = "Not Supported"
    r = run(readings)["processes"]
    assert r["status"] == "error" and r["reason"] == "GPU 1: GPU processes unreadable (Not Supported)"
    for g in readings["nvml"]["gpus"]:  # recorded before the reader listed processes
        del g["processes"]
    r = run(readings)["processes"]
    assert r["status"] == "error" and "not in the readings" in r["reason"]


@pytest.mark.parametrize(
    "cvd, indices, resolved",
    [
        (None, list(range(8)), True),
        ("2,3", [2, 3], True),
        ("3,1", [3, 1], True),  # CUDA's order
        ("0,9,1", [0], True),  # an index past the GPUs ends the list, as CUDA reads it
        ("1,-1,2", [1], True),
        ("1,1", [], True),  # a repeated entry leaves none
        ("", [], True),
        ("GPU-{u5},GPU-{u2}", [5, 2], True),
        ("GPU-{u5p}", [5], True),  # a unique prefix
        ("GPU-ffffffff", list(range(8)), False),  # names no GPU: every GPU counts
        ("MIG-1234", list(range(8)), False),
        ("gpu0", list(range(8)), False),
    ],
)
def test_visible_gpus_resolve_like_cuda(cvd, indices, resolved):
    gpus = healthy()["nvml"]["gpus"]
    uuids = {i: g["uuid"].removeprefix("GPU-") for i, g in enumerate(gpus)}
    if cvd:
        cvd = cvd.format(u5=uuids[5], u2=uuids[2], u5p=uuids[5][:12])
    vis = visible_indices(gpus, cvd)
    assert vis["indices"] == indices and vis["resolved"] is resolved
    assert vis["all"] is (set(indices) == set(range(8)))
    assert (vis["note"] is None) is (vis["all"] and resolved)


def test_processes_judges_only_the_gpus_this_node_may_use():
    readings = healthy()
    gpu(readings, 5)["processes"] = [_proc(901, "other-node-bench")]
    readings["nvml"]["cuda_visible_devices"] = "0,1,2,3"  # one machine split into two nodes
    r = run(readings)["processes"]
    assert r["status"] == "pass" and r["value"] == 0
    assert r["reason"] == (
        "no process on the 4 GPUs of this node (GPUs 0-3); "
        "CUDA_VISIBLE_DEVICES='0,1,2,3' leaves 4 of 8 GPUs to this node"
    )
    assert r["detail"]["visibility"]["indices"] == [0, 1, 2, 3]
    readings["nvml"]["cuda_visible_devices"] = gpu(readings, 5)["uuid"]
    r = run(readings)["processes"]
    assert r["status"] == "fail" and "GPU 5: pid 901" in r["reason"]
    readings["nvml"]["cuda_visible_devices"] = "GPU-deadbeef"
    r = run(readings)["processes"]
    assert (
        r["status"] == "fail"
        and "entry 'GPU-deadbeef' matches no GPU UUID NVML sees, so every GPU is judged" in r["reason"]
    )
    readings["nvml"]["cuda_visible_devices"] = ""
    r = run(readings)["processes"]
    assert r["status"] == "skip" and "leaves no GPU to this node" in r["reason"]


def test_flagged_gpus_name_the_gpus_behind_the_worst_status_only():
    readings = healthy()
    gpu(readings, 3)["ecc_volatile_uncorrected"] = 2  # fail
    gpu(readings, 5)["ecc_aggregate_uncorrected"] = 1  # warn: not what makes this result fail
    gpu(readings, 4)["serial"] = None
    gpu(readings, 4)["temperature_c"] = 82
    results = run(readings)
    assert results["ecc"]["status"] == "fail"
    assert results["ecc"]["detail"]["flagged_gpus"] == [
        {"index": 3, "uuid": gpu(readings, 3)["uuid"], "serial": gpu(readings, 3)["serial"]}
    ]
    assert results["temperature"]["detail"]["flagged_gpus"] == [
        {"index": 4, "uuid": gpu(readings, 4)["uuid"], "serial": None}
    ]
    for name in GPU_CHECKS:
        if results[name]["status"] in ("pass", "skip"):
            assert "flagged_gpus" not in results[name]["detail"], name
    # A node-wide finding flags no GPU.
    old = run(readings | {"nvml": readings["nvml"] | {"driver_version": "470.82.01"}})["driver_version"]
    assert old["status"] == "fail" and "flagged_gpus" not in old["detail"]


def test_a_benchmark_finding_gets_the_serial_and_index_of_the_gpu_it_names_by_uuid():
    """Benchmarks know a CUDA device by UUID (and PCI id); the host document names the board by serial too."""
    from gpufleet.base import schema
    from gpufleet.checks import benchmarks

    readings = healthy()
    target = gpu(readings, 6)
    res = benchmarks.flag_gpus(
        schema.result("hbm_bandwidth", schema.FAIL, "slow"),
        [{"index": None, "uuid": target["uuid"].upper(), "serial": None}],
    )
    gpu_inventory.name_flagged(res, readings["nvml"]["gpus"])
    assert res["detail"]["flagged_gpus"] == [{"index": 6, "uuid": target["uuid"].upper(), "serial": target["serial"]}]


def test_every_gpu_finding_carries_its_flagged_gpus():
    """Each fault case that names GPUs in its reason flags exactly those GPUs."""
    import re

    for case_id, change, check, status, reason, _ in CASES:
        readings = healthy()
        change(readings)
        r = run(readings)[check]
        named = re.match(r"GPUs? ([\d, -]+):", r["reason"])
        flagged = [e["index"] for e in r["detail"].get("flagged_gpus", [])]
        if not named:
            assert flagged == [], case_id
            continue
        want = []
        for part in named.group(1).split(","):
            lo, _, hi = part.strip().partition("-")
            want += list(range(int(lo), int(hi or lo) + 1))
        assert flagged == want, case_id
        assert all(e["uuid"] and e["uuid"].startswith("GPU-") for e in r["detail"]["flagged_gpus"]), case_id
