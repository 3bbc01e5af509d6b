"""Bring-up pieces that run without Ansible hosts: the bringup_facts and bringup_record modules
(in-process, over fake sysfs trees), the host tuning script against a fake HGX tree read back by
the engine's own collector, the engine packer, and the record held against the node by
host_hygiene.bringup_drift."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import shutil

import pytest

from module_runner import REPO, run_module  # noqa: E402  (also puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.modules import bringup_facts, bringup_record  # noqa: E402

from gpufleet.base import profiles, schema  # noqa: E402
from gpufleet.checks import host_hygiene  # noqa: E402
from gpufleet.collect import host  # noqa: E402
from sysfs_tree import ACS_REDIRECT_ON, fake_nvml, hgx, vm  # noqa: E402

TUNING = REPO / "roles/host_tuning/files/gpufleet_host_tuning.py"
PACK = REPO / "roles/python_env/files/pack_engine.py"
H100 = "NVIDIA H100 80GB HBM3"


def tune(root: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(TUNING), "--root", str(root), *args], capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout)


def drift_result(root: Path, required: bool = True) -> dict:
    readings = {"host": host.read(str(root), {}), "nvml": {}}
    prof = profiles.resolve(H100, overrides={"bringup_required": required})
    return host_hygiene.bringup_drift.check_bringup_drift(readings, prof)


# --- bringup_facts ----------------------------------------------------------------------------------


def test_facts_of_a_fake_hgx(tmp_path, capsys):
    tree = hgx(tmp_path, governors=("powersave",) * 8, numa_balancing=1)
    tree.write("sys/module/nvidia/version", "550.127.05\n")
    out = run_module(bringup_facts, {"root": str(tree.root)}, capsys)
    assert out["_exit_code"] == 0 and out["changed"] is False
    assert len(out["pci"]["gpus"]) == 8 and len(out["pci"]["nvswitches"]) == 4
    assert out["driver"] == {
        "loaded": True,
        "version": "550.127.05",
        "source": f"{tree.root}/sys/module/nvidia/version",
        "reason": None,
    }
    assert [h["name"] for h in out["infiniband"]["hcas"]] == [f"mlx5_{i}" for i in range(8)]
    assert out["infiniband"]["hcas"][0]["link_layers"] == ["InfiniBand"]
    assert out["infiniband"]["hcas"][0]["ports"] == [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]
    assert out["net"]["interfaces"]["eth0"] == "up"
    assert out["cpufreq"] == {"present": True, "cpus": 8, "governors": {"powersave": 8}}
    assert out["sysctl"] == {"kernel.numa_balancing": "1", "vm.nr_hugepages": None}
    assert "nvidia_peermem" in out["modules"]["loaded"]
    # A fake tree is not a kernel: runtime writes to it are allowed wherever this runs.
    assert out["kernel"]["touchable"] is True and str(tree.root) in out["kernel"]["reason"]


def test_facts_read_the_driver_from_proc_when_sysfs_lacks_it(tmp_path, capsys):
    tree = vm(tmp_path)
    tree.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\n"
        "GCC version:  gcc version 13.3.0\n",
    )
    out = run_module(bringup_facts, {"root": str(tree.root)}, capsys)
    assert out["driver"]["version"] == "580.159.04" and out["driver"]["source"].endswith("proc/driver/nvidia/version")
    assert out["pci"] == {"gpus": ["0000:00:05.0"], "nvswitches": []}
    assert out["infiniband"]["present"] is False and out["cpufreq"]["present"] is False


def test_facts_on_this_machine_name_why_the_kernel_is_off_limits(capsys):
    out = run_module(bringup_facts, {}, capsys)
    if out["container"]["is_container"]:
        assert out["kernel"]["touchable"] is False and "container" in out["kernel"]["reason"]
    assert out["kernel"]["reason"]


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler for the NVML stand-in")
def test_facts_read_persistence_mode_through_nvml(tmp_path, capsys):
    tree = vm(tmp_path)
    state = tmp_path / "gpus"
    lib = fake_nvml(tmp_path / "libnvidia-ml.so.1", str(state))
    state.write_text("00000000:00:05.0 1\n00000000:00:06.0 0\n")
    out = run_module(bringup_facts, {"root": str(tree.root), "nvml_library": str(lib)}, capsys)
    assert out["persistence"] == {
        "read": True,
        "reason": None,
        "gpus": [
            {"index": 0, "bus_id": "0000:00:05.0", "enabled": True},
            {"index": 1, "bus_id": "0000:00:06.0", "enabled": False},
        ],
    }
    # No driver behind the library: NVML's own words.
    state.unlink()
    out = run_module(bringup_facts, {"root": str(tree.root), "nvml_library": str(lib)}, capsys)
    assert out["persistence"] == {
        "read": False,
        "gpus": [],
        "reason": f"{lib}: nvmlInit_v2: Driver Not Loaded (NVML error 9)",
    }


def test_facts_say_why_persistence_mode_was_not_read(tmp_path, capsys):
    tree = vm(tmp_path)
    out = run_module(bringup_facts, {"root": str(tree.root)}, capsys)
    assert out["persistence"] == {"read": False, "reason": "not asked (no nvml_library)", "gpus": []}
    out = run_module(
        bringup_facts, {"root": str(tree.root), "nvml_library": str(tmp_path / "libnvidia-ml.so.1")}, capsys
    )
    assert out["persistence"]["read"] is False and out["persistence"]["reason"].startswith(f"cannot load {tmp_path}")
    out = run_module(bringup_facts, {"root": str(tree.root), "nvml_library": "libc.so.6"}, capsys)
    assert "undefined symbol: nvmlErrorString" in out["persistence"]["reason"]


def test_facts_refuse_a_missing_root(tmp_path, capsys):
    out = run_module(bringup_facts, {"root": str(tmp_path / "nope")}, capsys)
    assert out["failed"] and "is not a directory" in out["msg"]


# --- bringup_record -----------------------------------------------------------------------------------


def test_record_is_written_once_and_kept(tmp_path, capsys):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=WARN\n")
    rec = tmp_path / "etc/gpufleet/bringup.json"
    args = {
        "path": str(rec),
        "role": "nccl",
        "settings": {"NCCL_DEBUG": "WARN"},
        "expect": [{"what": "nccl.conf content", "path": str(conf)}],
    }
    first = run_module(bringup_record, args, capsys)
    assert first["changed"] is True
    doc = json.loads(rec.read_text())
    section = doc["roles"]["nccl"]
    assert section["expect"] == [
        {"what": "nccl.conf content", "path": str(conf), "sha256": hashlib.sha256(conf.read_bytes()).hexdigest()}
    ]
    again = run_module(bringup_record, args, capsys)
    assert again["changed"] is False and json.loads(rec.read_text()) == doc
    # Another role's section leaves this one alone.
    run_module(bringup_record, {"path": str(rec), "role": "host_tuning", "expect": []}, capsys)
    assert json.loads(rec.read_text())["roles"]["nccl"] == section
    # Changed content is a new section, written.
    conf.write_text("NCCL_DEBUG=INFO\n")
    assert run_module(bringup_record, args, capsys)["changed"] is True
    assert json.loads(rec.read_text())["roles"]["nccl"]["expect"][0]["sha256"] != section["expect"][0]["sha256"]


def test_record_check_mode_writes_nothing(tmp_path, capsys):
    rec = tmp_path / "bringup.json"
    out = run_module(
        bringup_record,
        {
            "path": str(rec),
            "role": "nccl",
            "_ansible_check_mode": True,
            "expect": [{"path": str(tmp_path / "not-yet")}],
        },
        capsys,
    )
    assert out["changed"] is True and not rec.exists()
    assert out["section"]["expect"] == [
        {"what": str(tmp_path / "not-yet"), "path": str(tmp_path / "not-yet"), "sha256": None}
    ]


@pytest.mark.parametrize(
    "expect, words",
    [
        ([{"path": "relative/path", "value": "1"}], "needs an absolute 'path' or 'glob'"),
        ([{"path": "/x", "value": "1", "exists": True}], "give one of sha256, value, exists"),
        ([{"glob": "/sys/*/x"}], "a 'glob' needs a 'value'"),
        ([{"path": "/nonexistent/gpufleet"}], "cannot read /nonexistent/gpufleet"),
    ],
)
def test_record_refuses_bad_expectations(tmp_path, capsys, expect, words):
    out = run_module(bringup_record, {"path": str(tmp_path / "r.json"), "role": "x", "expect": expect}, capsys)
    assert out["failed"] and words in out["msg"], out


def test_corrupt_record_is_replaced_with_a_warning(tmp_path, capsys):
    rec = tmp_path / "bringup.json"
    rec.write_text("{not json")
    out = run_module(bringup_record, {"path": str(rec), "role": "nccl"}, capsys)
    assert out["changed"] and "was not valid JSON" in json.dumps(out.get("warnings"))
    assert list(json.loads(rec.read_text())["roles"]) == ["nccl"]


# --- the runtime tuning script -------------------------------------------------------------------------


def test_tuning_script_clears_acs_and_sets_governor_and_sysctl(tmp_path):
    tree = hgx(tmp_path, acs_ctrl=ACS_REDIRECT_ON, governors=("powersave",) * 8, numa_balancing=1)
    args = ("--acs-off", "--governor", "performance", "--sysctl", "kernel.numa_balancing=0")
    before = host.read(str(tree.root), tree.environ)
    rc, checked = tune(tree.root, *args, "--check")
    assert rc == 0 and len(checked["changed"]) == 32 + 8 + 1 and checked["errors"] == []
    assert host.read(str(tree.root), tree.environ)["acs"] == before["acs"]  # --check wrote nothing
    rc, done = tune(tree.root, *args)
    assert rc == 0 and done["changed"] == checked["changed"]
    acs = next(c for c in done["changed"] if c["what"].startswith("ACS control of 0000:12:00.0"))
    assert (acs["from"], acs["to"], acs["offset"]) == ("0x001d", "0x0000", "0x206")
    # The engine's own reader and checks see what the script did.
    after = {"host": host.read(str(tree.root), tree.environ), "nvml": {}}
    prof = profiles.resolve(H100, overrides={"ib_ports_min": 8})
    for check in (
        host_hygiene.pcie.check_pcie_acs,
        host_hygiene.numa.check_numa_balancing,
        host_hygiene.kernel.check_cpu_governor,
    ):
        assert check(after, prof)["status"] == schema.PASS
    assert tune(tree.root, *args)[1]["changed"] == []  # a second run changes nothing


def test_tuning_script_on_a_vm_skips_what_is_not_there(tmp_path):
    tree = vm(tmp_path)
    rc, out = tune(tree.root, "--acs-off", "--governor", "performance", "--sysctl", "kernel.numa_balancing=0")
    assert rc == 0 and out["changed"] == []
    assert [s["what"] for s in out["skipped"]] == ["pcie_acs", "cpu governor", "kernel.numa_balancing"]


def test_tuning_script_refuses_a_governor_the_cpu_lacks(tmp_path):
    tree = hgx(tmp_path, governors=("powersave",) * 8)
    for i in range(8):
        tree.write(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_available_governors", "powersave schedutil\n")
    rc, out = tune(tree.root, "--governor", "performance")
    assert rc == 1 and len(out["errors"]) == 8
    assert "governor performance not offered (available: powersave schedutil)" in out["errors"][0]["reason"]


# --- the engine packer ---------------------------------------------------------------------------------


def test_engine_pack_is_the_same_bytes_each_time(tmp_path):
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    for out in (first, second):
        subprocess.run([sys.executable, str(PACK), str(REPO), str(out)], check=True, capture_output=True)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        names = tar.getnames()
    assert {
        "pyproject.toml",
        "README.md",
        "src/gpufleet/commands/main.py",
        "src/gpufleet/base/profiles/generic.yml",
    } <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


# --- host_hygiene.bringup_drift ---------------------------------------------------------------------------


def record(root: Path, roles: dict) -> None:
    path = root / "etc/gpufleet/bringup.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 1, "written_by": "bringup.yml", "roles": roles}))


def applied_tree(tmp_path):
    """A tuned HGX tree with a record the way the roles write it (paths are node paths under the tree)."""
    tree = hgx(tmp_path)
    root = tree.root
    conf = tree.write("etc/nccl.conf", "NCCL_IB_DISABLE=0\n")
    tree.write("etc/systemd/system/gpufleet-host-tuning.service", "[Unit]\n")
    os.symlink("/etc/systemd/system/gpufleet-host-tuning.service", root / "wants-link")
    record(
        root,
        {
            "nccl": {
                "applied_at": "2026-11-21T21:00:00Z",
                "settings": {"NCCL_IB_DISABLE": 0},
                "expect": [
                    {
                        "what": "nccl.conf content",
                        "path": "/etc/nccl.conf",
                        "sha256": hashlib.sha256(conf.read_bytes()).hexdigest(),
                    }
                ],
            },
            "host_tuning": {
                "applied_at": "2026-11-21T21:01:00Z",
                "settings": {},
                "expect": [
                    {"what": "kernel.numa_balancing", "path": "/proc/sys/kernel/numa_balancing", "value": "0"},
                    {
                        "what": "CPU governor",
                        "glob": "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor",
                        "value": "performance",
                    },
                    {"what": "host tuning unit enabled", "path": "/wants-link", "exists": True},
                ],
            },
        },
    )
    return tree


def test_no_record_skips_unless_bringup_is_required(tmp_path):
    tree = hgx(tmp_path)
    r = drift_result(tree.root, required=False)
    assert r["status"] == schema.SKIP and r["reason"].startswith("bringup.yml has not run on this node")
    r = drift_result(tree.root, required=True)
    assert r["status"] == schema.FAIL and "bringup.yml has not run on this node since it was imaged" in r["reason"]
    assert "run bringup.yml" in r["remedy"] and r["threshold"]["key"] == "bringup_required"


def test_a_record_that_holds_passes(tmp_path):
    r = drift_result(applied_tree(tmp_path).root)
    assert r["status"] == schema.PASS, r
    assert r["reason"] == (
        "all 4 setting(s) bringup.yml recorded for host_tuning, nccl still hold (last applied 2026-11-21T21:01:00Z)"
    )


def test_drift_is_named_setting_by_setting(tmp_path):
    tree = applied_tree(tmp_path)
    tree.write("etc/nccl.conf", "NCCL_IB_DISABLE=1\n")
    tree.write("proc/sys/kernel/numa_balancing", "1\n")
    tree.write("sys/devices/system/cpu/cpu3/cpufreq/scaling_governor", "powersave\n")
    (tree.root / "wants-link").unlink()
    r = drift_result(tree.root, required=False)  # a record that drifted fails whatever bringup_required says
    assert r["status"] == schema.FAIL and r["value"] == 4
    assert r["reason"].startswith("4 setting(s) applied by bringup.yml no longer hold: ")
    assert "nccl: nccl.conf content (/etc/nccl.conf) changed since bringup" in r["reason"]
    assert "host_tuning: kernel.numa_balancing is 1 (/proc/sys/kernel/numa_balancing), bringup set 0" in r["reason"]
    assert "host_tuning: CPU governor is {'powersave': 1} on 1 of 8" in r["reason"]
    assert "host_tuning: host tuning unit enabled (/wants-link) is missing" in r["reason"]
    assert r["reason"].endswith("; run bringup.yml") and "bringup.yml" in r["remedy"]
    states = [i["state"] for role in r["detail"]["roles"].values() for i in role["expect"]]
    assert sorted(states) == ["drifted"] * 4


def test_a_removed_file_is_drift(tmp_path):
    tree = applied_tree(tmp_path)
    (tree.root / "etc/nccl.conf").unlink()
    r = drift_result(tree.root)
    assert r["status"] == schema.FAIL and "nccl: nccl.conf content (/etc/nccl.conf) is gone" in r["reason"]


def test_corrupt_record_is_an_error(tmp_path):
    tree = hgx(tmp_path)
    tree.write("etc/gpufleet/bringup.json", "{broken")
    r = drift_result(tree.root)
    assert r["status"] == schema.ERROR and "is not valid JSON" in r["reason"] and r["remedy"]


def test_recorded_readings_without_the_section_are_an_error():
    r = host_hygiene.bringup_drift.check_bringup_drift({"host": {}, "nvml": {}}, profiles.resolve(H100))
    assert r["status"] == schema.ERROR and "no 'bringup' section" in r["reason"]
