"""The host's own planted faults for tools/gpu_disturb.py (--kind memory | fill | io), each its own processes,
named after the kind ("mem_disturb", "fill_disturb", "io_disturb": what the checks should name), for --seconds or
until a stop request:

  memory  --procs processes hold --share of MemTotal between them, every page touched, and stream through it (a
          neighbour holding the memory a job needs, and eating its bandwidth): host_hygiene.memory_available fails
          naming them, benchmark.host_memory_bandwidth may fall
  fill    one file takes the drive of --path down to FILL_LEFT free (fallocate: no data written): the drive's
          benchmark refuses to write and benchmark.disk_*_bandwidth fail, the drive full
  io      --procs processes write and read files of IO_FILE bytes on --path with direct I/O, in a loop: the drive's
          benchmark sees I/O that is not its own and benchmark.host_processes fails naming it
  memcpy  --procs processes copy a buffer of --size MiB (MEMCPY_MIB) to another and back in a loop, a core each
          (memmove: some 10-15 GB/s a core on a current server): another user moving memory beside the run, as the
          field saw three such at 14 GB/s each slow a PCIe host-to-device figure. About 7% of the CPUs
          (`--procs $(( $(nproc) * 70 / 1000 ))`) stays under host_foreign_cpu_share_max's 10% with room for the
          host's own daemons: a step measured
          beside it is not disturbed, and a figure it pulls down names it as a suspect (checks.suspects)
Everything they made is removed when they stop.
"""

from __future__ import annotations

import mmap
import os
import signal
import time

KINDS = ("memory", "fill", "io", "memcpy")
SHARE = 0.6  # memory: MemAvailable of a clean node (some 93% of MemTotal) less this is under the check's 50%
FILL_LEFT = 512 << 20  # under disk_scratch_free_gib_min's 1 GiB, and under any test file's room
IO_FILE = 1 << 30
BLOCK = 4 << 20
MEMCPY_MIB = 256  # many times a CPU's caches: every copy goes to the memory
PAGE = os.sysconf("SC_PAGE_SIZE")


