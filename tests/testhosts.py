"""Test hosts of our own for real multi-host runs: sshd's in network namespaces, routed to each other.

Each host is an sshd in a network namespace of its own, chrooted into an overlay of this machine's root
(molecule/resources/testhost.sh), on a veth pair with a /30 of its own: this machine's end is 10.<net>.<i>.1,
the host's 10.<net>.<i>.2. Every host routes 10.<net>.0.0/16 through this machine, which forwards between the
veth ends (forwarding switched on for those interfaces alone), so the hosts reach each other. Ansible reaches
them over ssh with a key the fleet makes. Nothing leaves the machine.

    with TestFleet(["node-a", "node-b"], net=216, tag="gfv") as fleet:   # lower=, emulator=: an arm64 root
        fleet.inventory(path, gpufleet_benchmarks=[])
        fleet.slow_link("node-b", "2mbit")      # tc on both ends of node-b's link
        fleet.kill_sshd("node-a")               # the host stops answering ssh
        fleet.sys_from("node-a", tree / "sys")  # the host sees a recorded sysfs tree at /sys

Needs root, iproute2, openssh-server and -client; `skip_reason()` says what is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TESTHOST = REPO / "molecule" / "resources" / "testhost.sh"
TOOLS = ("ip", "sshd", "ssh", "ssh-keygen", "chroot", "mount", "umount", "mountpoint")
# Where the fleets' claims live, shared by every suite on this machine.
LOCK_DIR = Path("/run/lock")
TOOL_PATH = f"{BIN}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
# The hosts see this machine's root, but with fresh /tmp, /run and pyenv shims (testhost.sh says why): the checkout
# and the Python environment (gpufleet_python) are bound in read-only at their own paths, wherever they are.
SHARED = [
    f"{p}:{p}"
    for p in sorted({str(REPO), sys.prefix})
    if not any(p != q and p.startswith(q + "/") for q in (str(REPO), sys.prefix))
]


def skip_reason() -> str | None:
    """Why test hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root: the test hosts are network namespaces, veth pairs and overlay mounts"
    missing = [t for t in TOOLS if not shutil.which(t, path=TOOL_PATH)]
    if missing:
        return (
            f"missing {', '.join(missing)}: apt-get install openssh-server openssh-client iproute2, or as root "
            "make test SYSTEM_DEPS=install"
        )
    return None


def claim(net: int, tag: str) -> list:
    """Hold network 10.<net>.0.0/16 and the namespace names <tag>-* until the returned files are closed: another
    fleet on either (another test file on the other worker, another suite on this machine) waits for them instead
    of taking the same addresses."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    claims = [apart(exclusive=False)]  # first, always in this order: no fleet waits on one that waits on it
    for what in (f"net{net}", f"tag-{tag}"):
        lock = open(LOCK_DIR / f"gpufleet-testfleet-{what}.lock", "a+")  # noqa: SIM115 - held until closed by the caller
        fcntl.flock(lock, fcntl.LOCK_EX)  # an event wait: the holder's close or death releases it
        claims.append(lock)
    reap_killed(tag)
    return claims


def _mounts() -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]


def mounts_under(folder: Path | str) -> list[str]:
    """The mount points at or under `folder`."""
    return [m for m in _mounts() if m == str(folder) or m.startswith(f"{folder}/")]


def namespaces(tag: str) -> list[str]:
    """The network namespaces named `<tag>-*`."""
    listed = subprocess.run(["ip", "netns", "list"], env=_env(), capture_output=True, text=True, timeout=60).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"{tag}-")]


def reap_killed(tag: str) -> None:
    """What a killed run of `tag`'s fleet left behind: its namespaces (their sshd's killed, the veth gone) and its
    state folders' mounts, detached deepest first, the folders removed. Called with the tag's claim held, so no live
    fleet of the tag has hosts up: every `<tag>-*` namespace and every folder with mounts under it is a dead run's.
    A folder with none may be a fleet made but still waiting for the claim, and is left."""
    env = _env()
    for netns in namespaces(tag):
        subprocess.run(
            ["bash", str(TESTHOST), "down", "-", netns, "/nonexistent"], env=env, capture_output=True, timeout=120
        )
    for state in sorted(Path(tempfile.gettempdir()).glob(f"{tag}-*")):
        under = mounts_under(state)
        if not under:
            continue
        for mount in sorted(under, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], env=env, capture_output=True, timeout=60)
        # Never delete through a mount that is still there: the hosts' /dev is this machine's, bound in.
        if not mounts_under(state):
            shutil.rmtree(state, ignore_errors=True)


def apart(exclusive: bool = True):
    """The molecule scenarios' test hosts apart from every fleet of this module: a scenario holds this lock alone
    (exclusive), any number of fleets hold it together (shared). A scenario whose bring-up ran beside other fleets
    once took 20 minutes instead of about 2. Held until the returned file is closed."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    lock = open(LOCK_DIR / "gpufleet-testfleet-apart.lock", "a+")  # noqa: SIM115 - held until closed by the caller
    fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # an event wait, as claim()'s
    return lock


