"""Bring-up on a minimal node: the Python that runs Ansible's modules there has neither the packaging library nor
setuptools' pkg_resources, which ansible.builtin.pip needs (a debootstrapped Debian, a minimal cloud image).

A test host (tests/testhosts.py) made so in its overlay: /usr/bin/python3's pkg_resources removed, and apt given no
package source. bringup.yml's python_env then stops before its first pip task naming the host, the interpreter and
python3-packaging; given a local package source (a folder with python3-packaging's .deb, which this machine's apt
downloads once), the same command installs it and the pip tasks run. A node that has it is left as it is: the other
test hosts' bring-ups (the molecule scenario python_env, tests/test_bringup_sequence.py, make test-arm64).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from playbooks import playbook_env, run_playbook
from testhosts import TestFleet, skip_reason

pytestmark = pytest.mark.slow

DEBS = "/srv/debs"  # on the test host
PROBE = "try:\n import packaging.requirements\nexcept ImportError:\n import pkg_resources"


def tasks(stdout: str) -> dict:
    """Each task's name (role : task) and what ansible-playbook printed under it."""
    return dict(chunk.split("]", 1) for chunk in stdout.split("\nTASK [")[1:])


def package_source(debs: Path) -> None:
    """python3-packaging's .deb in `debs` with an index apt reads (a flat repository: `deb [trusted=yes] file:...`)."""
    debs.mkdir(parents=True)
    got = subprocess.run(["apt-get", "download", "python3-packaging"], cwd=debs, capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"apt-get download python3-packaging failed here: {got.stderr.strip()[-300:]}")
    (deb,) = debs.glob("python3-packaging_*.deb")
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    data = deb.read_bytes()
    entry = f"Filename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
    (debs / "Packages").write_text(control.rstrip("\n") + "\n" + entry)


def without_package_source(root: Path) -> None:
    """No apt source and no package lists in the host's overlay: apt can reach nothing."""
    for path in [root / "etc/apt/sources.list", *(root / "etc/apt/sources.list.d").glob("*")]:
        path.unlink(missing_ok=True)
    for path in (root / "var/lib/apt/lists").iterdir():
        if path.is_file():
            path.unlink()


def test_bringup_on_a_python_without_packaging_names_it_then_installs_it(tmp_path):
    why = skip_reason() or (None if shutil.which("apt-get") and shutil.which("dpkg-deb") else "needs apt-get, dpkg-deb")
    if why:
        pytest.skip(why)
    with TestFleet(["bare-node"], net=227, tag="gfpk") as fleet:
        root = fleet.root("bare-node")
        for name in ("pkg_resources", "packaging"):
            shutil.rmtree(root / "usr/lib/python3/dist-packages" / name, ignore_errors=True)
        bare = subprocess.run(["chroot", str(root), "/usr/bin/python3", "-c", PROBE], capture_output=True)
        assert bare.returncode != 0, "the test host's /usr/bin/python3 still has packaging or pkg_resources"
        without_package_source(root)
        (root / "srv/empty-wheelhouse").mkdir(parents=True)
        inventory = fleet.inventory(
            tmp_path / "hosts.yml",
            gpufleet_python="/opt/gpufleet/venv/bin/python",
            python_env_torch="",
            python_env_deepspeed="",
            python_env_packages=[],
            python_env_build_packages=["pip"],  # already in the venv: the pip module runs, nothing is downloaded
            python_env_engine_source="none",
            python_env_wheelhouse="/srv/empty-wheelhouse",
        )
        env = playbook_env(tmp_path, **fleet.ssh_env())

        def bringup() -> tuple[subprocess.CompletedProcess, str]:
            run = run_playbook("bringup.yml", inventory, "--tags", "python_env", env=env, timeout_s=600)
            return run, " ".join((run.stdout + run.stderr).split())

        stopped, said = bringup()
        assert stopped.returncode != 0, said[-3000:]
        assert (
            "bare-node: /usr/bin/python3, which runs Ansible's modules there, lacks the packaging library that "
            "ansible.builtin.pip needs, and python3-packaging could not be installed: No package matching "
            "'python3-packaging' is available" in said
        ), said[-3000:]
        assert "TASK [gpufleet.cluster.python_env : Install the build tools]" not in stopped.stdout

        package_source(root / DEBS.strip("/"))
        (root / "etc/apt/sources.list.d/local.list").write_text(f"deb [trusted=yes] file:{DEBS} ./\n")
        done, said = bringup()
        assert done.returncode == 0, said[-3000:]
        ran = tasks(done.stdout)
        assert "changed: [bare-node]" in ran["gpufleet.cluster.python_env : Install python3-packaging (apt)"], ran
        assert "ok: [bare-node]" in ran["gpufleet.cluster.python_env : Install the build tools"], ran
        has = subprocess.run(
            ["chroot", str(root), "/usr/bin/python3", "-c", "import packaging.requirements"], capture_output=True
        )
        assert has.returncode == 0, has.stderr