def meminfo_kib(name: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise SystemExit(f"gpu_disturb: /proc/meminfo has no {name}")


def _hold_memory(nbytes: int, seconds: float, ready_fd: int) -> None:
    buf, chunk = mmap.mmap(-1, nbytes), 64 << 20
    ones = b"\1" * chunk
    for off in range(0, nbytes, chunk):  # every page written: resident, not just reserved
        buf[off : off + min(chunk, nbytes - off)] = ones[: min(chunk, nbytes - off)]
    os.write(ready_fd, b"r")  # resident: the parent says so once all are
    end, zero = time.monotonic() + seconds, bytes(chunk)
    while time.monotonic() < end:  # stream through it: the memory's bandwidth too
        for off in range(0, nbytes - chunk + 1, chunk):
            buf[off : off + chunk] = zero
            if time.monotonic() >= end:
                break


def _io_loop(path: str, seconds: float) -> None:
    name = os.path.join(path, f".gpufleet-io-{os.getpid()}")
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    end = time.monotonic() + seconds
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        while time.monotonic() < end:
            for off in range(0, IO_FILE, BLOCK):
                os.pwrite(fd, buf, off)
                if time.monotonic() >= end:
                    break
            for off in range(0, IO_FILE, BLOCK):
                os.preadv(fd, [buf], off)
                if time.monotonic() >= end:
                    break
        os.close(fd)
    finally:
        if os.path.exists(name):
            os.unlink(name)


def _copy_loop(nbytes: int, seconds: float) -> None:
    """Copy a buffer to another and back until the time is up; say how fast, once, when it ends."""
    import ctypes

    a, b = ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(nbytes)
    ctypes.memset(a, 1, nbytes)
    t0 = time.monotonic()
    end, moved = t0 + seconds, 0
    while time.monotonic() < end:
        ctypes.memmove(b, a, nbytes)
        ctypes.memmove(a, b, nbytes)
        moved += 2 * nbytes
    spent = time.monotonic() - t0
    line = f"gpu_disturb memcpy pid {os.getpid()}: {moved / spent / 1e9:.1f} GB/s copied over {spent:.1f} s\n"
    os.write(1, line.encode())  # one write: the other copiers' lines end at the same moment


def children(n: int, work, uid: int | None, name: str, name_process) -> list[int]:
    """n processes doing work(), as user `uid` where given, each named `name`: their pids."""
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            name_process(name)
            try:
                work()
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def wait_children(pids: list[int], stop: dict) -> None:
    """Until they end or a stop request comes; those left then are stopped (SIGTERM) and reaped."""
    while pids and not stop["why"]:  # polled: a stop request does not interrupt a blocking wait (PEP 475)
        done, _ = os.waitpid(-1, os.WNOHANG)
        pids[:] = [p for p in pids if p != done]
        if not done:
            time.sleep(0.2)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def run(
    kind: str,
    seconds: float,
    procs: int,
    path: str | None,
    share: float,
    uid,
    stop: dict,
    name_process,
    size_mib: int | None = None,
) -> int:
    me, t0 = os.getpid(), time.monotonic()
    if kind in ("fill", "io") and not (path and os.path.isdir(path)):
        raise SystemExit(f"gpu_disturb: --kind {kind} needs --path, a folder on the drive (got {path!r})")
    name_process(f"{kind[:4]}_disturb" if kind != "memory" else "mem_disturb")
    if kind == "memory":
        total = meminfo_kib("MemTotal") * 1024
        each = int(total * share / max(procs, 1)) // PAGE * PAGE
        ready_r, ready_w = os.pipe()
        pids = children(procs, lambda: _hold_memory(each, seconds, ready_w), uid, "mem_disturb", name_process)
        got = 0
        while got < procs:  # the first line once the memory is held: what follows it meets a host without it
            got += len(os.read(ready_r, procs - got) or b"x" * procs)
        print(
            f"gpu_disturb pid {me}: {procs} processes hold {each * procs / 2**30:.1f} GiB ({share:.0%} of the host's "
            f"memory) and stream through it for {seconds:g} s (pids {', '.join(map(str, pids))})",
            flush=True,
        )
        wait_children(pids, stop)
    elif kind == "memcpy":
        mib = size_mib or MEMCPY_MIB
        pids = children(procs, lambda: _copy_loop(mib << 20, seconds), uid, "memcpy", name_process)
        print(
            f"gpu_disturb pid {me}: {procs} processes copy {mib} MiB buffers in memory, a core each, for {seconds:g} s "
            f"(pids {', '.join(map(str, pids))})",
            flush=True,
        )
        wait_children(pids, stop)
    elif kind == "io":
        pids = children(procs, lambda: _io_loop(path, seconds), uid, "io_disturb", name_process)
        print(
            f"gpu_disturb pid {me}: {procs} direct-I/O writers and readers on {path} for {seconds:g} s "
            f"(pids {', '.join(map(str, pids))})",
            flush=True,
        )
        wait_children(pids, stop)
    else:
        fs = os.statvfs(path)
        size = max(0, fs.f_bavail * fs.f_frsize - FILL_LEFT)
        name = os.path.join(path, f".gpufleet-fill-{me}")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            print(
                f"gpu_disturb pid {me}: {name} takes {size / 2**30:.1f} GiB, {path} left with "
                f"{FILL_LEFT >> 20} MiB free, for {seconds:g} s",
                flush=True,
            )
            end = time.monotonic() + seconds
            while time.monotonic() < end and not stop["why"]:
                time.sleep(0.2)
        finally:
            os.close(fd)
            os.unlink(name)
    why = f"stopped by {stop['why']}" if stop["why"] else "time is up"
    print(f"gpu_disturb pid {me}: {why} after {time.monotonic() - t0:.1f} s", flush=True)
    return 0
