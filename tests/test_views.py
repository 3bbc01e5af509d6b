"""The operator views `gpufleet status` and `gpufleet hw`: built from recorded NVML readings and fake
sysfs/procfs trees, rendered, and run for real on this host (which may have no GPU)."""

from __future__ import annotations

import copy
import ctypes
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.commands import main as cli
from gpufleet.collect import nvml
from gpufleet.collect.nvml.nvlinks import nvlink_error_counts
from gpufleet.views import gpu as gpu_reads
from gpufleet.views import hw, status, system
from sysfs_tree import Tree, vm

SRC = Path(__file__).resolve().parents[1] / "src"
READINGS = Path(__file__).resolve().parent / "data" / "readings"
RECORDINGS = sorted(READINGS.glob("*.json"))
H100_8 = READINGS / "h100-sxm-8gpu-healthy.json"
H200_2 = READINGS / "recorded-h200-x2-vm.json"
NO_NVML = {"available": False, "error": nvml.NO_DRIVER, "gpus": []}
TOOLKIT = {
    "torch_version": "2.11.0+cu130",
    "torch_cuda_version": "13.0",
    "nccl_version": "2.28.9",
    "nccl_source": "torch.cuda.nccl.version()",
    "unreadable": {},
}


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def _recording(path: Path) -> dict:
    return json.loads(path.read_text())


def assert_named(gpu: dict) -> None:
    """Every value that is None is named in the GPU's unreadable, with a reason."""
    for key, value in gpu.items():
        if value is None:
            key = "nvlink_errors" if key == "nvlink_errors_age_s" else key  # no counts, so no age
            assert key in gpu["unreadable"] or any(k.startswith(f"{key}.") for k in gpu["unreadable"]), key
    assert all(isinstance(r, str) and r for r in gpu["unreadable"].values())


# --- status from recorded readings -----------------------------------------------------------------


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_status_document_from_every_recording(path):
    rec = _recording(path)
    doc = status.document(status.from_collect(rec["nvml"]), source=f"recording {path.name}", host="node0")
    assert doc["view"] == "status" and doc["schema_version"] == 1 and status.usable(doc)
    assert len(doc["gpus"]) == len(rec["nvml"]["gpus"])
    for g, src in zip(doc["gpus"], rec["nvml"]["gpus"]):
        assert tuple(g) == gpu_reads.STATUS_GPU_FIELDS
        assert_named(g)
        for key in ("index", "uuid", "temperature_c", "power_draw_w", "memory_total_mib", "ecc_volatile_uncorrected"):
            assert g[key] == src[key]
        assert g["nvlink_links_active"] == sum(1 for link in src["nvlink"] if link["active"])
        if src["nvlink"]:
            assert g["nvlink_errors"] == nvlink_error_counts(src)[0]
        else:  # a GPU without NVLink (the one-GPU VMs): no counts, and why
            assert g["nvlink_errors"] is None and g["unreadable"]["nvlink_errors"]
        # What collect does not read is named as such, never made up.
        assert g["clock_sm_mhz"] is None and g["unreadable"]["clock_sm_mhz"] == status.NOT_RECORDED
    json.dumps(doc)
    text = " ".join(status.text(doc).split())  # as one line, whatever the wrapping
    assert f"{len(doc['gpus'])} x {doc['gpus'][0]['name']}" in text
    every = status.index_ranges(range(len(doc["gpus"])))
    assert f"not read: clock_memory_max_mhz on GPU {every}: {status.NOT_RECORDED}" in text


def test_status_view_of_the_two_h200_recording():
    doc = status.document(status.from_collect(_recording(H200_2)["nvml"]), source="recording", host="node0")
    g0 = doc["gpus"][0]
    # 18 links to NVSwitches, CRC data errors that the driver counted (216 and 262 over the run in README).
    assert g0["nvlink_links_active"] == 18
    assert g0["nvlink_errors"] == {"crc_flit": 0, "crc_data": 191, "replay": 0, "recovery": 0}
    lines = status.text(doc).splitlines()
    row = next(line for line in lines if re.match(r"\s*0\s", line))
    assert re.search(r"\b37/37\b", row) and "80/700" in row and "idle" in row and "18 0/191/0/0" in row
    # PCIe replays and processes postdate this recording: shown as '-' and named.
    assert "pcie_replay on GPU 0-1: not in the recorded reading" in " ".join(" ".join(lines).split())


