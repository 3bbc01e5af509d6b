"""Launch a worker module under torchrun on this host, bounded by a timeout.

One call per host: in a multi-node run every host calls this with its own
node rank, and torchrun's rendezvous at the master joins them. The whole
process group is killed when the timeout passes, so a dead peer turns into a
result with the log tail, never a hung playbook.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from gpufleet.base import guard


_WORKER_ERROR = re.compile(r"\[rank\d+\]: \S*(Error|Exception)\b")


def torchrun(
    module: str,
    module_args: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29511,
    timeout_s: float = 600,
    rdzv_timeout_s: int = 120,
    env_extra: dict | None = None,
    prefix: str = "gpufleet-",
) -> dict:
    """Run `module` with `--out <workdir>/rank0.json` appended; return what came back.

    Returns {"command", "rc", "timed_out", "seconds", "log_tail", "workdir", "out"}
    where "out" is this node's local rank 0 JSON (empty when it wrote none). The work folder is
    removed after a clean run unless GPUFLEET_KEEP_LOGS is set; a failed run keeps it (workdir).
    """
    if nnodes == 1 and master_addr in ("127.0.0.1", "localhost"):
        # Inside one node the port only has to be free here: never fail on one another program holds.
        master_port = free_port()
    workdir = tempfile.mkdtemp(prefix=prefix)
    guard.track_dir(workdir)
    out_json = os.path.join(workdir, "rank0.json")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", f"--node-rank={node_rank}",
        f"--master-addr={master_addr}", f"--master-port={master_port}",
        f"--rdzv-conf=timeout={rdzv_timeout_s}",
        "-m", module, *module_args, "--out", out_json,
    ]  # fmt: skip
    t0 = time.monotonic()
    log_path = os.path.join(workdir, "torchrun.log")
    with open(log_path, "wb") as log:
        rc, timed_out = run_group(cmd, log, env, timeout_s)
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:  # the guard removed the work folder: the run was stopped
        text = ""
    if guard.stopped():
        text += f"\n[gpufleet] stopped: {guard.stopped()}\n"
    # torchrun's own summary buries the workers' exceptions: put them first.
    errors = [line for line in text.splitlines() if _WORKER_ERROR.match(line)][:8]
    tail = "\n".join(errors + ["..."] + [text[-3000:]]) if errors else text[-4000:]
    out = {}
    if os.path.exists(out_json):
        with open(out_json) as f:
            out = json.load(f)
    # A stopped run leaves nothing behind; a failed one keeps its folder to be read.
    kept = (rc != 0 or timed_out or bool(os.environ.get("GPUFLEET_KEEP_LOGS"))) and not guard.stopped()
    guard.untrack_dir(workdir)
    if not kept:  # the log tail above is what a passing run keeps
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "command": cmd,
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - t0, 2),
        "log_tail": tail if (rc != 0 or timed_out) else tail[-600:],
        "workdir": workdir if kept else None,
        "out": out,
    }


def run_group(cmd: list[str], log, env: dict, timeout_s: float) -> tuple[int, bool]:
    """Run `cmd` in a session of its own, its output into `log`: (exit code, whether it timed out). A timeout kills
    the whole group (torchrun and every rank, a site's job and its children); SIGTERM (which torchrun passes on to
    its ranks) should this engine die, and the guard stops it should the run that asked for it be gone. OSError
    when it cannot start."""
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=guard.die_with_parent
    )
    guard.track(proc)
    try:
        rc, timed_out = proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc, timed_out = proc.returncode, True
    guard.untrack(proc)
    return rc, timed_out


def limit_within(timeout_s: float) -> float:
    """torchrun's own limit inside a step's timeout_s: it is stopped first (10 to 60 seconds before, a quarter of
    timeout_s between), so that its log tail is still reported before the step itself is killed."""
    return max(1, timeout_s - min(60, max(10, timeout_s // 4)))


def free_port() -> int:
    """A TCP port free on the loopback now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """TERM the launcher's whole process group, then KILL what is left after a few seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped rank (SIGSTOP) takes its TERM only once running
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
