"""Bring-up on aarch64. Each role picks the node's architecture (Miniforge's installer, the kernel's IOMMU option, the
CUDA repository's sbsa folder): rendered here by Ansible's own templating for both architectures, in every run of
the tests. And bringup.yml itself, run twice against an arm64 test host (an arm64 Debian userland under QEMU's
user-mode emulator, tests/arm64_root.py, sshd and every session emulated), changing nothing the second time, then
the engine on that host: that one takes many minutes under emulation and runs in `make test-arm64` alone
(GPUFLEET_ARM64=1); elsewhere it is skipped, saying so. The GPU parts of bring-up are skipped as in the molecule
scenarios (--skip-tags gpu,kernel_module)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

import arm64_root
from playbooks import playbook_env, run_playbook
from testhosts import TestFleet, skip_reason

REPO = Path(__file__).resolve().parents[1]
ROLES = REPO / "roles"
UBUNTU = {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_major_version": "22"}
DEBIAN = {"distribution": "Debian", "distribution_version": "12.7", "distribution_major_version": "12"}


def rendered(role: str, name: str, facts: dict, **more) -> str:
    """A role variable as Ansible templates it for a node with these facts (its defaults and vars/main.yml)."""
    variables = {}
    for part in ("defaults", "vars"):
        path = ROLES / role / part / "main.yml"
        if path.is_file():
            variables.update(yaml.safe_load(path.read_text()))
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    templar = Templar(
        loader=DataLoader(), variables={**variables, **more, "ansible_facts": facts, "role_path": str(ROLES / role)}
    )
    return templar.template(trust_as_template("{{ %s }}" % name))


@pytest.mark.parametrize(
    "arch, installer, iommu, cuda",
    [
        ("x86_64", "Miniforge3-Linux-x86_64.sh", "iommu=pt", "ubuntu2204/x86_64/"),
        ("aarch64", "Miniforge3-Linux-aarch64.sh", "iommu.passthrough=1", "ubuntu2204/sbsa/"),
    ],
)
def test_each_role_picks_the_architecture(arch, installer, iommu, cuda):
    facts = {"architecture": arch, **UBUNTU}
    assert rendered("python_env", "python_env_conda_installer", facts).endswith("/latest/download/" + installer)
    assert rendered("host_tuning", "host_tuning_iommu_flag", facts) == iommu
    assert rendered("nvidia_driver", "nvidia_driver_cuda_repository", facts) == (
        "https://developer.download.nvidia.com/compute/cuda/repos/" + cuda
    )
    # What a site sets wins over the architecture's pick.
    assert rendered("host_tuning", "host_tuning_iommu_flag", facts, host_tuning_iommu_cmdline="iommu=on") == "iommu=on"


def test_an_architecture_without_an_installer_or_a_cuda_folder_picks_nothing():
    facts = {"architecture": "ppc64le", **DEBIAN}
    assert rendered("python_env", "python_env_arch", facts) == ""  # tasks/conda.yml refuses it, naming it
    assert rendered("nvidia_driver", "nvidia_driver_cuda_arch", facts) == ""  # the role refuses source cuda there
    assert rendered("nvidia_driver", "nvidia_driver_cuda_repository", {**facts, "architecture": "aarch64"}).endswith(
        "/repos/debian12/sbsa/"
    )


# ---------------------------------------------------------------- bringup.yml on an arm64 test host

EMULATED_RUN = "GPUFLEET_ARM64"
CHANGED = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
VENV = "/opt/gpufleet/venv/bin/python"


def bringup(fleet: TestFleet, inventory: Path, tmp: Path) -> subprocess.CompletedProcess:
    """bringup.yml as the molecule scenarios run it: the GPU and kernel-module steps left out."""
    env = playbook_env(tmp, **fleet.ssh_env(), ANSIBLE_TIMEOUT="120")
    return run_playbook("bringup.yml", inventory, "--skip-tags", "gpu,kernel_module", env=env, timeout_s=3600)


@pytest.mark.slow
def test_bringup_twice_on_an_arm64_host_changes_nothing_the_second_time(tmp_path):
    if not os.environ.get(EMULATED_RUN):
        pytest.skip(f"an emulated arm64 userland takes many minutes: `make test-arm64` runs it ({EMULATED_RUN}=1)")
    why = skip_reason() or arm64_root.skip_reason()
    if why:
        pytest.skip(why)
    root, wheels = arm64_root.rootfs(), arm64_root.wheelhouse()
    with TestFleet(
        ["grace-a"], net=229, tag="gfarm", lower=root, emulator=arm64_root.QEMU, shared=[f"{wheels}:/srv/wheelhouse"]
    ) as fleet:
        inventory = fleet.inventory(
            tmp_path / "hosts.yml",
            gpufleet_python=VENV,
            python_env_torch="",
            python_env_deepspeed="",
            python_env_packages=[],
            python_env_wheelhouse="/srv/wheelhouse",
        )
        runs = [bringup(fleet, inventory, tmp_path) for _ in range(2)]
        for run in runs:
            assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-2000:])
        (first,), (second,) = (CHANGED.findall(run.stdout) for run in runs)
        assert int(first[1]) > 0 and second[1:] == ("0", "0", "0"), runs[1].stdout[-4000:]
        record = json.loads((fleet.root("grace-a") / "etc/gpufleet/bringup.json").read_text())
        settings = {role: entry["settings"] for role, entry in record["roles"].items()}
        assert settings["host_tuning"]["architecture"] == "aarch64"
        assert settings["host_tuning"]["iommu_cmdline"] == "iommu.passthrough=1"
        assert settings["nvidia_driver"]["cuda_repository"].endswith("/repos/debian12/sbsa/")
        assert settings["python_env"]["conda_installer"].endswith("Miniforge3-Linux-aarch64.sh")
        # The engine bring-up installed runs there, under the emulated Python, and says what it runs on.
        check = subprocess.run(
            ["ssh", "-i", str(fleet.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             f"root@{fleet.address('grace-a')}", VENV, "-m", "gpufleet", "check", "--group", "host_hygiene", "--json",
             "--exit-zero"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        doc = json.loads(check.stdout)
        assert doc["platform"]["architecture"] == "aarch64", check.stderr[-2000:]
        assert {r["check"] for r in doc["results"]} >= {"numa_affinity", "bringup_drift"}
        drift = next(r for r in doc["results"] if r["check"] == "bringup_drift")
        assert drift["status"] == "pass", drift["reason"]
