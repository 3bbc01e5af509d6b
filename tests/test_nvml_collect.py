"""The NVML and kernel-log readers: real reads on this host, real files under tmp_path."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpufleet import collect
from gpufleet.node import host_documents
from gpufleet.checks import GROUPS, gpu_inventory
from gpufleet.collect import kernel_log, nvml
from gpufleet.collect.nvml.binding import bus_id, call_first, cuda_version, read_field
from gpufleet.collect.nvml.clocks import CLOCK_EVENT_BITS
from gpufleet.collect.nvml.nvlinks import NVLINK_COUNTERS
from gpufleet.collect.nvml.processes import process_name

SRC = Path(__file__).resolve().parents[1] / "src"
GPU_CHECKS = [name for name, _ in GROUPS["gpu_inventory"] + GROUPS["gpu_health"]]


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def _env() -> dict:
    """Run the CLI from this checkout whether or not the package is installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))


def assert_gpu_schema(gpu: dict) -> None:
    """A GPU entry as collect.nvml documents it: every key, JSON types, a reason for every None."""
    assert tuple(gpu) == nvml.GPU_FIELDS or set(gpu) == set(nvml.GPU_FIELDS), set(gpu) ^ set(nvml.GPU_FIELDS)
    assert isinstance(gpu["index"], int)
    assert isinstance(gpu["unreadable"], dict)
    assert all(isinstance(v, str) and v for v in gpu["unreadable"].values())
    for key in nvml.GPU_FIELDS:
        if gpu[key] is None and "handle" not in gpu["unreadable"]:
            assert key in gpu["unreadable"], f"GPU {gpu['index']}: {key} is None with no reason"
    if gpu["pci_bus_id"] is not None:
        assert gpu["pci_bus_id"] == gpu["pci_bus_id"].lower() and len(gpu["pci_bus_id"].split(":")[0]) == 4
    for key in ("persistence_mode", "ecc_mode_current", "mig_mode_current"):
        assert gpu[key] is None or isinstance(gpu[key], bool), key
    if gpu["clock_event_reasons"] is not None:
        mask = gpu["clock_event_reasons"]["mask"]
        assert gpu["clock_event_reasons"]["names"] == [n for n, b in CLOCK_EVENT_BITS.items() if mask & b]
    if gpu["pcie"] is not None:
        assert set(gpu["pcie"]) == {"gen_current", "gen_max", "gen_gpu_max", "width_current", "width_max"}
    for link in gpu["nvlink"] or []:
        assert set(link) == {"link", "active", "remote_pci_bus_id", "errors"}
    assert set(gpu["c2c"]) == {"enabled", "link_count", "links", "reason"}
    assert gpu["c2c"]["enabled"] in (True, False, None) and (gpu["c2c"]["enabled"] is not None or gpu["c2c"]["reason"])
    for link in gpu["c2c"]["links"]:
        assert {"link", "up", "max_gbps"} <= set(link)
        assert set(link["errors"]) == set(NVLINK_COUNTERS)
    assert gpu["pcie_replay"] is None or isinstance(gpu["pcie_replay"], int)
    pids = [p["pid"] for p in gpu["processes"] or []]
    assert pids == sorted(set(pids))  # one entry per pid
    for proc in gpu["processes"] or []:
        assert set(proc) == {"pid", "name", "used_memory_mib", "kinds"} and set(proc["kinds"]) <= {
            "compute",
            "graphics",
        }
    json.dumps(gpu)  # plain JSON, so it records and replays


# --- nvml ---------------------------------------------------------------------------------------------


def test_read_on_this_host():
    """The real reader on whatever this host is: the one-line error without a driver, the schema with one."""
    nv = nvml.read()
    json.dumps(nv)
    if not _driver_loadable():
        assert nv == {"available": False, "error": "no NVIDIA driver: libnvidia-ml.so not found", "gpus": []}
        return
    assert nv["available"], nv["error"]
    assert nv["driver_version"] and nv["cuda_driver_version"].count(".") == 1
    assert nv["gpus"], "a driver but no GPU"
    for gpu in nv["gpus"]:
        assert_gpu_schema(gpu)
        assert gpu["name"] and gpu["uuid"].startswith(("GPU-", "MIG-"))
        assert gpu["memory_total_mib"] > 1024


def test_no_driver_every_gpu_check_errors_with_the_readers_line():
    readings = collect.read_all()
    if readings["nvml"]["available"]:
        pytest.skip("this host has an NVIDIA driver; the GPU side is covered by test_read_on_this_host")
    doc = host_documents.check_host(readings, ["gpu_inventory", "gpu_health"])
    by_name = {r["check"]: r for r in doc["results"]}
    assert set(GPU_CHECKS) <= set(by_name)
    for name in GPU_CHECKS:
        r = by_name[name]
        assert r["status"] == "error", r
        assert r["reason"] == readings["nvml"]["error"]
        assert "\n" not in r["reason"] and "Traceback" not in r["reason"]
        assert r["remedy"] == gpu_inventory.NO_DRIVER_REMEDY


def test_read_helper_turns_nvml_errors_into_text():
    def not_supported():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def broken():
        raise ValueError("bad struct")

    assert read_field(lambda a, b: a + b, 2, 3) == (5, None)
    assert read_field(not_supported) == (None, "Not Supported")
    assert read_field(broken) == (None, "ValueError: bad struct")


