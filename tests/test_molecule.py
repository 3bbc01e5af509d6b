"""`molecule test` for every scenario under molecule/: the bring-up roles run against test hosts the
scenarios make themselves (an sshd per network namespace, chrooted into an overlay of this machine's
root; molecule/resources/testhost.sh), then converge again with no change and verify what they left.

Needs root (namespaces, veth pairs, mounts) and openssh-server and iproute2, which .ci/run installs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import testhosts

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
TOOLS = ("ip", "sshd", "ssh", "ssh-keygen", "chroot", "mount", "umount", "mountpoint")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_the_scenarios_are_there():
    assert SCENARIOS == ["default", "python_env"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario):
    if os.geteuid() != 0:
        pytest.skip("needs root: the scenario creates network namespaces, veth pairs and mounts")
    path = f"{BIN}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    missing = [t for t in TOOLS if not shutil.which(t, path=path)]
    assert not missing, (
        f"missing {missing}: apt-get install openssh-server iproute2, or as root make test SYSTEM_DEPS=install"
    )
    with testhosts.apart():  # no test fleet beside the scenario's hosts
        proc = subprocess.run(
            [str(BIN / "molecule"), "test", "--scenario-name", scenario],
            cwd=REPO,
            env=dict(os.environ, PATH=path, NO_COLOR="1", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"),
            capture_output=True,
            text=True,
            timeout=1200,
        )
    out = ANSI.sub("", proc.stdout + proc.stderr)
    out = "\n".join(line for line in out.splitlines() if not line.startswith("WARNING: Location"))
    assert proc.returncode == 0, out[-30000:]
    for action in ("create", "check", "converge", "idempotence", "verify", "destroy"):
        # "➜" between scenario and action in a terminal, ">" in plain output
        assert re.search(rf"^{scenario} (➜|>) {action}: Executed: Successful", out, re.M), (action, out[-30000:])
    assert "failed=0" in out and "unreachable=1" not in out
