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
checks.soak judges it: a GPU that throttled, erred or slowed, with the time it happened.
On a machine without CUDA two CPU processes with gloo run the same loop at tiny sizes for the duration:
logic only, never a performance figure.
"""

from __future__ import annotations

import datetime
import math
import os
import queue
import socket
import statistics
import time

from gpufleet.bench import BENCHMARK_VERSION, DeviceTimer, cuda_pci_bus_id, cuda_uuid, torch_versions
from gpufleet.bench.monitor import SoakSampler
from gpufleet.numbers import significant

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
MAX_BURST_OPS = 10_000
DEFAULT_DURATION_S = 600.0


def window_for(duration_s: float, cpu: bool) -> float:
    """Window length: 30 s (on the CPU a sixth of the soak, for tests of seconds), at most MAX_WINDOWS windows."""
    if cpu:
        return round(max(0.5, duration_s / 6), 2)
    return max(WINDOW_S, math.ceil(duration_s / MAX_WINDOWS))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- worker (one process per GPU)


def _burst(op, count: int, timer) -> float:
    timer.start()
    for _ in range(count):
        op()
    return timer.stop_s()


def _ops_for(op, burst_s: float, timer) -> int:
    """Operations in one burst of about burst_s, from a timed trial after warm-up."""
    for _ in range(3):
        op()
    per_op = _burst(op, 5, timer) / 5
    return max(1, min(MAX_BURST_OPS, round(burst_s / max(per_op, 1e-9))))


def worker(rank: int, world: int, cuda: bool, cfg: dict, port: int, go, out) -> None:
    """One rank: set up, say ready, wait for the start, load the device until the group agrees to stop.

    Messages on `out`: ("ready", rank, info), ("matmul"|"copy", rank, t_end_s, seconds, work),
    ("nccl", rank, t_end_s, seconds_per_op, correct), ("done", rank, t_s), ("error", rank, t_s, text).
    """
    import torch
    import torch.distributed as dist

    t0 = None
    where = "setup"
    try:
        if cuda:
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            info = {
                "name": torch.cuda.get_device_name(device),
                "uuid": cuda_uuid(torch, device),
                "pci_bus_id": cuda_pci_bus_id(torch, device),
            }
        else:
            device = torch.device("cpu")
            torch.set_num_threads(1)  # one core a rank: the CPU run is logic, not load
            info = {"name": "cpu", "uuid": None, "pci_bus_id": None}
        n = cfg["matmul_n"]
        gen = torch.Generator(device=device).manual_seed(1234 + rank)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)  # never zeros: they run faster
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
        c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        src = torch.randint(0, 255, (cfg["copy_bytes"],), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        timer = DeviceTimer(device)
        if world > 1:
            kwargs = {"device_id": device} if cuda else {}
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=cfg["step_timeout_s"]),
                **kwargs,
            )
            buf = torch.empty(cfg["nccl_bytes"] // 4, device=device)
            flag = torch.zeros(2, device=device)
            dist.all_reduce(flag)  # the communicator is made here, inside the set-up time
        mm_ops = _ops_for(lambda: torch.mm(a, b, out=c), cfg["burst_s"]["matmul"], timer)
        copy_ops = _ops_for(lambda: dst.copy_(src, non_blocking=True), cfg["burst_s"]["copy"], timer)
        out.put(
            (
                "ready",
                rank,
                {**info, "pid": os.getpid(), "matmul_ops_per_burst": mm_ops, "copy_ops_per_burst": copy_ops},
            )
        )
        deadline = time.monotonic() + cfg["setup_timeout_s"]
        while go.value == 0.0:  # the parent sets the start once every rank is ready
            if time.monotonic() > deadline:
                raise TimeoutError(f"no start within {cfg['setup_timeout_s']:g} s of being ready")
            time.sleep(0.02)
        t0 = go.value
        where = "work"
        end = t0 + cfg["duration_s"]
        last_nccl = t0
        flops, copied = 2 * n**3 * mm_ops, 2 * cfg["copy_bytes"] * copy_ops
        while True:
            secs = _burst(lambda: torch.mm(a, b, out=c), mm_ops, timer)
            out.put(("matmul", rank, time.monotonic() - t0, secs, flops))
            secs = _burst(lambda: dst.copy_(src, non_blocking=True), copy_ops, timer)
            out.put(("copy", rank, time.monotonic() - t0, secs, copied))
            now = time.monotonic()
            if world == 1:
                if now >= end:
                    break
                continue
            # One vote a round: any rank past the end stops all; any rank past the interval starts an all_reduce.
            flag[0], flag[1] = float(now >= end), float(now - last_nccl >= cfg["nccl_every_s"])
            where = "collective"  # a failure here is often another rank's: the parent tells them apart
            dist.all_reduce(flag)
            stop, nccl_due = flag[0].item() > 0, flag[1].item() > 0
            if stop:
                break
            if nccl_due:
                buf.fill_(float(rank + 1))
                dist.all_reduce(buf)
                ok = bool(torch.all(buf == world * (world + 1) / 2))
                secs = _burst(lambda: dist.all_reduce(buf), cfg["nccl_iters"], timer) / cfg["nccl_iters"]
                out.put(("nccl", rank, time.monotonic() - t0, secs, ok))
                last_nccl = time.monotonic()
            where = "work"
        out.put(("done", rank, time.monotonic() - t0))
    except Exception as exc:  # reported with its time and where; the parent ends the soak
        out.put(
            ("error", rank, (time.monotonic() - t0) if t0 else None, f"{type(exc).__name__}: {str(exc)[:500]}", where)
        )
    finally:
        if world > 1 and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


# ---------------------------------------------------------------- parent


def _kill(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=10)


def _windows(bursts: list, window_s: float, n_windows: int, unit_scale: float) -> list:
    """[(t_end, seconds, work)] -> per window: work / timed seconds (scaled), and the burst count."""
    sums = [[0.0, 0.0, 0] for _ in range(n_windows)]
    for t_end, secs, work in bursts:
        w = min(int(t_end // window_s), n_windows - 1)
        sums[w][0] += work
        sums[w][1] += secs
        sums[w][2] += 1
    return [
        {
            "index": w,
            "start_s": round(w * window_s, 1),
            "value": significant(work / secs / unit_scale) if secs else None,
            "bursts": count,
        }
        for w, (work, secs, count) in enumerate(sums)
    ]


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
    port = _free_port()
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
            return _finish(out, ranks, cuda)
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
            _attribute(out, ranks, reports, procs, died_s, cuda, (step_timeout_s, grace_s), t0)
    finally:
        _kill(procs)
        if sampler:
            sampler.stop()
    if sampler:
        out["sampler"] = sampler.summary(window_s, n_windows)
    return _finish(out, ranks, cuda)


def _attribute(
    out: dict, ranks: dict, reports: dict, procs: list, died_s: dict, cuda: bool, timeouts_s: tuple, t0: float
) -> None:
    """Which rank ended the soak, set as its `error`; what the others reported then goes to out["after_effects"].

    The ranks go round by round together, so a failure shows in every rank: the one whose own work failed,
    else one that died without a word while the others still worked, else the one that stopped first (fewer
    bursts than the others: it hung); a collective that failed in a rank waiting for it is an after-effect, and
    so is a rank that died a whole collective timeout after the one behind stopped (NCCL's watchdog ends a rank
    that waited that long). A rank that is merely slow also has fewer bursts when another is killed: the death
    decides, not the count.
    """
    step_timeout_s, grace_s = timeouts_s
    what = "GPU" if cuda else "process"
    now = round(time.monotonic() - t0, 1)
    unfinished = [r for r in ranks if ranks[r]["done_s"] is None]
    dead = {r: procs[r].exitcode for r in unfinished if procs[r].exitcode is not None and r not in reports}
    bursts = {r: len(ranks[r]["matmul"]) + len(ranks[r]["copy"]) for r in ranks}
    most = max(bursts.values())
    own = [r for r in unfinished if r in reports and reports[r]["where"] != "collective"]
    behind = [r for r in unfinished if bursts[r] < most]
    waited = [
        r
        for r in dead
        if r not in behind and any(died_s.get(r, now) - (ranks[b]["last_s"] or 0.0) >= step_timeout_s for b in behind)
    ]
    died_first = [r for r in dead if r not in waited]
    culprits = own or died_first or behind or list(dead) or sorted(reports, key=lambda r: reports[r]["t_s"] or 0)[:1]
    for r in culprits:
        if r in reports:
            ranks[r]["error"] = {"t_s": reports[r]["t_s"], "error": reports[r]["error"]}
        elif r in dead:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"process exited with code {dead[r]} during the soak",
            }
        elif reports:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": "fell behind the others: no burst after this time while "
                "they went on, and a collective waiting for it failed",
            }
        else:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"stopped answering: no burst after this time, and "
                f"not finished {grace_s:g} s after the end; killed",
            }
    if not culprits:  # nobody reported, died or fell behind: every rank still working past the grace
        for r in unfinished:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"not finished {grace_s:g} s after the end; killed",
            }
        culprits = unfinished
    out["after_effects"] = [{"rank": r, **reports[r]} for r in sorted(reports) if r not in culprits] + [
        {"rank": r, "t_s": now, "error": f"process exited with code {code}", "where": "exit"}
        for r, code in sorted(dead.items())
        if r not in culprits
    ]
    first = culprits[0]
    out["stop_reason"] = f"{what} {first} failed: {ranks[first]['error']['error']}"


def _finish(out: dict, ranks: dict, cuda: bool) -> dict:
    """Windows per GPU and for NCCL, from what each rank sent."""
    window_s, n_windows = out["window_s"], out["n_windows"]
    sampled = ((out.get("sampler") or {}).get("per_gpu") or {}).items()
    by_uuid = {(g.get("uuid") or "").lower(): int(i) for i, g in sampled if g.get("uuid")}
    by_pci = {(g.get("pci_bus_id") or "")[:-2]: int(i) for i, g in sampled if g.get("pci_bus_id")}
    for r, rank in ranks.items():
        info = rank["info"] or {}
        mm = _windows(rank["matmul"], window_s, n_windows, 1e12)
        hbm = _windows(rank["copy"], window_s, n_windows, 1e9)
        windows = [
            {
                "index": m["index"],
                "start_s": m["start_s"],
                "matmul_tflops": m["value"],
                "hbm_gbps": h["value"],
                "matmul_bursts": m["bursts"],
                "copy_bursts": h["bursts"],
            }
            for m, h in zip(mm, hbm)
        ]
        mm_vals = [w["matmul_tflops"] for w in windows if w["matmul_tflops"] is not None]
        hbm_vals = [w["hbm_gbps"] for w in windows if w["hbm_gbps"] is not None]
        out["gpus"][str(r)] = {
            **{
                k: info.get(k)
                for k in ("name", "uuid", "pci_bus_id", "pid", "matmul_ops_per_burst", "copy_ops_per_burst")
            },
            # NVML's index of this CUDA device: by UUID, else by PCI bus id (torch gives "0000:18:00", NVML adds ".0").
            "nvml_index": by_uuid.get((info.get("uuid") or "").lower(), by_pci.get(info.get("pci_bus_id") or "-")),
            "windows": windows,
            "matmul_tflops_median": significant(statistics.median(mm_vals)) if mm_vals else None,
            "hbm_gbps_median": significant(statistics.median(hbm_vals)) if hbm_vals else None,
            "bursts": len(rank["matmul"]) + len(rank["copy"]),
            "last_burst_s": rank["last_s"],
            "done_s": rank["done_s"],
            "error": rank["error"],
        }
    world = out["world_size"]
    rounds = ranks[0]["nccl"] if world > 1 else []
    if world > 1:
        nbytes = SIZES["cuda" if cuda else "cpu"]["nccl_bytes"]
        factor = 2 * (world - 1) / world
        per_window: dict[int, list] = {}
        for t_end, secs, _ in rounds:
            per_window.setdefault(min(int(t_end // window_s), n_windows - 1), []).append(nbytes / secs / 1e9 * factor)
        wrong = sorted({(round(t, 1), r) for r, rank in ranks.items() for t, _, ok in rank["nccl"] if not ok})
        busbw = [nbytes / secs / 1e9 * factor for _, secs, _ in rounds]
        out["nccl"] = {
            "size_bytes": nbytes,
            "rounds": len(rounds),
            "windows": [
                {
                    "index": w,
                    "start_s": round(w * window_s, 1),
                    "busbw_gbps": significant(statistics.median(per_window[w])) if w in per_window else None,
                }
                for w in range(n_windows)
            ],
            "busbw_gbps_median": significant(statistics.median(busbw)) if busbw else None,
            "wrong": [{"t_s": t, "rank": r} for t, r in wrong],
        }
    return out
