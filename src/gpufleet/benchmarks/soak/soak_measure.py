"""Soak: sustained matmul and HBM copy load on every visible GPU at once, for a given duration.

`gpufleet bench soak --duration-s N`. Method:
- one process per GPU (spawn), started together once every one has set up (at most SETUP_TIMEOUT_S);
- each loops until the end: a burst of bf16 matmuls (8192 x 8192 x 8192, random inputs), then a burst of
  HBM copies (1 GiB, bytes moved = read + written), each burst timed between CUDA events and sized at the
  start to about BURST_S of work;
- with two GPUs or more the processes form one torch.distributed group (NCCL): after every pair of bursts a
  two-element all_reduce decides together whether to go on (the end, for every rank at once) and whether an
  all_reduce of NCCL_BYTES is due (about every NCCL_EVERY_S), which is then checked for correctness and
  timed (busbw, nccl-tests' convention 2(n-1)/n). Every collective has the group's timeout
  (STEP_TIMEOUT_S); a rank that fails or stops answering ends the soak: the parent kills every process
  still alive, and kills them all at the end plus GRACE_S in any case;
- throughput per window: the work of the bursts that ended in the window over their timed seconds
  (window_s: 30 s, longer for long soaks so that there are at most MAX_WINDOWS);
- bench.monitor.SoakSampler samples every GPU at about 1 Hz (clocks, clock event reasons, temperature,
  power), its error counters every 5 s and the kernel log's Xid events every 15 s.
benchmarks.soak.soak_judge judges it: a GPU that throttled, erred or slowed, with the time it happened.
On a machine without CUDA two CPU processes with gloo run the same loop at tiny sizes for the duration:
logic only, never a performance figure.

run() here starts the processes and collects what they send; the rest in a file of its own:

    gpu_process.py  one process per GPU: set up, wait for the start, the bursts and the votes (worker)
    outcome.py      which rank ended a soak that stopped early (attribute), the windows per GPU and NCCL's (finish)
"""

from __future__ import annotations

import math
import os
import queue
import time

from gpufleet.bench import BENCHMARK_VERSION, torch_versions
from gpufleet.bench.launch import free_port
from gpufleet.bench.monitor import SoakSampler
from gpufleet.base.registry import registers
from gpufleet.benchmarks.soak.soak_gpu_process import worker
from gpufleet.benchmarks.soak.soak_outcome import attribute, finish

SIZES = {
    "cuda": {
        "matmul_n": 8192,
        "copy_bytes": 1 << 30,
        "nccl_bytes": 256 << 20,
        "nccl_iters": 10,
        "burst_s": {"matmul": 0.5, "copy": 0.25},
    },
    "cpu": {
        "matmul_n": 96,
        "copy_bytes": 4 << 20,
        "nccl_bytes": 256 << 10,
        "nccl_iters": 3,
        "burst_s": {"matmul": 0.05, "copy": 0.025},
    },
}
WINDOW_S = 30.0
MAX_WINDOWS = 120
NCCL_EVERY_S = 10.0
SETUP_TIMEOUT_S = 300.0  # CUDA and NCCL initialisation of every GPU
STEP_TIMEOUT_S = 120.0  # any one collective; a burst takes about a second
GRACE_S = 180.0  # past the duration, before every process still alive is killed
DRAIN_S = 3.0  # after a rank failed: the others' last bursts, a few rounds' worth
DEFAULT_DURATION_S = 600.0


def window_for(duration_s: float, cpu: bool) -> float:
    """Window length: 30 s (on the CPU a sixth of the soak, for tests of seconds), at most MAX_WINDOWS windows."""
    if cpu:
        return round(max(0.5, duration_s / 6), 2)
    return max(WINDOW_S, math.ceil(duration_s / MAX_WINDOWS))


def _kill(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=10)


