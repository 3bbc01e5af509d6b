"""A real Slurm cluster for tests: Debian's slurmctld, slurmd and munged, on the network-namespace test hosts.

One munged with a key made here (its socket in the cluster's folder, which every daemon and scontrol reach through
`AuthInfo=socket=`), slurmctld on this machine, and one slurmd per test host, run inside that host's namespace with
its own node name (`slurmd -N`), its own spool folder and log. No daemon listens in this machine's network
namespace, so nothing it starts can answer (or take the ports of) a Slurm the machine already runs: Slurm has no
option to bind one address, so slurmctld runs in the first host's namespace beside that host's slurmd (on ports
of its own), and every slurmd in its host's. scontrol and sinfo dial slurmctld at the first host's address over
that host's link; munged listens on a socket in the cluster's folder only.

    with SlurmCluster(["sn1", "sn2"], net=219, tag="gfs") as slurm:
        slurm.wait_idle()
        slurm.scontrol("update", "nodename=sn1", "state=drain", "reason=admin: fan")
        slurm.node_state("sn1")   # 'IDLE+DRAIN', read back with `scontrol show node`

Needs root, the test hosts' tools and slurmctld, slurmd, munged, scontrol (`make test SYSTEM_DEPS=install` installs
them, starting no service); `skip_reason()` says what is missing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import testhosts
from gpufleet.bench.launch import free_port
from waiting import wait_for

TOOLS = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo")
TOOL_PATH = f"{testhosts.TOOL_PATH}:/usr/bin"
# slurm.conf settings a test may override (SlurmCluster(settings=...)): Slurm's own default of each.
SETTINGS = {"SlurmdTimeout": 300}


def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be made here, or None."""
    why = testhosts.skip_reason()
    if why:
        return why
    missing = [t for t in TOOLS if not shutil.which(t, path=TOOL_PATH)]
    if missing:
        return (
            f"missing {', '.join(missing)}: apt-get install slurmctld slurmd munge slurm-client, or as root "
            "make test SYSTEM_DEPS=install"
        )
    return None


