"""tools/gpu_bringup.sh, the bring-up sequence of a cloud GPU VM, run here against a test host made to look like one.

The host (tests/testhosts.py) is reached over ssh as the VM reaches itself, with inventory/cloud-vm's settings. Its
kernel is this machine's, so the roles read and write a fake VM tree instead (tests/sysfs_tree.vm: one GPU on the
root bus, no NVSwitch, no HCA, no cpufreq, driver 580.159.04, NUMA balancing on), persistence mode comes from an
NVML stand-in (tests/data/fake_nvml.c), and the Python that makes the venv has no ensurepip, as Ubuntu's without
python3-venv. Every role runs its real tasks, with no --skip-tags. What a CPU cannot show: the node accepted
(it has no GPU, so validate.yml fails it; the script is told so with EXPECT_ACCEPTANCE=0).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from playbooks import playbook_env, run_playbook
from sysfs_tree import fake_nvml, vm
from testhosts import TestFleet, skip_reason

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PIN = "580.159.04"
FAKE_ROOT = "/srv/gpufleet-fake/vm/root"  # on the test host
NVML_DIR = "/srv/fake-nvml"
NO_ENSUREPIP = "/srv/no-ensurepip"
WHEELHOUSE = "/srv/wheelhouse"


def wheelhouse(dest: Path) -> Path:
    """pip and wheel: what the VM's wheelhouse gives a venv made without ensurepip (tools/gpu_wheelhouse.sh)."""
    dest.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(dest),
            "pip",
            "wheel",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return dest


def make_vm(host_root: Path) -> None:
    """The fake VM tree, the NVML stand-in and a Python without ensurepip, inside the test host."""
    tree = vm(host_root / FAKE_ROOT.strip("/").removesuffix("/root"))
    tree.write("sys/module/nvidia/version", f"{PIN}\n")
    tree.write("proc/sys/kernel/numa_balancing", "1\n")
    (tree.root / "sys/class/infiniband").mkdir(parents=True)  # ib_core loaded, no HCA: what the VMs show
    # The NIC under the name the test host's own has, so the NCCL_SOCKET_IFNAME the nccl role derives from the tree
    # names an interface validate.yml finds there (host_hygiene.nccl_env reads the host's).
    shutil.rmtree(tree.root / "sys/class/net/ens3")
    tree.net({"eth0": "up"})
    nvml = host_root / NVML_DIR.strip("/")
    fake_nvml(nvml / "libnvidia-ml.so.1", f"{NVML_DIR}/gpus")
    (nvml / "gpus").write_text("00000000:00:05.0 1\n")
    shadow = host_root / NO_ENSUREPIP.strip("/") / "shadow/ensurepip"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        'raise ImportError("no ensurepip here, as in Ubuntu\'s python3 without python3-venv")\n'
    )
    python = host_root / NO_ENSUREPIP.strip("/") / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={NO_ENSUREPIP}/shadow exec {BIN / "python"} "$@"\n')
    python.chmod(0o755)


def vm_inventory(fleet: TestFleet, path: Path) -> Path:
    """inventory/cloud-vm's settings for the test host, less what must point at the fake VM here."""
    cloud_vm = yaml.safe_load((REPO / "inventory/cloud-vm/group_vars/gpu_nodes.yml").read_text())
    cloud_vm.pop("gpufleet_controller_python")  # the controller here is this machine, not the node
    return fleet.inventory(
        path,
        **{
            **cloud_vm,
            "nvidia_driver_sysfs_root": FAKE_ROOT,
            "host_tuning_sysfs_root": FAKE_ROOT,
            "nccl_sysfs_root": FAKE_ROOT,
            "nvidia_driver_nvml_library": f"{NVML_DIR}/libnvidia-ml.so.1",
            "python_env_system_python": f"{NO_ENSUREPIP}/python3",
            "python_env_wheelhouse": WHEELHOUSE,
            "python_env_packages": ["transformers"],  # peft is not in the test environment
            "gpufleet_benchmarks": [],
        },
    )


def steps(out: Path) -> dict:
    return {row["step"]: row for row in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}


