"""Counter snapshots (`gpufleet counters`, gpufleet.cluster.gpu_counters) on recorded readings and on this host."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from module_runner import REPO, documented_options, run_module  # noqa: E402  (also puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import check_module  # noqa: E402
from ansible_collections.gpufleet.cluster.plugins.modules import gpu_counters  # noqa: E402

from gpufleet.base import schema  # noqa: E402
from gpufleet.collect import counters, kernel_log, nvml  # noqa: E402
from gpufleet.collect.nvml.nvlinks import NVLINK_COUNTERS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "readings"
H200 = DATA / "recorded-h200-x2-vm.json"
HEALTHY = DATA / "h100-sxm-8gpu-healthy.json"
SRC = REPO / "src"
RESULT_KEYS = set(schema.result("x", schema.PASS, "r")) | {"group", "started", "seconds"}
DETAIL_KEYS = {"phase", "read_at", "boot_id", "gpus", "unreadable"}


def readings(path: Path = H200) -> dict:
    return json.loads(path.read_text())


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))


def test_recorded_h200_counters_as_the_readings_hold_them():
    r = readings()
    res = counters.snapshot("before", r, boot_id="b-1")
    assert res["check"] == "snapshot_before" and res["status"] == "pass" and res["value"] == 2 and res["unit"] == "GPUs"
    d = res["detail"]
    assert DETAIL_KEYS <= set(d) and d["phase"] == "before" and d["boot_id"] == "b-1"
    assert d["read_at"].endswith("Z")
    for g, entry in zip(r["nvml"]["gpus"], d["gpus"]):
        assert (entry["index"], entry["uuid"], entry["serial"], entry["pci_bus_id"]) == (
            g["index"],
            g["uuid"],
            g["serial"],
            g["pci_bus_id"],
        )
        assert entry["visible"] is True
        c = entry["counters"]
        assert list(c) == list(counters.COUNTERS)
        assert c["ecc_corrected_volatile"] == g["ecc_volatile_corrected"]
        assert c["ecc_uncorrected_aggregate"] == g["ecc_aggregate_uncorrected"]
        assert c["row_remap_correctable"] == g["remapped_rows"]["correctable"] and c["row_remap_pending"] == 0
        # The H200 reads per-link counters (its all-links totals are Not Supported): the sum over the links.
        assert c["nvlink_crc_data"] == sum(link["errors"]["crc_data"] for link in g["nvlink"]) > 0
        assert c["xid"] == 0
    # Recorded before the reader had pcie_replay: null, and named with why.
    assert d["unreadable"] == {"0.pcie_replay": "not in the readings", "1.pcie_replay": "not in the readings"}
    assert "2 unreadable, named in detail.unreadable" in res["reason"]


def test_xid_events_count_per_gpu_and_an_unreadable_log_is_named(tmp_path):
    r = readings(HEALTHY)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(
        "4,1,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "4,2,2,-;NVRM: Xid (PCI:0000:18:00): 94, pid=1, Contained ECC error\n"
        "4,3,3,-;NVRM: Xid (PCI:0000:5d:00): 13, pid=881, Graphics Exception\n"
    )
    r["kernel_log"] = kernel_log.read(str(tmp_path))
    d = counters.snapshot("after", r)["detail"]
    xids = {g["index"]: g["counters"]["xid"] for g in d["gpus"]}
    assert xids == {0: 2, 1: 0, 2: 0, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0}
    assert d["unreadable"] == {} and d["xid_source"] == str(tmp_path / "dev" / "kmsg")
    r["kernel_log"] = {
        "source": "none",
        "readable": False,
        "error": "kernel log unreadable: /dev/kmsg: Operation not permitted",
        "lines": 0,
        "xid_events": [],
    }
    res = counters.snapshot("after", r)
    assert res["status"] == "pass"
    assert all(g["counters"]["xid"] is None for g in res["detail"]["gpus"])
    assert res["detail"]["unreadable"]["3.xid"] == "kernel log unreadable: /dev/kmsg: Operation not permitted"


def test_unreadable_counters_are_null_with_the_nvml_reason():
    r = readings(HEALTHY)
    g = r["nvml"]["gpus"][4]
    g["ecc_volatile_corrected"] = None
    g["unreadable"]["ecc_volatile_corrected"] = "GPU is lost"
    g["remapped_rows"] = None
    g["unreadable"]["remapped_rows"] = "Not Supported"
    for link in g["nvlink"]:
        link["errors"] = dict.fromkeys(NVLINK_COUNTERS)
    g["nvlink_error_totals"] = dict.fromkeys(NVLINK_COUNTERS)
    g["unreadable"]["nvlink.errors.crc_data"] = "Not Supported"
    d = counters.snapshot("before", r)["detail"]
    c = d["gpus"][4]["counters"]
    assert c["ecc_corrected_volatile"] is None and c["row_remap_failure"] is None and c["nvlink_crc_data"] is None
    assert d["unreadable"]["4.ecc_corrected_volatile"] == "GPU is lost"
    assert d["unreadable"]["4.row_remap_pending"] == "Not Supported"
    assert d["unreadable"]["4.nvlink_crc_data"] == "Not Supported"
    assert d["unreadable"]["4.nvlink_replay"] == "not in the readings"
    assert not any(k.startswith(("3.", "5.")) for k in d["unreadable"])
    assert d["gpus"][3]["counters"]["nvlink_crc_data"] == 0  # a GPU that reads them: zero is a reading


def test_every_gpu_is_listed_with_whether_this_node_may_use_it():
    r = readings(HEALTHY)
    r["nvml"]["cuda_visible_devices"] = "4,5,6,7"
    d = counters.snapshot("before", r)["detail"]
    assert [g["index"] for g in d["gpus"]] == list(range(8))
    assert [g["visible"] for g in d["gpus"]] == [False] * 4 + [True] * 4
    r["nvml"]["cuda_visible_devices"] = "GPU-nope"
    res = counters.snapshot("before", r)
    assert all(g["visible"] for g in res["detail"]["gpus"])
    assert "entry 'GPU-nope' matches no GPU UUID NVML sees" in res["reason"]


@pytest.mark.parametrize(
    "nv, status, reason",
    [
        (
            {"available": False, "error": nvml.NO_DRIVER, "gpus": []},
            "skip",
            "no NVIDIA driver: libnvidia-ml.so not found, so there are no GPU counters to read",
        ),
        (
            {"available": False, "error": "NVML init failed: Driver Not Loaded", "gpus": []},
            "error",
            "GPU counters not read: NVML init failed: Driver Not Loaded",
        ),
        (
            {"available": True, "error": "NVML could not count the GPUs: Unknown Error", "gpus": []},
            "error",
            "GPU counters not read: NVML could not count the GPUs: Unknown Error",
        ),
    ],
)
def test_no_driver_skips_and_a_broken_one_errs(nv, status, reason):
    res = counters.snapshot("after", {"nvml": nv, "kernel_log": {}})
    assert (res["check"], res["status"], res["reason"]) == ("snapshot_after", status, reason)
    assert DETAIL_KEYS <= set(res["detail"]) and res["detail"]["gpus"] == []
    assert (res["remedy"] is None) == (status == "skip")


def test_cli_replays_a_recording_into_a_host_document(tmp_path):
    r = readings()
    r["host"]["boot_id"] = "4e1c0b9a-0000-4000-8000-000000000001"
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(r))
    cmd = [
        sys.executable,
        "-m",
        "gpufleet",
        "counters",
        "--phase",
        "after",
        "--readings",
        str(path),
        "--json",
        "--host",
        "node3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    # The recording holds no process lists: processes_after errs, and a result that errs exits 1.
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert (
        doc["host"] == "node3"
        and doc["profile"]["name"] == "h200-sxm"
        and doc["versions"]["driver"] == r["nvml"]["driver_version"]
    )
    res, fabric, after = doc["results"]
    # A recording from before the fabric readings: no InfiniBand there, and no AER section.
    assert (fabric["check"], fabric["group"], fabric["status"]) == ("fabric_after", "counters", "skip")
    assert "no InfiniBand" in fabric["reason"] and "no 'aer' section" in fabric["reason"]
    assert set(res) == RESULT_KEYS and (res["check"], res["group"], res["status"]) == (
        "snapshot_after",
        "counters",
        "pass",
    )
    assert (after["check"], after["group"], after["status"]) == ("processes_after", "counters", "error")
    assert "GPU processes unreadable" in after["reason"]
    zero = subprocess.run(cmd + ["--exit-zero"], capture_output=True, text=True, env=_env(), timeout=120)
    assert zero.returncode == 0 and json.loads(zero.stdout)["results"][2]["status"] == "error", zero.stderr
    assert res["detail"]["boot_id"] == "4e1c0b9a-0000-4000-8000-000000000001"
    assert res["detail"]["gpus"][1]["counters"]["nvlink_crc_data"] > 0
    bad = subprocess.run(cmd[:5] + ["during"], capture_output=True, text=True, env=_env(), timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'during'" in bad.stderr


def test_cli_on_this_host():
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "counters", "--phase", "before", "--json"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    res, fabric = json.loads(proc.stdout)["results"]
    assert res["group"] == "counters" and res["check"] == "snapshot_before"
    assert fabric["check"] == "fabric_before" and fabric["detail"]["boot_id"] == res["detail"]["boot_id"]
    if not Path("/sys/class/infiniband").exists():  # this machine: no InfiniBand, so never a pass for it
        assert fabric["detail"]["infiniband"] and fabric["status"] in ("skip", "pass")
        assert fabric["status"] == "pass" or "no InfiniBand" in fabric["reason"]
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert res["detail"]["boot_id"] == boot_id
    if not nvml.read()["available"]:  # this machine: no NVIDIA driver
        assert res["status"] == "skip" and "no GPU counters to read" in res["reason"]
    else:
        assert res["status"] in ("pass", "error")


def test_the_soak_samplers_live_read_gives_the_snapshots_counters():
    """collect.counters.read_live, what the soak's sampler reads between its windows, gives each GPU the counters
    the snapshot gives it from a whole NVML reading, less the kernel log's xid. Read a moment later, a counter may
    have grown, never fallen: on a 2 x H200 machine nvlink_crc_data went from 2875 to 2879 between the two reads."""
    nv = nvml.read()
    if not nv["available"]:
        pytest.skip(f"no GPU to read live: {nv['error']}")
    import pynvml

    snap = counters.snapshot("before", {"nvml": nv, "kernel_log": {}})
    assert snap["status"] == "pass", snap["reason"]
    pynvml.nvmlInit()
    try:
        for g in snap["detail"]["gpus"]:
            live = counters.read_live(pynvml, pynvml.nvmlDeviceGetHandleByIndex(g["index"]))
            assert list(live) == [c for c in counters.COUNTERS if c != "xid"] + ["nvlink_links"]
            links = live.pop("nvlink_links")  # each link's counts, as the snapshot keeps them
            assert (links is None) == (g["nvlink_links"] is None) and set(links or {}) == set(g["nvlink_links"] or {})
            for link, counts in (links or {}).items():
                assert all(v >= g["nvlink_links"][link][c] for c, v in counts.items()), (g["index"], link)
            snapped = {c: v for c, v in g["counters"].items() if c != "xid"}
            assert set(live) == set(snapped), g["index"]
            for name, value in live.items():
                assert (value is None) == (snapped[name] is None), (g["index"], name)
                assert value is None or value >= snapped[name], (g["index"], name, snapped[name], value)
    finally:
        pynvml.nvmlShutdown()


# --- the module ----------------------------------------------------------------------------------------


def test_module_returns_the_snapshot_document(capsys):
    out = run_module(gpu_counters, {"python": sys.executable, "phase": "before", "host_name": "node7"}, capsys)
    assert out["_exit_code"] == 0 and out["changed"] is False and "failed" not in out, out
    doc = out["gpufleet"]
    assert doc["host"] == "node7"
    res, fabric = doc["results"]
    assert fabric["check"] == "fabric_before"
    assert (res["check"], res["group"]) == ("snapshot_before", "counters") and res["status"] in schema.STATUSES


def test_module_runs_in_check_mode_and_passes_thresholds_and_profile(capsys):
    args = {
        "python": sys.executable,
        "phase": "after",
        "profile": "h200-sxm",
        "thresholds": {"gpus_expected": 2},
        "_ansible_check_mode": True,
    }
    out = run_module(gpu_counters, args, capsys)
    assert out["_exit_code"] == 0, out
    doc = out["gpufleet"]
    assert doc["results"][0]["check"] == "snapshot_after"
    assert doc["profile"]["name"] == "h200-sxm"
    assert doc["profile"]["thresholds"]["gpus_expected"] == {
        "value": 2,
        "source": "inventory override (gpufleet_thresholds)",
    }


@pytest.mark.parametrize(
    "args, message",
    [
        ({"phase": "during"}, "value of phase must be one of: before, after, got: during"),
        ({}, "missing required arguments: phase"),
        ({"phase": "before", "thresholds": {"nope": 1}}, "gpufleet_thresholds.nope is not a known threshold"),
        ({"phase": "before", "python": "/x/bin/python"}, "gpufleet_python '/x/bin/python' does not exist on n9"),
    ],
)
def test_module_refuses_bad_input_with_a_message(args, message, capsys):
    out = run_module(gpu_counters, {"python": sys.executable, "host_name": "n9", **args}, capsys)
    assert out["failed"] is True and out["_exit_code"] == 1
    assert message in out["msg"]


def test_module_engine_crash_fails_with_the_stderr_tail(fake_engine, capsys):
    fake_engine("raise RuntimeError('nvml exploded')\n")
    out = run_module(gpu_counters, {"python": sys.executable, "phase": "before", "host_name": "n5"}, capsys)
    assert out["failed"] is True and "exited 1 on n5" in out["msg"] and "RuntimeError: nvml exploded" in out["msg"]


def test_module_documents_its_arguments_and_is_in_the_checks_group():
    doc = yaml.safe_load(gpu_counters.DOCUMENTATION)
    assert {"gpufleet.cluster.engine_check", "gpufleet.cluster.node_env"} <= set(doc["extends_documentation_fragment"])
    assert set(documented_options(gpu_counters)) == set(check_module.counters_argument_spec())
    assert doc["options"]["phase"]["choices"] == list(check_module.COUNTER_PHASES) == list(counters.PHASES)
    assert set(check_module.check_argument_spec()) < set(check_module.counters_argument_spec())
    assert yaml.safe_load(gpu_counters.RETURN)["gpufleet"]["type"] == "dict"
    yaml.safe_load(gpu_counters.EXAMPLES)
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert "gpu_counters" in runtime["action_groups"]["checks"]
    sample = yaml.safe_load(gpu_counters.RETURN)["gpufleet"]["contains"]["results"]["sample"][0]
    assert list(sample["detail"]["gpus"][0]["counters"]) == list(counters.COUNTERS)


def test_snapshots_of_two_phases_subtract():
    """What the fleet layer does with them: the same GPUs, by uuid, in both; the growth per counter."""
    before_r = readings()
    after_r = copy.deepcopy(before_r)
    after_r["nvml"]["gpus"][1]["nvlink"][0]["errors"]["crc_data"] += 40
    before = counters.snapshot("before", before_r, boot_id="b")["detail"]
    after = counters.snapshot("after", after_r, boot_id="b")["detail"]
    grown = {
        a["uuid"]: {
            k: a["counters"][k] - b["counters"][k]
            for k in counters.COUNTERS
            if a["counters"][k] is not None and b["counters"][k] is not None and a["counters"][k] != b["counters"][k]
        }
        for a, b in zip(after["gpus"], before["gpus"])
    }
    assert grown == {
        before_r["nvml"]["gpus"][0]["uuid"]: {},
        before_r["nvml"]["gpus"][1]["uuid"]: {"nvlink_crc_data": 40},
    }
