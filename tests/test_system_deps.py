"""`make test` installs no system package and starts no service on the machine it runs on unless asked: CI=true
(.ci/run sets it) or SYSTEM_DEPS=install. Otherwise it names what is missing and goes on (the tests that need it
skip, saying so); `.venv` cannot be made without python3-venv, so that alone fails.

scripts/system-deps.sh runs for real, through make, with a PATH that lacks some tools and an `apt-get` that only
records how it was called and whether the machine's policy-rc.d let services start at that moment. Each run is
in a mount namespace of its own with a tmpfs over /usr/sbin, where policy-rc.d lives: the machine's own files are
never touched, and a policy-rc.d there or not there are both tried.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "make", "id", "chmod", "rm", "cat", "printf")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare: each run gets a mount namespace of its own",
)

FAKE_APT = """#!/bin/bash
# Records the call and whether a service could start now (policy-rc.d: 101 is "not allowed").
{{ echo "args: $*"; echo "frontend: $DEBIAN_FRONTEND"
   if [ -x /usr/sbin/policy-rc.d ]; then /usr/sbin/policy-rc.d slurmctld start; echo "policy: $?"; else echo "policy: none"; fi
}} >> {record}
"""


def tools(tmp_path: Path, python_ok: bool = True) -> Path:
    """A PATH folder: the shell's tools, python3 (or one without venv), and the recording apt-get. No ssh, no
    scontrol: those packages are missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in TOOLS:
        if shutil.which(name):
            (bin_dir / name).symlink_to(shutil.which(name))
    python = bin_dir / "python3"
    if python_ok:
        python.symlink_to(shutil.which("python3"))
    else:
        python.write_text("#!/bin/sh\nexit 1\n")  # `import ensurepip, venv` fails: python3-venv is missing
        python.chmod(0o755)
    apt = bin_dir / "apt-get"
    apt.write_text(FAKE_APT.format(record=tmp_path / "apt.log"))
    apt.chmod(0o755)
    return bin_dir


def make(
    tmp_path: Path,
    target: str,
    *make_args: str,
    env: dict | None = None,
    policy: str | None = None,
    python_ok: bool = True,
) -> tuple[subprocess.CompletedProcess, str, str]:
    """`make TARGET` in the checkout, in a mount namespace with an empty /usr/sbin (holding `policy` as policy-rc.d
    when given). Returns the run, what apt-get recorded, and policy-rc.d as the run left it ('' when none)."""
    bin_dir = tools(tmp_path, python_ok)
    policy_file = tmp_path / "policy-rc.d"
    if policy is not None:
        policy_file.write_text(policy)
        policy_file.chmod(0o755)
    setup = (
        f"mount -t tmpfs gpufleet-test /usr/sbin && {'cp -p ' + str(policy_file) + ' /usr/sbin/ && ' if policy else ''}"
    )
    after = "; rc=$?; cat /usr/sbin/policy-rc.d 2>/dev/null > " + str(tmp_path / "policy-after") + "; exit $rc"
    run_env = {k: v for k, v in os.environ.items() if k not in ("CI", "SYSTEM_DEPS", "MAKEFLAGS", "MAKELEVEL")}
    run_env.update(env or {})
    inner = f"{setup}PATH={bin_dir} make -s --no-print-directory {target} {' '.join(make_args)}{after}"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", inner],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    apt_log = tmp_path / "apt.log"
    left = tmp_path / "policy-after"
    return done, apt_log.read_text() if apt_log.exists() else "", left.read_text() if left.exists() else ""


@needs_root
def test_missing_packages_are_named_and_nothing_installed_unless_asked(tmp_path):
    done, apt, _ = make(tmp_path, "system-deps")
    assert done.returncode == 0, done.stderr
    assert apt == "", f"apt-get ran without being asked: {apt}"
    for package in ("openssh-client", "slurmctld", "slurmd", "munge", "slurm-client"):
        assert package in done.stderr, done.stderr
    assert "SYSTEM_DEPS=install" in done.stderr and "skip" in done.stderr, done.stderr


@needs_root
def test_no_venv_without_python3_venv_and_nothing_installed(tmp_path):
    done, apt, _ = make(tmp_path, "system-deps", python_ok=False)
    assert done.returncode == 0 and "python3-venv" in done.stderr and apt == "", (done.stderr, apt)
    # The .venv's own step: nothing to make it with, so it stops, naming the package.
    again = tmp_path / "again"
    again.mkdir()
    bin_dir = tools(again, python_ok=False)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "system-deps.sh"), "venv"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir)},
    )
    assert done.returncode == 1 and "python3-venv" in done.stderr, done.stderr
    assert not (again / "apt.log").exists()


@needs_root
@pytest.mark.parametrize(
    "asked", [{"env": {"CI": "true"}}, {"make_args": ["SYSTEM_DEPS=install"]}], ids=["CI", "make-variable"]
)
def test_asked_it_installs_with_no_service_started_and_the_policy_taken_away(tmp_path, asked):
    done, apt, left = make(tmp_path, "system-deps", *asked.get("make_args", []), env=asked.get("env"))
    assert done.returncode == 0, done.stderr
    assert "args: install -y -qq --no-install-recommends" in apt and "slurmctld" in apt, apt
    assert "frontend: noninteractive" in apt, apt
    assert apt.count("policy: 101") == 2, (
        f"a service could start while packages were installed: {apt}"
    )  # update, install
    assert left == "", f"policy-rc.d left behind: {left!r}"


@needs_root
def test_a_policy_the_machine_has_is_kept(tmp_path):
    policy = "#!/bin/sh\n# the site's own\nexit 101\n"
    done, apt, left = make(tmp_path, "system-deps", env={"CI": "true"}, policy=policy)
    assert done.returncode == 0 and "policy: 101" in apt, (done.stderr, apt)
    assert left == policy