def test_bringup_twice_held_drifted_and_restored_on_a_vm_like_host(tmp_path):
    why = skip_reason() or (None if shutil.which("cc") else "needs a C compiler for the NVML stand-in")
    if why:
        pytest.skip(why)
    wheels = wheelhouse(tmp_path / "wheelhouse")
    out = tmp_path / "out"
    with TestFleet(["gpu-vm"], net=243, tag="gfb", shared=[f"{wheels}:{WHEELHOUSE}"]) as fleet:
        host_root = fleet.root("gpu-vm")
        make_vm(host_root)
        inventory = vm_inventory(fleet, tmp_path / "inventory.yml")
        env = playbook_env(
            tmp_path,
            **fleet.ssh_env(),
            OUT=str(out),
            INVENTORY=str(inventory),
            REPORTS_DIR=str(tmp_path / "reports"),
            DRIVER_PIN=PIN,
            EXPECT_ACCEPTANCE="0",
            BUDGET_S="1500",
            TIER="acceptance",
        )  # its benchmarks off: checks only
        proc = subprocess.run(
            ["bash", str(REPO / "tools/gpu_bringup.sh")], env=env, capture_output=True, text=True, timeout=1800
        )
        table = proc.stdout[-6000:] + proc.stderr[-3000:]
        ran = steps(out)
        for name in [n for n, row in ran.items() if not row["as_expected"]][:1]:  # where its time went
            timed = out / f"{name}.timed.log"
            lines = timed.read_text().splitlines()[-12:] if timed.exists() else ["(no timed log)"]
            table += f"\n{timed.name}, its last lines:\n" + "\n".join(lines)
        logs = {name: (out / f"{name}.log").read_text() for name in ran}

        # The persistence mode of a GPU turned off: the role fails naming it, and changes nothing.
        (host_root / NVML_DIR.strip("/") / "gpus").write_text("00000000:00:05.0 0\n")
        off = run_playbook(
            "bringup.yml",
            inventory,
            "--tags",
            "nvidia_driver",
            "-e",
            f"nvidia_driver_version={PIN}",
            env=env,
            timeout_s=300,
        )
        pth = "".join(
            p.read_text()
            for p in host_root.glob("opt/gpufleet/venv/lib/python3.*/site-packages/*.pth")
            if p.name == "gpufleet-inherited.pth"
        )

    # Every step went as it should; the table printed last says so.
    assert proc.returncode == 0, table
    assert list(ran) == [
        "pin-refused",
        "check",
        "bringup-1",
        "bringup-2",
        "validate-1",
        "drift",
        "validate-2",
        "bringup-3",
        "validate-3",
    ], table

    # A pin that is not the loaded driver: refused by name, nothing installed or changed.
    assert f"is {PIN}, expected 550.127.05; nvidia_driver_install is false" in ran["pin-refused"]["outcome"]
    assert ran["pin-refused"]["changed"] == 0

    # Every role's real tasks (no --skip-tags): what does not apply is named, persistence verified, not set.
    first = " ".join(logs["bringup-1"].split())
    assert "nvidia-fabricmanager: not applicable, no NVSwitch on the PCI bus" in first
    assert "nvidia_peermem: not applicable, no InfiniBand or RoCE HCA" in first
    assert "persistence mode on for all 1 GPU(s) (NVML): verified, not changed" in first
    assert "the loaded driver is the one wanted: nothing to install" in first
    assert "nvidia-persistenced" not in "".join(ran["bringup-1"]["changed_tasks"])
    assert "pcie_acs: no PCIe bridge above a GPU or NIC" in first
    assert "cpu governor: no CPU frequency scaling exposed (cpufreq absent)" in first
    assert "gpufleet.cluster.host_tuning : Apply ACS, governor and sysctls now" in ran["bringup-1"]["changed_tasks"]
    # The venv made without ensurepip, pip from the wheelhouse; torch and the rest seen through the .pth.
    assert "gpufleet.cluster.python_env : Put pip into the venv from the wheelhouse's" in " ".join(
        ran["bringup-1"]["changed_tasks"]
    )
    assert str(BIN.parent / "lib") in pth and pth.startswith("# gpufleet python_env: the packages of")

    # Twice: nothing changes.
    assert ran["bringup-2"]["changed"] == 0, ran["bringup-2"]

    # Held to it: bringup_drift passes, fails naming both drifted settings, passes again once bringup.yml restored them.
    assert ran["validate-1"]["drift_status"] == "pass", ran["validate-1"]
    reason = ran["validate-2"]["drift_reason"]
    assert (
        ran["validate-2"]["drift_status"] == "fail"
        and "nccl: nccl.conf content (/etc/nccl.conf) changed since bringup" in reason
    )
    assert (
        f"host_tuning: kernel.numa_balancing is 1 ({FAKE_ROOT}/proc/sys/kernel/numa_balancing), bringup set 0" in reason
    )
    restored = ran["bringup-3"]["changed_tasks"]
    assert "gpufleet.cluster.nccl : Write /etc/nccl.conf" in restored
    assert "gpufleet.cluster.host_tuning : Apply ACS, governor and sysctls now" in restored
    assert ran["validate-3"]["drift_status"] == "pass", ran["validate-3"]
    # The CPU host has no GPU: validate.yml fails it for that alone, none of the host's settings.
    assert ran["validate-3"]["verdict"] == "fail" and not [
        c for c in ran["validate-3"]["failing"] if c.startswith("host_hygiene")
    ]

    # Persistence off on a VM whose GPU settings are not ours: a failure naming the GPU, and no change.
    off_out = " ".join((off.stdout + off.stderr).split())
    assert off.returncode != 0 and "persistence mode is off on 0000:00:05.0 of gpu-vm" in off_out, off_out[-3000:]
    assert "changed=0" in off_out
