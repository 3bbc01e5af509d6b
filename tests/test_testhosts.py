"""The test hosts of different test files never share addresses or namespace names: the suite runs its files on two
workers at once (and another suite may run on the same machine), and two fleets on one /16 take each other's hosts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

import testhosts
from testhosts import TestFleet, apart, claim, mounts_under, namespaces, skip_reason

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def fleets() -> list[tuple[str, int, str]]:
    """(where, second octet of 10.<net>.0.0/16, namespace prefix) of every set of test hosts the suite makes."""
    found = []
    for path in sorted(TESTS.glob("test_*.py")):  # not the helpers: their docstrings hold examples
        text = path.read_text()
        for net, tag in re.findall(r"(?:TestFleet|SlurmCluster)\([^)]*?net=(\d+), tag=\"(\w+)\"", text):
            found.append((path.name, int(net), tag))
        for net, tag in re.findall(r"^NET, TAG = (\d+), \"(\w+)\"", text, re.M):
            found.append((path.name, int(net), tag))
        for netns, net in re.findall(r"\"(\w+)-\w+\", \"10\.(\d+)\.\d+\.1\"", text):
            found.append((path.name, int(net), netns))
    inventory = yaml.safe_load((REPO / "molecule" / "default" / "inventory" / "hosts.yml").read_text())
    for name, hvars in inventory["all"]["children"]["gpu_nodes"]["hosts"].items():
        found.append(
            ("molecule/default", int(hvars["ansible_host"].split(".")[1]), hvars["testhost_netns"].split("-")[0])
        )
    return found


def test_every_fleet_has_a_network_and_names_of_its_own():
    found = fleets()
    # The fleets this suite is known to make; a pattern that stopped matching would make the check below empty.
    assert {"test_runner_fleet.py", "test_slurm.py", "test_playbook_finetune.py", "molecule/default"} <= {
        w for w, _, _ in found
    }
    by_net, by_tag = {}, {}
    for where, net, tag in found:
        by_net.setdefault(net, set()).add(where)
        by_tag.setdefault(tag, set()).add(where)
    shared = {f"10.{n}.0.0/16": sorted(w) for n, w in by_net.items() if len(w) > 1}
    shared |= {f"namespaces {t}-*": sorted(w) for t, w in by_tag.items() if len(w) > 1}
    assert not shared, f"test host networks or namespace names used by more than one place: {shared}"


@pytest.fixture
def own_locks(tmp_path, monkeypatch):
    """Claims of this test's own: the fleets and scenarios of other tests running beside it take the machine's, and
    a scenario waiting for those could wait as long as their whole test file."""
    monkeypatch.setattr(testhosts, "LOCK_DIR", tmp_path / "lock")


def test_a_second_fleet_on_the_same_network_waits_for_the_first(own_locks):
    first = claim(250, "gfu1")
    claimed, second = threading.Event(), []
    waiter = threading.Thread(target=lambda: (second.extend(claim(250, "gfu2")), claimed.set()), daemon=True)
    try:
        waiter.start()
        assert not claimed.wait(1), "the second fleet took network 250 while the first held it"
        for lock in first:
            lock.close()
        assert claimed.wait(120), "the second fleet did not get network 250 after the first gave it back"
    finally:
        for lock in first + second:
            lock.close()


def test_a_molecule_scenario_waits_for_the_fleets_and_they_for_it(own_locks):
    fleet = claim(251, "gfu3")
    scenario, fleet_after = [], []
    scenario_up, fleet_up = threading.Event(), threading.Event()
    try:
        threading.Thread(target=lambda: (scenario.append(apart()), scenario_up.set()), daemon=True).start()
        assert not scenario_up.wait(1), "a scenario's hosts came up beside a fleet's"
        for lock in fleet:
            lock.close()
        assert scenario_up.wait(120), "the scenario did not get its turn once the fleet was gone"
        threading.Thread(target=lambda: (fleet_after.extend(claim(251, "gfu3")), fleet_up.set()), daemon=True).start()
        assert not fleet_up.wait(1), "a fleet came up beside a scenario's hosts"
        scenario[0].close()
        assert fleet_up.wait(120), "the fleet did not get its turn once the scenario was done"
    finally:
        for lock in fleet + scenario + fleet_after:
            lock.close()


def test_the_next_fleet_of_a_tag_takes_down_what_a_killed_run_left_mounted(tmp_path):
    """A run killed before its hosts went down leaves its state folder mounted (tmpfs, the overlay root, /dev bound
    in). The next claim of the tag detaches those mounts and removes the folder without deleting through a bind;
    a folder with nothing mounted (a fleet made but still waiting) and a folder of a tag that begins alike are
    left."""
    if skip_reason():
        pytest.skip(skip_reason())
    tmp = Path(tempfile.gettempdir())
    dead, waiting, other = (Path(tempfile.mkdtemp(prefix=p, dir=tmp)) for p in ("gfu4-", "gfu4-", "gfu4x-"))
    bound = tmp_path / "machine-dev"  # stands in for this machine's /dev, bound into the dead host's root
    bound.mkdir()
    (bound / "keep").write_text("the machine's own file\n")
    try:
        (dead / "node-a").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "gpufleet-testhost", str(dead / "node-a")], check=True)
        (dead / "node-a" / "root" / "dev").mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(bound), str(dead / "node-a" / "root" / "dev")], check=True)
        for lock in claim(252, "gfu4"):
            lock.close()
        assert not dead.exists()
        assert not mounts_under(dead)
        assert (bound / "keep").read_text() == "the machine's own file\n"
        assert waiting.is_dir() and other.is_dir()
    finally:
        for mount in sorted(mounts_under(dead), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        for folder in (dead, waiting, other):
            if not mounts_under(folder):
                shutil.rmtree(folder, ignore_errors=True)


def test_a_fleet_killed_with_its_hosts_up_is_taken_down_by_the_next_claim_of_its_tag():
    """SIGKILL a process whose fleet of two hosts is up: its sshd's, namespaces and mounts outlive it; the next
    claim of the tag takes them all down."""
    if skip_reason():
        pytest.skip(skip_reason())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, testhosts\n"
            "f = testhosts.TestFleet(['node-a', 'node-b'], net=253, tag='gfu5').__enter__()\n"
            "print(f.state, flush=True)\n"
            "sys.stdin.read()\n",
        ],
        cwd=TESTS,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        state = holder.stdout.readline().strip()  # an event: the fleet is up once it prints its folder
        assert state, "the fleet did not come up"
        holder.kill()
        holder.wait(60)
        assert mounts_under(state) and namespaces("gfu5")
        for lock in claim(253, "gfu5"):
            lock.close()
        assert not mounts_under(state) and not Path(state).exists()
        assert namespaces("gfu5") == []
    finally:
        holder.kill()
        for lock in claim(253, "gfu5"):
            lock.close()


def test_a_host_keeps_pyenv_shims_of_its_own():
    """Every ssh session's login shell on a host rewrites pyenv's shims under a lock file (where this machine's
    root has pyenv). Seen through the overlay, a lock this machine's own rehash took and dropped stayed in a host's
    view, and each later session waited 60 s for it. A file made in this machine's shims folder while the host is up
    is not in the host's, and the host's session leaves this machine's folder as it was."""
    if skip_reason():
        pytest.skip(skip_reason())
    shims = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims"
    if not shims.is_dir():
        pytest.skip(f"this machine has no pyenv shims folder ({shims})")
    with TestFleet(["node-a"], net=254, tag="gfu6") as fleet:
        probe = shims / f".gpufleet-probe-{os.getpid()}"  # a dot name: pyenv's rehash leaves it alone
        # pyenv's lock comes and goes with this machine's own rehashes (Slurm's su - for a job), whatever the host does
        theirs = {probe.name, ".pyenv-shim"}
        before = sorted(p.name for p in shims.iterdir() if p.name not in theirs)
        probe.write_text("")
        try:
            session = subprocess.run(
                [
                    "ssh",
                    "-i",
                    str(fleet.key),
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "BatchMode=yes",
                    f"root@{fleet.address('node-a')}",
                    f"ls -a {shims}; echo made-by-the-host > {shims}/.gpufleet-host-{os.getpid()}",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            probe.unlink()
    assert session.returncode == 0, session.stderr
    assert probe.name not in session.stdout.split()
    assert sorted(p.name for p in shims.iterdir() if p.name not in theirs) == before