def _env() -> dict:
    return dict(os.environ, PATH=TOOL_PATH)


class TestFleet:
    """Hosts named `names`, in namespaces `<tag>-<i>`, on 10.<net>.<i+1>.0/30."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        names: list[str],
        *,
        net: int,
        tag: str,
        shared: list[str] | None = None,
        lower: Path | None = None,
        emulator: str | None = None,
    ):
        if not 0 < net < 256 or len(names) > 250:
            raise ValueError("net is the second octet of 10.<net>.0.0/16; at most 250 hosts")
        self.names = list(names)
        self.net, self.tag = net, tag
        self.shared = SHARED + list(shared or [])
        # Another system's root under the hosts' overlay, its programs run through QEMU (testhost.sh says how).
        self.lower, self.emulator = lower, emulator
        # Short: ssh's control sockets live under it and a socket path is at most 108 bytes.
        self.state = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
        self.key = self.state / "id_ed25519"
        self.hosts = {
            name: (f"{tag}-{i}", f"10.{net}.{i + 1}.1", f"10.{net}.{i + 1}.2") for i, name in enumerate(names)
        }
        self.claims: list = []  # claim()'s locks, held from __enter__ to close()

    # ------------------------------------------------------------ life cycle

    def __enter__(self) -> "TestFleet":
        self.claims = claim(self.net, self.tag)
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _up(self) -> None:
        env = _env()
        if self.lower:
            env.update(TESTHOST_LOWER=str(self.lower), TESTHOST_EMULATOR=self.emulator or "")
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpufleet-{self.tag}", "-f", str(self.key)],
            check=True,
            env=env,
        )
        # What a killed run left behind (namespaces, veths, mounts) claim() took down: reap_killed.
        for name, (netns, host_ip, node_ip) in self.hosts.items():
            up = subprocess.run(
                [
                    "bash",
                    str(TESTHOST),
                    "up",
                    name,
                    netns,
                    host_ip,
                    node_ip,
                    str(self.state),
                    f"{self.key}.pub",
                    *self.shared,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if up.returncode != 0:
                raise RuntimeError(f"test host {name} did not come up: {up.stderr[-2000:]}")
            subprocess.run(
                ["ip", "-n", netns, "route", "add", f"10.{self.net}.0.0/16", "via", host_ip], check=True, env=env
            )
            Path(f"/proc/sys/net/ipv4/conf/{netns}-h/forwarding").write_text("1\n")

    def close(self) -> None:
        try:
            self._down()
        finally:
            for lock in self.claims:
                lock.close()
            self.claims = []

    def _down(self) -> None:
        env = _env()
        for name, (netns, _, _) in self.hosts.items():
            subprocess.run(
                ["bash", str(TESTHOST), "down", name, netns, str(self.state)], env=env, capture_output=True, timeout=120
            )
        # Never delete through a mount that is still there: the hosts' /dev is this machine's, bound in.
        if not mounts_under(self.state):
            shutil.rmtree(self.state, ignore_errors=True)

    # ------------------------------------------------------------ what tests use

    def address(self, name: str) -> str:
        return self.hosts[name][2]

    def root(self, name: str) -> Path:
        """The host's / as this machine sees it."""
        return self.state / name / "root"

    def ssh_env(self) -> dict:
        """Environment for ansible-playbook: root logins, modules down the ssh channel (pipelining)."""
        return {
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.state / "cp"),
            "ANSIBLE_HOST_KEY_CHECKING": "false",
            "ANSIBLE_PIPELINING": "true",
        }

    def host_vars(self, name: str) -> dict:
        # Per node: gloo must use the namespace's own interface (every host shares this machine's host name),
        # the nodes share this machine's cores, and a marker that finds this node's processes.
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": 1, "GPUFLEET_TEST_NODE": name}
        return {"ansible_host": self.address(name), "gpufleet_node_env": env}

    def inventory(
        self, path: Path, names: list[str] | None = None, host_vars: dict | None = None, **group_vars
    ) -> Path:
        """An inventory of these hosts in group gpu_nodes, in the order given; host_vars: name -> extra vars."""
        common = {
            "ansible_connection": "ssh",
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no "
            "-o IdentitiesOnly=yes -o ConnectTimeout=10",
            # The overlay's lower layer is this machine's root: the same interpreter, engine and torch are there.
            "gpufleet_python": str(BIN / "python"),
            **group_vars,
        }
        nodes = {n: {**self.host_vars(n), **(host_vars or {}).get(n, {})} for n in (names or self.names)}
        path.write_text(
            yaml.safe_dump({"all": {"vars": common, "children": {"gpu_nodes": {"hosts": nodes}}}}, sort_keys=False)
        )
        return path

    def pids(self, name: str, *marks: str) -> list[int]:
        """Processes of this host (its namespace) whose command line holds one of `marks` (any, when none)."""
        netns = self.hosts[name][0]
        listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, env=_env())
        found = []
        for pid in listed.stdout.split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            if not marks or any(m in cmdline for m in marks):
                found.append(int(pid))
        return found

    def kill(self, name: str, *marks: str, sig: int = signal.SIGKILL) -> list[int]:
        pids = self.pids(name, *marks)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill_sshd(self, name: str) -> list[int]:
        """The host stops answering ssh: its sshd and every session it holds are killed."""
        return self.kill(name, "sshd")

    def sys_from(self, name: str, sys_dir: Path) -> None:
        """Bind `sys_dir` (a fake tree's sys, tests/sysfs_tree.py) over the host's /sys, in the mount namespace its
        sshd lives in (`ip netns exec` gave it one of its own, with the namespace's sysfs): the host's checks and
        counters then read that tree, and what the test writes into it later."""
        (sshd,) = [pid for pid in self.pids(name, "sshd_config_gpufleet_testhost")]
        subprocess.run(
            ["nsenter", "-t", str(sshd), "-m", "mount", "--bind", str(sys_dir), str(self.root(name) / "sys")],
            check=True,
            env=_env(),
            capture_output=True,
        )

    def slow_link(self, name: str, rate: str) -> None:
        """Limit the host's link to `rate` (tc syntax, e.g. 2mbit) both ways."""
        netns = self.hosts[name][0]
        env = _env()
        for cmd in (
            [
                "tc",
                "qdisc",
                "replace",
                "dev",
                f"{netns}-h",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "32kbit",
                "latency",
                "400ms",
            ],
            [
                "ip",
                "netns",
                "exec",
                netns,
                "tc",
                "qdisc",
                "replace",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "32kbit",
                "latency",
                "400ms",
            ],
        ):
            subprocess.run(cmd, check=True, env=env, capture_output=True)

    # Poll a condition until it holds (tests/waiting.py).
    wait_for = staticmethod(wait_for)