def test_status_view_marks_throttles_errors_and_lists_processes():
    rec = _recording(H100_8)["nvml"]
    g = rec["gpus"][3]
    g["clock_event_reasons"] = {"mask": 0x8 | 0x4, "names": ["sw_power_cap", "hw_slowdown"]}
    g["ecc_volatile_uncorrected"] = 2
    g["processes"] = [{"pid": 4242, "name": "pt_main_thread", "used_memory_mib": 70123, "kinds": ["compute"]}]
    rec["gpus"][5]["processes"] = None
    rec["gpus"][5]["unreadable"]["processes"] = "Insufficient Permissions"
    doc = status.document(status.from_collect(rec), source="recording", host="node0")
    text = status.text(doc)
    assert re.search(r"^\s*3\s.*sw_power_cap,hw_slowdown.*\b2/0 0/0\b", text, re.M)
    assert re.search(r"^\s*3\s+4242\s+pt_main_thread\s+compute\s+70123\s*$", text, re.M)
    assert "processes on GPU 5: Insufficient Permissions" in text
    # Colour: a hardware slowdown and an uncorrectable error are red.
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    console.print(status.view(doc))
    colored = console.file.getvalue()
    assert "\x1b[31mhw_slowdown" in colored or re.search(r"\x1b\[31m[^\x1b]*hw_slowdown", colored)
    assert re.search(r"\x1b\[31m2/0 0/0", colored)


def test_status_without_a_driver_says_so():
    doc = status.document(status.from_collect(NO_NVML), source="nvml", host="node0")
    assert not status.usable(doc) and status.problem(doc) == nvml.NO_DRIVER
    assert doc["gpus"] == [] and doc["error"] == nvml.NO_DRIVER
    assert nvml.NO_DRIVER in status.text(doc)


class ReplayReader:
    """Recorded readings in place of NVML, for the refresh loops."""

    def __init__(self, path: Path):
        self.reading = status.from_collect(_recording(path)["nvml"])
        self.reads = 0

    def read(self) -> dict:
        self.reads += 1
        return copy.deepcopy(self.reading) | {"read_seconds": 0.001}


def test_refresh_loops_stop_after_count(capsys):
    reader = ReplayReader(H100_8)
    started = time.monotonic()
    assert status._json_loop(reader, 3, 0.05) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 3 == reader.reads and all(len(d["gpus"]) == 8 for d in docs)
    assert time.monotonic() - started >= 0.1  # two waits between three readings

    reader = ReplayReader(H100_8)
    assert status._live_loop(reader, 2, 0.01) == 0  # captured stdout is no terminal: each table printed
    out = capsys.readouterr().out
    assert reader.reads == 2 and out.count("8 x NVIDIA H100 80GB HBM3") == 2


