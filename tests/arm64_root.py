"""An arm64 Debian userland for the arm64 test host (testhost.sh with TESTHOST_LOWER and TESTHOST_EMULATOR): Debian's
debootstrap unpacks bookworm's arm64 packages here, and its second stage runs them through qemu-user-static in a user
namespace of its own (molecule/resources/testhost_emulated.py), so this machine's binfmt_misc stays as it was. Built
once, under a lock, into GPUFLEET_ARM64_ROOT (default ~/.cache/gpufleet/arm64-bookworm), and kept: the test host's
writes land in its overlay, never here. Also the wheels its Python environment installs from (it reaches no index).

Needs root, debootstrap, qemu-user-static, Linux 6.7 or later (a user namespace's own binfmt_misc), and Debian's
package mirror and PyPI for the first build; skip_reason() says what is missing.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMULATED = REPO / "molecule" / "resources" / "testhost_emulated.py"
QEMU = "/usr/bin/qemu-aarch64-static"
ROOT = Path(os.environ.get("GPUFLEET_ARM64_ROOT") or Path.home() / ".cache" / "gpufleet" / "arm64-bookworm")
MIRROR = os.environ.get("GPUFLEET_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = "python3,python3-venv,openssh-server"
# The engine's dependencies and the venv's build tools, as arm64 wheels for bookworm's Python 3.11.
WHEELS = ("setuptools>=68", "wheel", "PyYAML>=6", "nvidia-ml-py>=12.535")
DONE = ".gpufleet-complete"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: debootstrap, overlay mounts and namespaces"
    missing = [t for t in ("debootstrap", "unshare") if not shutil.which(t)] + ([] if os.path.exists(QEMU) else [QEMU])
    if missing:
        return f"missing {', '.join(missing)}: apt-get install debootstrap qemu-user-static"
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    if (major, minor) < (6, 7):
        return f"Linux {platform.release()}: a user namespace has a binfmt_misc of its own from 6.7 on"
    probe = subprocess.run([sys.executable, str(EMULATED), QEMU, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"binfmt_misc cannot be registered in a user namespace here: {probe.stderr.strip()[-300:]}"
    return None


def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path.with_suffix(".lock"), "a+")  # noqa: SIM115 - held until the caller closes it
    fcntl.flock(lock, fcntl.LOCK_EX)  # another suite building the same root: wait for it, then use it
    return lock


def rootfs() -> Path:
    """The arm64 root, built if it is not there yet."""
    with _locked(ROOT):
        if (ROOT / DONE).exists():
            return ROOT
        building = ROOT.with_name(ROOT.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run(
            ["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase", f"--include={PACKAGES}", "bookworm",
             str(building), MIRROR],
            check=True, capture_output=True, timeout=1800,
        )  # fmt: skip
        # container=lxc: debootstrap makes no device node (a user namespace may not) and checks for none.
        subprocess.run(
            [sys.executable, str(EMULATED), QEMU, "env", "container=lxc", "chroot", str(building),
             "/debootstrap/debootstrap", "--second-stage"],
            check=True, capture_output=True, timeout=3600,
        )  # fmt: skip
        shutil.rmtree(ROOT, ignore_errors=True)
        building.rename(ROOT)
        (ROOT / DONE).write_text("debootstrap bookworm arm64: " + PACKAGES + "\n")
        return ROOT


def wheelhouse() -> Path:
    """The wheels for the arm64 host's venv (pip download from PyPI for manylinux aarch64, Python 3.11)."""
    folder = ROOT.with_name(ROOT.name + "-wheels")
    with _locked(folder):
        if not (folder / DONE).exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", "3.11",
                 "--implementation", "cp", "--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_17_aarch64",
                 "--dest", str(folder), *WHEELS],
                check=True, capture_output=True, timeout=600,
            )  # fmt: skip
            (folder / DONE).write_text("\n".join(WHEELS) + "\n")
    return folder
