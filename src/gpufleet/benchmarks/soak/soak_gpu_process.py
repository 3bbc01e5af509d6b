"""One soak process per GPU (spawned by benchmarks.soak.soak_measure.run): set up, say ready, wait for the start, then bursts of
matmuls and HBM copies until the group agrees to stop, each burst timed and sent to the parent."""

from __future__ import annotations

import datetime
import os
import time

from gpufleet.bench import DeviceTimer, cuda_pci_bus_id, cuda_uuid

MAX_BURST_OPS = 10_000


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
            for _ in range(2):  # and the soak's own all_reduce warmed up: its first measured round ran cold, 13% low
                dist.all_reduce(buf)
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