class SlurmCluster(testhosts.TestFleet):
    """Test hosts `names` (testhosts.TestFleet), each a Slurm node of that name, one partition `gpu` holding them all;
    `health_check` (a program) runs as HealthCheckProgram every few seconds. With `sweep_partition`, a second
    partition of that name over the same nodes, below `gpu` (PriorityTier 1 against 10): a job of `gpu` preempts
    one of it, which is cancelled (PreemptType=preempt/partition_prio, PreemptMode=CANCEL), as docs/fleet-in-service.md
    sets a site up for sweeps."""

    __test__ = False

    def __init__(
        self,
        names: list[str],
        *,
        net: int,
        tag: str,
        health_check: Path | None = None,
        sweep_partition: str | None = None,
        settings: dict | None = None,
    ):
        super().__init__(names, net=net, tag=tag)
        self.health_check = health_check
        self.sweep_partition = sweep_partition
        self.settings = {**SETTINGS, **(settings or {})}
        self.dir = Path(tempfile.mkdtemp(prefix=f"{tag}-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.daemons: dict[str, subprocess.Popen] = {}  # slurmctld, munged, slurmd-<node>: each one's latest

    # ------------------------------------------------------------ life cycle

    def env(self) -> dict:
        """Environment for scontrol, sinfo and gpufleet's Slurm commands: this cluster's slurm.conf."""
        return dict(os.environ, SLURM_CONF=str(self.conf), PATH=TOOL_PATH)

    def _start(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.dir / log, "ab")  # noqa: SIM115 - the daemon's log, closed with the test's folder
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        out.close()
        self.procs.append(proc)
        self.daemons[log.removesuffix(".out")] = proc
        return proc

    def _up(self) -> None:
        super()._up()
        munge = self.munge_socket.parent
        munge.mkdir(mode=0o700)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.start("munged")
        controller = self.address(self.names[0])  # slurmctld runs in the first host's namespace
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.address(n)} CPUs=1 RealMemory=64 State=UNKNOWN" for n in self.names
        )
        health = (
            f"HealthCheckProgram={self.health_check}\nHealthCheckInterval=5\nHealthCheckNodeState=ANY\n"
            if self.health_check
            else ""
        )
        settings = "".join(f"{k}={v}\n" for k, v in self.settings.items())
        partitions = f"PartitionName=gpu Nodes={','.join(self.names)} Default=YES State=UP"
        if self.sweep_partition:
            # KillWait: seconds between SIGTERM and SIGKILL of a preempted job's processes.
            partitions = (
                f"PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\nKillWait=5\n{partitions} PriorityTier=10\n"
                f"PartitionName={self.sweep_partition} Nodes={','.join(self.names)} State=UP PriorityTier=1"
            )
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        self.conf.write_text(f"""\
ClusterName=gpufleettest
SlurmctldHost={socket.gethostname()}({controller})
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool/%n
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd-%n.pid
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmdLogFile={self.dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
{settings}{health}{nodes}
{partitions}
""")
        self.start("slurmctld", "-c")
        for name in self.names:
            (self.dir / "spool" / name).mkdir()
            self.start(f"slurmd-{name}")

    def start(self, daemon: str, *more: str) -> None:
        """Start `daemon` (munged, slurmctld, or slurmd-<node>) and wait until it answers: slurmctld to `scontrol
        ping`; a slurmd is seen registered by the controller later (wait_idle). slurmctld starts from its saved
        state (its jobs, nodes and reservations) unless `more` says -c."""
        if daemon == "munged":
            munge = self.munge_socket.parent
            self._start(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--socket={self.munge_socket}",
                    f"--key-file={self.dir / 'munge.key'}",
                    f"--pid-file={munge}/munged.pid",
                    f"--seed-file={munge}/munged.seed",
                    f"--log-file={self.dir}/munged.log",
                ],
                "munged.out",
            )
            wait_for(self.munge_socket.exists, 60, "munged's socket")
        elif daemon == "slurmctld":
            # nsenter, not `ip netns exec`: only the network is the host's own; /sys (slurmd's cgroups) stays this
            # machine's.
            argv = self.in_netns(self.names[0], "slurmctld", "-D", *more, "-i", "-f", str(self.conf))
            self._start(argv, "slurmctld.out")
            wait_for(self._answers, 120, f"slurmctld on port {self.ctld_port} (log: {self.dir}/slurmctld.log)")
        else:
            name = daemon.removeprefix("slurmd-")
            self._start(self.in_netns(name, "slurmd", "-D", "-N", name, "-f", str(self.conf)), f"{daemon}.out")

    def stop(self, daemon: str, sig: int = signal.SIGTERM) -> None:
        """Stop `daemon` (as start names it) with `sig` and wait until it has gone; munged's socket removed with it.
        What slurmd started (a job's slurmstepd) lives on, as on a node whose slurmd died."""
        proc = self.daemons[daemon]
        if proc.poll() is None:
            os.kill(proc.pid, sig)  # the daemon alone, not its group: nsenter execs it, so this is its pid
        proc.wait(timeout=120)
        if daemon == "munged":
            self.munge_socket.unlink(missing_ok=True)

    def in_netns(self, name: str, *argv: str) -> list[str]:
        """argv run in host `name`'s network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.hosts[name][0]}", *argv]

    def _answers(self) -> bool:
        return (
            subprocess.run(["scontrol", "ping"], env=self.env(), capture_output=True, text=True, timeout=60).returncode
            == 0
        )

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
        super().close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ what tests use

    def scontrol(self, *args: str) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"scontrol {shlex.join(args)}: {done.stderr}"
        return done.stdout

    def node(self, name: str) -> dict:
        """`scontrol show node NAME -o` as {key: value}; Reason's value runs to the end of the line's field."""
        line = self.scontrol("show", "node", name, "-o").strip()
        fields, key = {}, None
        for word in line.split(" "):
            if "=" in word and word.split("=", 1)[0].replace("_", "").isalnum():
                key, value = word.split("=", 1)
                fields[key] = value
            elif key:
                fields[key] += " " + word  # a value with spaces (Reason)
        return fields

    def node_state(self, name: str) -> str:
        return self.node(name)["State"]

    def wait_idle(self, timeout_s: float = 180) -> None:
        """Every node registered and idle (its slurmd answered the controller)."""
        wait_for(
            lambda: all(self.node_state(n).split("+")[0] == "IDLE" for n in self.names),
            timeout_s,
            f"every slurmd registered idle (logs in {self.dir})",
        )

    def log(self, name: str) -> str:
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""