def run(
    duration_s: float = DEFAULT_DURATION_S,
    *,
    window_s: float | None = None,
    nccl_every_s: float | None = None,
    setup_timeout_s: float = SETUP_TIMEOUT_S,
    step_timeout_s: float = STEP_TIMEOUT_S,
    grace_s: float = GRACE_S,
    on_start=None,
) -> dict:
    """Soak every visible GPU for duration_s; see the module docstring. Never raises for a GPU that fails.
    on_start(pids), if given, is called once every process is set up and the load starts."""
    import torch
    import torch.multiprocessing as mp

    if duration_s <= 0:
        raise ValueError(f"duration_s = {duration_s}; expected a positive number of seconds")
    n_gpus = torch.cuda.device_count()
    cuda = n_gpus > 0
    world = n_gpus if cuda else 2
    sizes = SIZES["cuda" if cuda else "cpu"]
    window_s = window_s or window_for(duration_s, not cuda)
    n_windows = max(1, int(duration_s // window_s))
    nccl_every_s = nccl_every_s or min(NCCL_EVERY_S, window_s / 3)
    cfg = {
        **sizes,
        "duration_s": duration_s,
        "nccl_every_s": nccl_every_s,
        "setup_timeout_s": setup_timeout_s,
        "step_timeout_s": step_timeout_s,
    }
    method = {
        "benchmark_version": BENCHMARK_VERSION,
        "device": "cuda" if cuda else "cpu",
        "duration_s": duration_s,
        "window_s": window_s,
        "windows": n_windows,
        "processes": world,
        "matmul": f"bf16 {sizes['matmul_n']}^3 products in bursts of about {sizes['burst_s']['matmul']} s, "
        "timed with cuda events"
        if cuda
        else "bf16 products on the CPU, perf_counter",
        "hbm": f"dst.copy_(src) of {sizes['copy_bytes']} bytes in bursts of about {sizes['burst_s']['copy']} s, "
        "bytes = read + written = 2 x size",
        "nccl": (
            f"all_reduce of {sizes['nccl_bytes']} bytes, {sizes['nccl_iters']} timed, about every "
            f"{nccl_every_s:.3g} s, checked; busbw = algbw x 2(n-1)/n"
            if world > 1
            else "one GPU: none"
        ),
        "window_statistic": "work of the bursts that ended in the window / their timed seconds",
        "timeouts_s": {"setup": setup_timeout_s, "collective": step_timeout_s, "grace": grace_s},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    out = {
        "benchmark": "soak",
        "device": "cuda" if cuda else "cpu",
        "method": method,
        "versions": torch_versions(),
        "duration_s": duration_s,
        "window_s": window_s,
        "n_windows": n_windows,
        "world_size": world,
        "started": None,
        "started_epoch": None,
        "ran_s": 0.0,
        "setup_error": None,
        "stopped_early": False,
        "stop_reason": None,
        "after_effects": [],
        "gpus": {},
        "nccl": None,
        "sampler": None,
    }

    ctx = mp.get_context("spawn")
    messages, go = ctx.Queue(), ctx.Value("d", 0.0)
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, world, cuda, cfg, port, go, messages), daemon=True) for r in range(world)
    ]
    ranks = {
        r: {"info": None, "matmul": [], "copy": [], "nccl": [], "done_s": None, "error": None, "last_s": None}
        for r in range(world)
    }
    sampler = SoakSampler() if cuda else None
    try:
        for proc in procs:
            proc.start()
        # Set-up: every rank ready, or the first error, or the set-up timeout.
        deadline = time.monotonic() + setup_timeout_s
        ready = set()
        while len(ready) < world and time.monotonic() < deadline and not out["setup_error"]:
            try:
                kind, rank, *rest = messages.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in ready]
                if dead:
                    who = f"CUDA device {dead[0]}'s process" if cuda else f"process {dead[0]}"
                    out["setup_error"] = f"{who} exited with code {procs[dead[0]].exitcode} while setting up"
                continue
            if kind == "ready":
                ready.add(rank)
                ranks[rank]["info"] = rest[0]
            elif kind == "error":
                out["setup_error"] = f"CUDA device {rank}: {rest[1]}" if cuda else f"process {rank}: {rest[1]}"
        if not out["setup_error"] and len(ready) < world:
            missing = sorted(set(range(world)) - ready)
            out["setup_error"] = (
                f"{'CUDA devices' if cuda else 'processes'} {missing} not ready within {setup_timeout_s:g} s"
            )
        if out["setup_error"]:
            return finish(out, ranks, sizes["nccl_bytes"])
        if sampler:
            sampler.open()
        t0 = time.monotonic()
        out["started_epoch"] = time.time()
        out["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(out["started_epoch"]))
        if sampler:
            sampler.start(t0)
        go.value = t0
        if on_start:
            on_start([p.pid for p in procs])
        hard_end = t0 + duration_s + grace_s
        reports: dict[int, dict] = {}  # rank -> the error it reported: {"t_s", "error", "where"}
        died_s: dict[int, float] = {}  # rank -> seconds after the start when its exit was first seen

        def note_exits() -> None:
            for r, p in enumerate(procs):
                if p.exitcode is not None and r not in died_s:
                    died_s[r] = round(time.monotonic() - t0, 1)

        def take(kind, rank, rest) -> None:
            if kind in ("matmul", "copy", "nccl"):
                ranks[rank][kind].append(tuple(rest))
                ranks[rank]["last_s"] = rest[0]
            elif kind == "done":
                ranks[rank]["done_s"] = rest[0]
            elif kind == "error" and rank not in reports:
                reports[rank] = {
                    "t_s": round(rest[0], 1) if rest[0] is not None else None,
                    "error": rest[1],
                    "where": rest[2] if len(rest) > 2 else "work",
                }

        while time.monotonic() < hard_end and not reports:
            if all(ranks[r]["done_s"] is not None for r in ranks):
                break
            note_exits()
            try:
                kind, rank, *rest = messages.get(timeout=1.0)
            except queue.Empty:
                note_exits()
                if any(p.exitcode is not None and ranks[r]["done_s"] is None for r, p in enumerate(procs)):
                    break  # one died without a word: the others wait for it in the next collective
                continue
            take(kind, rank, rest)  # an error ends the loop: the others would wait for the failed one
        out["ran_s"] = round(time.monotonic() - t0, 1)
        if any(ranks[r]["done_s"] is None for r in ranks):
            # What the others still send until they block in a collective the failed one never joins.
            drain_end = time.monotonic() + DRAIN_S
            while time.monotonic() < drain_end:
                note_exits()
                try:
                    kind, rank, *rest = messages.get(timeout=0.2)
                except queue.Empty:
                    continue
                take(kind, rank, rest)
                if all(ranks[r]["done_s"] is not None for r in ranks):
                    break  # finished after all, a moment past the grace
        if any(ranks[r]["done_s"] is None for r in ranks):
            out["stopped_early"] = True
            note_exits()
            attribute(out, ranks, reports, procs, died_s, cuda, (step_timeout_s, grace_s), t0)
    finally:
        _kill(procs)
        if sampler:
            sampler.stop()
    if sampler:
        out["sampler"] = sampler.summary(window_s, n_windows)
    return finish(out, ranks, sizes["nccl_bytes"])


@registers("soak", "run")
def run_soak(steps, **options) -> dict:
    """In the node stage (steps: measure.NodeSteps): the soak with the stage's options (steps.options["soak"]), or those of
    a run that measures its disturbed or slowed windows again (soak_remeasure.py)."""
    return run(**(options or steps.options.get("soak") or {}))