def test_call_first_falls_back_and_keeps_the_first_error():
    def missing_symbol():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    assert call_first((None,), (missing_symbol,), (lambda x: x * 2, 21)) == 42
    value, err = read_field(call_first, (missing_symbol,), (lambda: (_ for _ in ()).throw(KeyError("x")),))
    assert value is None and err == "Function Not Found"
    assert read_field(call_first, (None,))[1].startswith("RuntimeError: the installed nvidia-ml-py has no function")


@pytest.mark.parametrize(
    "raw, want",
    [
        (b"00000000:18:00.0", "0000:18:00.0"),
        ("00000000:AB:00.0", "0000:ab:00.0"),
        ("0001:5D:00.0", "0001:5d:00.0"),
        (b"", None),
    ],
)
def test_bus_id_matches_the_lspci_form(raw, want):
    assert bus_id(raw) == want


@pytest.mark.parametrize("raw, want", [(13000, "13.0"), (12020, "12.2"), (12080, "12.8"), (11040, "11.4")])
def test_cuda_version_form(raw, want):
    assert cuda_version(raw) == want


def test_collect_cli_output_replays_to_the_same_verdicts(tmp_path):
    """`gpufleet collect` output is what gets recorded: replaying it must judge the GPUs as a live check does."""
    out = tmp_path / "readings.json"
    subprocess.run(
        [sys.executable, "-m", "gpufleet", "collect", "--out", str(out)], check=True, env=_env(), timeout=120
    )
    recorded = json.loads(out.read_text())
    assert set(recorded) == {"nvml", "host", "kernel_log", "software"}
    live = host_documents.check_host(collect.read_all(), ["gpu_inventory"])
    replayed = host_documents.check_host(recorded, ["gpu_inventory"])
    assert replayed["versions"] == live["versions"]  # the software and firmware replay with the recording
    # Inventory does not move between two reads a second apart (temperatures and counters may).
    assert [(r["check"], r["status"], r["reason"]) for r in replayed["results"]] == [
        (r["check"], r["status"], r["reason"]) for r in live["results"]
    ]


# --- kernel log ---------------------------------------------------------------------------------------

KMSG = """\
6,1021,4071331,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024
4,1874,912345678,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
 SUBSYSTEM=pci
 DEVICE=+pci:0000:18:00.0
3,1875,912345700,-;NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.
4,1901,955000000,-;NVRM: Xid (PCI:00000000:AB:00): 48, pid=4242, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.
[ 1234.567890] NVRM: Xid (PCI:0000:5d:00): 13, pid=881, name=pt_main_thread, Graphics Exception: ESR 0x514730=0x1000f
"""


def test_kernel_log_parses_xids_from_a_kmsg_file(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(KMSG)
    log = kernel_log.read(str(tmp_path))
    assert log["readable"] and log["error"] is None
    assert log["source"] == str(tmp_path / "dev" / "kmsg")
    assert log["lines"] == 5  # continuation lines are not messages
    assert [(e["pci"], e["xid"]) for e in log["xid_events"]] == [
        ("0000:18:00", 79),
        ("0000:ab:00", 48),
        ("0000:5d:00", 13),
    ]
    assert log["xid_events"][0]["message"].startswith("NVRM: Xid (PCI:0000:18:00): 79, pid=")
    assert log["xid_events"][0]["message"].endswith("GPU has fallen off the bus.")


def test_kernel_log_missing_file_is_unreadable_with_the_path(tmp_path):
    log = kernel_log.read(str(tmp_path))
    assert log["readable"] is False and log["xid_events"] == []
    assert str(tmp_path / "dev" / "kmsg") in log["error"]


def test_kernel_log_of_this_host_does_not_block():
    """The live read returns (non-blocking /dev/kmsg or a fallback), readable or with every reason."""
    log = kernel_log.read("/")
    assert set(log) == {"source", "readable", "error", "lines", "xid_events", "machine_checks"}
    if log["readable"]:
        assert log["source"] in ("/dev/kmsg", "dmesg", "journalctl -k -b") and log["lines"] > 0
    else:
        assert "/dev/kmsg" in log["error"] and "dmesg" in log["error"] and "journalctl" in log["error"]
    json.dumps(log)


def test_parse_xid_ignores_other_nvrm_lines():
    assert kernel_log.parse_xid("NVRM: GPU at PCI:0000:18:00: GPU-1234") is None
    assert kernel_log.parse_xid("NVRM: Xid (PCI:0000:18:00.0): 94, pid=1, Contained ECC error") == {
        "pci": "0000:18:00",
        "xid": 94,
        "message": "NVRM: Xid (PCI:0000:18:00.0): 94, pid=1, Contained ECC error",
    }


# --- processes -----------------------------------------------------------------------------------------


def test_process_name_reads_comm_then_the_cmdline(tmp_path):
    assert process_name(os.getpid()) == Path("/proc/self/comm").read_text().strip()
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "cmdline").write_bytes(b"/opt/venv/bin/python3\0train.py\0--steps\0")
    assert process_name(41, str(tmp_path)) == "python3"  # no comm (a kernel that hides it): the cmdline's first word
    (tmp_path / "41" / "comm").write_text("pt_main_thread\n")
    assert process_name(41, str(tmp_path)) == "pt_main_thread"
    assert process_name(42, str(tmp_path)) is None  # not in this pid namespace


def test_the_reading_records_cuda_visible_devices(monkeypatch):
    if not _driver_loadable():
        pytest.skip("no NVIDIA driver: the reading without one has no GPU section to judge")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert nvml.read()["cuda_visible_devices"] == "0"