def test_status_cli_on_a_recording(capsys):
    assert cli.main(["status", "--readings", str(H100_8), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == f"recording {H100_8}" and len(doc["gpus"]) == 8
    assert cli.main(["status", "--readings", str(H100_8)]) == 0
    assert "8 x NVIDIA H100 80GB HBM3" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["status", "--interval-s", "0"], "--interval-s must be a positive number of seconds; got 0"),
        (["status", "--count", "0"], "--count must be 1 or more; got 0"),
        (["status", "--readings", "/nonexistent.json"], "readings file /nonexistent.json cannot be read"),
        (["hw", "--root", "/nonexistent"], "--root /nonexistent is not a directory"),
    ],
)
def test_bad_options_are_refused_with_their_name(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_recording_without_the_parts_a_command_reads_is_refused_naming_them(tmp_path, capsys):
    """The views read only the NVML part of a recording; the checks need the host part too."""
    path = tmp_path / "nvml-only.json"
    path.write_text(json.dumps({"nvml": json.loads(H100_8.read_text())["nvml"]}))
    assert cli.main(["hw", "--readings", str(path), "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--readings", str(path)]) == 2
    assert (
        f"readings file {path}: expected an object with 'nvml' and 'host' (from `gpufleet collect`)"
        in capsys.readouterr().err
    )
    path.write_text("[]")
    assert cli.main(["status", "--readings", str(path), "--json"]) == 2
    assert f"readings file {path}: expected an object with 'nvml' (from `gpufleet collect`)" in capsys.readouterr().err


def test_live_reader_without_a_driver():
    if _driver_loadable():
        pytest.skip("this host has an NVIDIA driver: test_real_runs_on_this_host covers the live read")
    reader = gpu_reads.LiveReader()
    assert reader.open() is False
    doc = reader.read()
    assert doc["available"] is False and doc["error"] == nvml.NO_DRIVER and doc["gpus"] == []
    reader.close()


# --- hw on fake trees --------------------------------------------------------------------------------

CPUINFO_BLOCK = """processor\t: {cpu}
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: {socket}
core id\t\t: {core}
cpu cores\t: 4

"""


def hgx_like(tmp_path: Path, rec: dict) -> Tree:
    """A two-socket host whose GPUs and NVSwitches sit at the recorded reading's PCI bus ids, with one
    ConnectX HCA per GPU (the last one's port down), 2 sockets x 4 cores x 2 threads."""
    tree = Tree(tmp_path / "root")
    tree.write("proc/sys/kernel/osrelease", "6.8.0-49-generic\n")
    tree.write("etc/os-release", 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
    tree.write("proc/cpuinfo", "".join(
        CPUINFO_BLOCK.format(cpu=t * 8 + s * 4 + c, socket=s, core=c)
        for t in range(2) for s in range(2) for c in range(4)
    ))  # fmt: skip
    tree.write("proc/meminfo", "MemTotal: 2113470644 kB\nMemFree: 2000000000 kB\nMemAvailable: 2080000000 kB\n")
    for node, cpus in enumerate(("0-3,8-11", "4-7,12-15")):
        tree.write(f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
        tree.write(f"sys/devices/system/node/node{node}/meminfo", f"Node {node} MemTotal:       1056735322 kB\n")
    for i, g in enumerate(rec["gpus"]):
        numa = 0 if i < 4 else 1
        tree.pci(g["pci_bus_id"], vendor="0x10de", device="0x2330", cls="0x030200", driver="nvidia", numa_node=numa)
        nic = f"0000:{0xC0 + i:02x}:00.0"
        tree.pci(nic, vendor="0x15b3", device="0x1021", cls="0x020700", driver="mlx5_core", numa_node=numa)
        down = i == len(rec["gpus"]) - 1
        tree.ib_port(f"mlx5_{i}", 1, bdf=nic, state="1: DOWN" if down else "4: ACTIVE",
                     phys_state="3: Disabled" if down else "5: LinkUp")  # fmt: skip
        tree.write(f"{tree.devpaths[nic]}/infiniband/mlx5_{i}/fw_ver", "28.39.1002\n")
    for k in range(4):
        tree.pci(f"0000:0{k + 5}:00.0", vendor="0x10de", device="0x22a3", cls="0x068000", driver="nvidia-nvswitch",
                 numa_node=0)  # fmt: skip
    return tree


def test_system_reading_of_a_two_socket_tree(tmp_path):
    rec = _recording(H100_8)["nvml"]
    tree = hgx_like(tmp_path, rec)
    s = system.read(str(tree.root))
    assert s["unreadable"] == {}, s["unreadable"]
    assert s["cpu"] == {"model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "sockets": 2,
                        "cores": 8, "threads": 16}  # fmt: skip
    assert s["memory"] == {"total_mib": 2113470644 // 1024, "available_mib": 2080000000 // 1024}
    assert [(n["node"], n["cpu_count"], n["memory_total_mib"]) for n in s["numa"]] == [(0, 8, 1031968), (1, 8, 1031968)]
    assert [d["numa_node"] for d in s["pci"]["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(s["pci"]["nvswitches"]) == 4
    hca = s["infiniband"]["hcas"][0]
    assert hca | {"ports": None} == {"name": "mlx5_0", "pci_bdf": "0000:c0:00.0", "numa_node": 0,
                                     "fw_ver": "28.39.1002", "board_id": None, "hca_type": None, "ports": None}  # fmt: skip
    assert hca["ports"] == [{"port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400,
                             "rate": "400 Gb/sec (4X NDR)", "lanes": 4, "link_layer": "InfiniBand"}]  # fmt: skip
    assert (s["kernel"], s["os"]) == ("6.8.0-49-generic", "Ubuntu 22.04.5 LTS")


def test_an_empty_infiniband_class_folder_is_no_infiniband(tmp_path):
    """ib_core loaded and no HCA (a cloud VM without InfiniBand): the folder exists and holds nothing."""
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    assert system.read_infiniband(tmp_path, {}) == {
        "present": False,
        "reason": f"{tmp_path}/sys/class/infiniband is empty",
        "hcas": [],
    }


def test_hw_document_and_text_of_an_eight_gpu_node(tmp_path):
    rec = _recording(H100_8)["nvml"]
    tree = hgx_like(tmp_path, rec)
    gpu0_bdf = rec["gpus"][0]["pci_bus_id"]  # hgx_like puts the GPUs at the recorded bus ids
    tree.aer(gpu0_bdf, "correctable", {"RxErr": 2})
    tree.ib_counter("mlx5_0", 1, "symbol_error", 7)
    doc = hw.build(rec, system.read(str(tree.root)), TOOLKIT, host="node0")
    json.dumps(doc)
    assert doc["port_errors"]["mlx5_0/1"] == {"symbol_error": 7} and doc["port_errors"]["mlx5_1/1"] == {}
    assert doc["aer"]["present"] and {d["role"] for d in doc["aer"]["devices"]} >= {"gpu", "hca"}
    assert doc["view"] == "hw" and doc["nvml"] == {"available": True, "error": None, "source": "nvml"}
    assert [g["numa_node"] for g in doc["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    g0 = doc["gpus"][0]
    assert (g0["serial"], g0["vbios_version"], g0["pcie"]["gen_current"], g0["pcie"]["width_max"]) == (
        "1652823051200", "96.00.89.00.01", 5, 16)  # fmt: skip
    assert g0["unreadable"] == {}
    # Each GPU's 18 links reach the four NVSwitches on the PCI bus, 5 + 4 + 4 + 5 links.
    assert [(r["to"], r["links"]) for r in g0["nvlink"]["reaches"]] == [
        ("NVSwitch 0000:05:00.0", [0, 1, 2, 3, 4]),
        ("NVSwitch 0000:06:00.0", [5, 6, 7, 8]),
        ("NVSwitch 0000:07:00.0", [9, 10, 11, 12]),
        ("NVSwitch 0000:08:00.0", [13, 14, 15, 16, 17]),
    ]
    assert doc["versions"] == {"driver": "535.183.01", "cuda_driver": "12.2", "nvml": "12.535.183.01",
                               "torch": "2.11.0+cu130", "torch_cuda": "13.0", "nccl": "2.28.9",
                               "nccl_source": "torch.cuda.nccl.version()", "kernel": "6.8.0-49-generic",
                               "os": "Ubuntu 22.04.5 LTS"}  # fmt: skip
    assert doc["unreadable"] == {}
    text = hw.render_text(doc)
    assert "CPU        2 socket(s) x Intel(R) Xeon(R) Platinum 8480+: 8 cores, 16 threads" in text
    assert "node 1: CPUs 4-7,12-15 (8), 1007.8 GiB memory" in text
    assert "8 x NVIDIA H100 80GB HBM3, 81559 MiB each" in text
    gpu0 = r"^  0\s+0000:18:00\.0\s+0\s+Gen5 x16 \(max Gen5 x16\)\s+1652823051200\s+96\.00\.89\.00\.01\s+G520\.0200\.00\.05\s+GPU-344e"
    assert re.search(gpu0, text, re.M)
    assert ("  GPU 0-7: 18 active: links 0-4 -> NVSwitch 0000:05:00.0, links 5-8 -> NVSwitch 0000:06:00.0, "
            "links 9-12 -> NVSwitch 0000:07:00.0, links 13-17 -> NVSwitch 0000:08:00.0") in text  # fmt: skip
    hca7 = r"^  mlx5_7\s+0000:c7:00\.0\s+NUMA 1\s+fw 28\.39\.1002\s+board \?\s+port 1\s+DOWN \(Disabled\)\s+400 Gb/s\s+InfiniBand$"
    assert re.search(hca7, text, re.M)
    assert "NCCL 2.28.9 (from torch.cuda.nccl.version())" in text and "not read" not in text
    assert "port errs  mlx5_0/1 symbol_error 7" in text
    assert re.search(r"^PCIe AER   since boot, \d+ device\(s\) .*: errors on 1$", text, re.M)
    assert f"  gpu {gpu0_bdf}: correctable 2 (RxErr 2), nonfatal 0, fatal 0" in text


def test_hw_nvlink_peers_and_switches_seen_only_by_nvml(tmp_path):
    rec = _recording(H200_2)["nvml"]
    tree = hgx_like(tmp_path, rec)
    s = system.read(str(tree.root))
    # In the VM the NVSwitches are not on the PCI bus (remote bus id ffffffff:ff:ff.0): without NVML's
    # remote device type the far end is unknown, with it a switch.
    doc = hw.build(rec, s, TOOLKIT)
    assert [r["to"] for r in doc["gpus"][0]["nvlink"]["reaches"]] == ["unknown device at ffffffff:ff:ff.0"]
    types = {i: {link: "switch" for link in range(18)} for i in (0, 1)}
    doc = hw.build(rec, s, TOOLKIT, types)
    assert doc["gpus"][1]["nvlink"]["reaches"] == [
        {"to": "NVSwitch", "remote_kind": "switch", "remote_gpu": None, "links": list(range(18))}
    ]
    assert "GPU 0-1: 18 active: links 0-17 -> NVSwitch" in hw.render_text(doc)
    # GPUs bridged to each other directly: the remote bus id is the other GPU's.
    peered = copy.deepcopy(rec)
    for me, other in ((0, 1), (1, 0)):
        for link in peered["gpus"][me]["nvlink"]:
            link["active"] = link["link"] < 4
            if link["active"]:
                link["remote_pci_bus_id"] = peered["gpus"][other]["pci_bus_id"]
    doc = hw.build(peered, s, TOOLKIT, {0: {0: "gpu", 1: "gpu", 2: "gpu", 3: "gpu"}})
    reaches = doc["gpus"][0]["nvlink"]["reaches"]
    assert [(r["to"], r["remote_gpu"], r["links"]) for r in reaches] == [("GPU1", 1, [0, 1, 2, 3])]
    text = hw.render_text(doc)
    assert "GPU 0: 4 active: links 0-3 -> GPU1" in text and "GPU 1: 4 active: links 0-3 -> GPU0" in text


def test_hw_of_a_vm_without_driver_or_cpuinfo(tmp_path):
    tree = vm(tmp_path)  # one GPU on the PCI bus, no driver reading, no /proc/cpuinfo or meminfo
    doc = hw.build(NO_NVML, system.read(str(tree.root)), TOOLKIT)
    assert doc["gpus"] == [] and doc["nvml"]["error"] == nvml.NO_DRIVER
    assert doc["pci_gpus"] == [{"bdf": "0000:00:05.0", "device": "0x2330", "driver": "nvidia", "numa_node": None}]
    assert doc["unreadable"]["cpu.model"].endswith("proc/cpuinfo: not present")
    assert doc["unreadable"]["versions.driver"] == nvml.NO_DRIVER
    assert "the platform reports no NUMA node" in doc["unreadable"]["pci.0000:00:05.0.numa_node"]
    assert doc["cpu"]["sockets"] is None and doc["numa"][0]["cpu_count"] == 16
    text = hw.render_text(doc)
    assert f"GPUs       none seen by NVML: {nvml.NO_DRIVER}" in text
    assert "1 NVIDIA GPU(s) on the PCI bus (sysfs):" in text
    assert "0000:00:05.0  device 0x2330  NUMA ?  driver nvidia" in text
    assert "HCAs       none (" in text and "not read:" in text


# --- parsers ---------------------------------------------------------------------------------------------


def test_arm_cpuinfo_takes_sockets_and_cores_from_sysfs(tmp_path):
    tree = Tree(tmp_path / "root")
    block = "processor\t: {}\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\n\n"
    tree.write("proc/cpuinfo", "".join(block.format(i) for i in range(4)))
    for i in range(4):
        tree.write(f"sys/devices/system/cpu/cpu{i}/topology/physical_package_id", f"{i // 2}\n")
        tree.write(f"sys/devices/system/cpu/cpu{i}/topology/core_id", f"{i % 2}\n")
    unreadable: dict = {}
    cpu = system.read_cpu(tree.root, unreadable)
    assert cpu == {"model": None, "vendor": "0x41", "sockets": 2, "cores": 4, "threads": 4}
    assert unreadable == {"cpu.model": f"{tree.root / 'proc/cpuinfo'} names no model"}


@pytest.mark.parametrize("text, want", [("0-55,112-167", 112), ("0", 1), ("", 0), ("0-3,x", None), (None, None)])
def test_cpulist_count(text, want):
    assert system.cpulist_count(text) == want


@pytest.mark.parametrize("code, want", [((2, 28, 9), "2.28.9"), (22809, "2.28.9"), (21903, "2.19.3"), (2708, "2.7.8")])
def test_nccl_version_text(code, want):
    assert system.nccl_version_text(code) == want


@pytest.mark.parametrize(
    "indices, want", [([0, 1, 2, 3, 4, 5, 6, 7], "0-7"), ([0, 2, 3, 5], "0,2-3,5"), ([3], "3"), ([], "")]
)
def test_index_ranges(indices, want):
    assert status.index_ranges(indices) == want


# --- real runs -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_runs_on_this_host():
    """Both commands on this host: without a driver, hw still describes CPUs, NUMA and memory and says no
    GPU, and status says no driver, both exiting 1 (the views' one rule); with one, both show every GPU NVML
    sees and exit 0."""
    run = subprocess.run([sys.executable, "-m", "gpufleet", "hw", "--json"], capture_output=True, text=True,
                         env=_env(), timeout=120)  # fmt: skip
    assert run.returncode == (0 if _driver_loadable() else 1), run.stderr
    doc = json.loads(run.stdout)
    assert doc["cpu"]["threads"] == os.cpu_count() and doc["memory"]["total_mib"] > 0
    assert doc["numa"] and doc["kernel"] == os.uname().release
    tk = doc["versions"]
    assert tk["nccl"] is not None or "dynamic loader" in doc["unreadable"]["versions.nccl"]
    text = hw.render_text(doc)
    assert text.startswith("host       ") and "NUMA       node 0: CPUs " in text

    st = subprocess.run([sys.executable, "-m", "gpufleet", "status", "--json"], capture_output=True, text=True,
                        env=_env(), timeout=120)  # fmt: skip
    sdoc = json.loads(st.stdout)
    plain = subprocess.run([sys.executable, "-m", "gpufleet", "status", "--count", "1"], capture_output=True,
                           text=True, env=_env(), timeout=120)  # fmt: skip
    if not _driver_loadable():
        assert "none seen by NVML: no NVIDIA driver" in text
        assert st.returncode == 1 and sdoc["available"] is False and sdoc["error"] == nvml.NO_DRIVER
        assert sdoc["gpus"] == [] and sdoc["view"] == "status"
        assert plain.returncode == 1 and plain.stderr.strip() == f"gpufleet status: {nvml.NO_DRIVER}"
        assert run.stderr.strip() == f"gpufleet hw: no GPU read: {nvml.NO_DRIVER}"
        return
    assert st.returncode == 0, st.stdout + st.stderr
    assert len(sdoc["gpus"]) == len(doc["gpus"]) > 0
    for g in sdoc["gpus"]:
        assert set(g) == set(gpu_reads.STATUS_GPU_FIELDS)  # JSON sorts the keys
        assert_named(g)
        assert g["memory_used_mib"] is not None and g["clock_sm_mhz"] is not None
    assert plain.returncode == 0 and f"{len(sdoc['gpus'])} x " in plain.stdout
