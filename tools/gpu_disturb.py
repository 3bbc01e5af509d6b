"""Keep one GPU, or the host's CPUs, busy for a while with a workload of our own, so that a validation run beside
it sees it.

Usage: python3 tools/gpu_disturb.py --gpu 1 --seconds 900 [--kind matmul|copy|pcie] [--size N] [--duty 1.0]
       python3 tools/gpu_disturb.py --kind cpu --procs 48 --seconds 70 [--as-user gpufleet-neighbour]
       python3 tools/gpu_disturb.py --kind memory|fill|io --seconds 90 [--path DIR] [--share 0.6] [--procs 2]
       python3 tools/gpu_disturb.py --kind memcpy --procs 3 --seconds 90 [--size 256] [--as-user gpufleet-neighbour]

--gpu is the NVML index, as gpu_health and `nvidia-smi` name the GPU (resolved to its UUID through NVML, so
CUDA_VISIBLE_DEVICES and CUDA's own device order do not matter). --kind matmul loops bf16 products of N x N
matrices (default 8192: the whole GPU; 1024 occupies a few SMs, yet every kernel still takes the GPU's time
slices from the other process); --kind copy loops device-to-device copies of N MiB (default 4096: HBM
bandwidth); --kind pcie loops pinned host-to-device and device-to-host copies of N MiB (default 1024: the PCIe
link alone). --duty below 1 sleeps between bursts, for a lighter disturbance. A validation run beside it
must name it in gpu_health.processes (pid, name, memory), and that GPU's benchmark figures must drop.
--kind cpu needs no GPU: --procs busy processes named "cpu_disturb" (no torch), under --as-user when given (created
with useradd when missing; run as root), the host neighbour of issue 39 (48 of them on a 208-CPU node); a
validation run beside it must name them in benchmark.<step>_processes (user, pids, share of the CPUs).

It names its process "gpu_disturb" (/proc/<pid>/comm, what gpu_health.processes reports), prints its pid and
what it does on the first line, a summary when it ends (after --seconds, or on SIGTERM/SIGINT), and exits 0;
the host's own kinds (host_faults.py: memory, a neighbour holding --share of the host's memory and streaming through
it, the first line once it is held; fill, the scratch drive at --path filled to its limit; io, --procs direct-I/O
writers and readers on it; memcpy, --procs processes copying --size MiB buffers in memory, a core each, under
--as-user: about 7% of the CPUs is a neighbour under the CPU-share limit) likewise;
2 when the GPU cannot be used. --cpu runs the same loop on the CPU at a tiny
size: a logic check for machines without a GPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import host_faults

BURST_S = 0.2  # work between two checks of the clock and of a stop request


def die(msg: str) -> None:
    print(f"gpu_disturb: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def name_process(name: str = "gpu_disturb") -> None:
    """/proc/<pid>/comm becomes `name`, so gpu_health.processes names this workload, not "python3" (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def nvml_uuid(index: int) -> str:
    """The UUID of the GPU NVML numbers `index`; exit 2 with the reason when there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        die(f"NVML unavailable ({exc}); is this a GPU node with the NVIDIA driver?")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            die(f"--gpu {index}: NVML sees {count} GPU(s), indices 0 to {count - 1}")
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()


def neighbour_user(name: str) -> int:
    """The uid of user `name`, created (no home, no login) when missing; exit 2 when it cannot be."""
    import pwd

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], text=True)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        die(f"--as-user {name}: no such user, and useradd could not create it (exit {made.returncode}; run as root)")


def busy_cpus(procs: int, seconds: float, uid: int | None, stop: dict) -> int:
    """`procs` processes that spin on a CPU each for `seconds`, under `uid`; stopped early by a stop request."""

    def spin() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    pids = host_faults.children(procs, spin, uid, "cpu_disturb", name_process)
    who = f" as uid {uid}" if uid is not None else ""
    print(
        f"gpu_disturb pid {os.getpid()}: {procs} busy processes{who} on the host's CPUs for {seconds:g} s "
        f"(pids {', '.join(map(str, pids))})",
        flush=True,
    )
    t0 = time.monotonic()
    host_faults.wait_children(pids, stop)
    why = f"stopped by {stop['why']}" if stop["why"] else "time is up"
    print(f"gpu_disturb pid {os.getpid()}: {why} after {time.monotonic() - t0:.1f} s", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_disturb", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", type=int, help="NVML index of the GPU to keep busy")
    p.add_argument("--seconds", type=float, required=True, help="how long to keep it busy")
    p.add_argument("--kind", choices=["matmul", "copy", "pcie", "cpu", *host_faults.KINDS], default="matmul")
    p.add_argument("--path", help="fill, io: a folder on the drive (the node's gpufleet_scratch_dir)")
    p.add_argument(
        "--share",
        type=float,
        default=host_faults.SHARE,
        help=f"memory: the share of MemTotal held ({host_faults.SHARE})",
    )
    p.add_argument("--procs", type=int, default=1, help="cpu, memory, io, memcpy: how many processes")
    p.add_argument(
        "--as-user", help="cpu, memcpy and the host's kinds: the user the processes run as (created when missing; root)"
    )
    p.add_argument(
        "--size",
        type=int,
        help="matmul: matrix side (default 8192); copy: MiB per copy (default 4096); "
        "pcie: MiB per host-device copy (default 1024); memcpy: MiB of each process's buffers (default 256)",
    )
    p.add_argument("--duty", type=float, default=1.0, help="busy fraction of the time, 0 < duty <= 1 (default 1)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU at a tiny size (logic check without a GPU)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or not 0 < args.duty <= 1:
        p.error("--seconds must be positive and --duty in (0, 1]")
    if args.kind in host_faults.KINDS:
        stop = {"why": None}
        signal.signal(signal.SIGTERM, lambda signum, _f: stop.update(why=signal.Signals(signum).name))
        signal.signal(signal.SIGINT, lambda signum, _f: stop.update(why=signal.Signals(signum).name))
        uid = neighbour_user(args.as_user) if args.as_user else None
        return host_faults.run(
            args.kind, args.seconds, args.procs, args.path, args.share, uid, stop, name_process, size_mib=args.size
        )
    if args.kind == "cpu":
        if args.procs < 1:
            p.error("--procs must be 1 or more")
        stop = {"why": None}
        signal.signal(signal.SIGTERM, lambda signum, _f: stop.update(why=signal.Signals(signum).name))
        signal.signal(signal.SIGINT, lambda signum, _f: stop.update(why=signal.Signals(signum).name))
        name_process()
        return busy_cpus(args.procs, args.seconds, neighbour_user(args.as_user) if args.as_user else None, stop)
    if not args.cpu and args.gpu is None:
        p.error("--gpu is required (or --cpu for a logic check)")

    where = "the CPU"
    if not args.cpu:
        uuid = nvml_uuid(args.gpu)
        os.environ["CUDA_VISIBLE_DEVICES"] = uuid  # before torch starts CUDA: device 0 is that GPU
        where = f"GPU {args.gpu} ({uuid})"

    import torch

    if args.cpu:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            die(f"torch sees no CUDA device for {where}")
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    if args.kind == "matmul":
        n = args.size or (8192 if not args.cpu else 128)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        op, unit, per_op = (lambda: torch.mm(a, b, out=c)), "TFLOPS", 2 * n**3 / 1e12
        what = f"bf16 matmul {n}x{n}x{n} in a loop"
    elif args.kind == "pcie":  # pinned host memory to the GPU and back: only the PCIe link and the host's memory
        mib = args.size or (1024 if not args.cpu else 8)
        host = torch.empty(mib << 20, dtype=torch.uint8).random_(0, 255)
        host = host.pin_memory() if device.type == "cuda" else host
        dev = torch.empty(mib << 20, dtype=torch.uint8, device=device)
        back = torch.empty_like(host)
        back = back.pin_memory() if device.type == "cuda" else back

        def op():
            dev.copy_(host, non_blocking=True)
            back.copy_(dev, non_blocking=True)

        unit, per_op = "GB/s (host to device and back)", 2 * (mib << 20) / 1e9
        what = f"host-device copies of {mib} MiB each way in a loop"
    else:
        mib = args.size or (4096 if not args.cpu else 8)
        src = torch.empty(mib << 20, dtype=torch.uint8, device=device).random_(0, 255)
        dst = torch.empty_like(src)
        op, unit, per_op = (lambda: dst.copy_(src)), "GB/s (read + write)", 2 * (mib << 20) / 1e9
        what = f"copies of {mib} MiB in a loop"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    name_process()
    duty = f", busy {args.duty:.0%} of the time" if args.duty < 1 else ""
    print(f"gpu_disturb pid {os.getpid()}: {what} on {where} for {args.seconds:g} s{duty}", flush=True)

    # Ops per burst from a short trial, so the clock and a stop request are looked at about every BURST_S.
    op()
    sync()
    t = time.perf_counter()
    for _ in range(3):
        op()
    sync()
    ops = max(1, round(BURST_S / max((time.perf_counter() - t) / 3, 1e-9)))
    t0 = time.monotonic()
    end = t0 + args.seconds
    done = busy = 0.0
    while time.monotonic() < end and not stop["why"]:
        b0 = time.monotonic()
        for _ in range(ops):
            op()
        sync()
        spent = time.monotonic() - b0
        busy += spent
        done += ops
        if args.duty < 1:
            time.sleep(min(max(0.0, end - time.monotonic()), spent * (1 - args.duty) / args.duty))
    elapsed = time.monotonic() - t0
    rate = done * per_op / busy if busy else 0.0
    why = f"stopped by {stop['why']}" if stop["why"] else "time is up"
    print(
        f"gpu_disturb pid {os.getpid()}: {why} after {elapsed:.1f} s; {int(done)} operations, "
        f"{rate:.4g} {unit} while busy",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
