"""Local drive bandwidth on a scratch file the operator names (gpufleet_scratch_dir, GPUFLEET_SCRATCH_DIR): a
sequential write of a new file, then a read of it back, both with direct I/O (O_DIRECT: the drive, not the page
cache), in 4 MiB blocks with several requests in flight. Never on a device: a folder of a mounted file system.

fio, the field's tool, measures it where it is installed (`--direct=1 --ioengine=libaio --iodepth=16 --bs=4M`,
its bandwidth log every 250 ms the samples); else THREADS threads of our own each keep one O_DIRECT request in
flight (pwrite, preadv into a page-aligned buffer) and each block's completion is timed. Each phase runs for
SECONDS or until the file reaches its depth's size; the samples are the bytes done in each INTERVAL_S. bench.io_watch
reads the drive's own counts meanwhile: I/O that is not this run's over host_foreign_io_mib_s_max disturbs the
figure. The file is removed at the end, whatever happened.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gpufleet.bench import BENCHMARK_VERSION, host_watch, summarize
from gpufleet.bench.io_watch import IoWatch
from gpufleet.base.numbers import significant

SCRATCH_ENV = "GPUFLEET_SCRATCH_DIR"
SCRATCH_VARIABLE = "gpufleet_scratch_dir"
BLOCK = 4 << 20
THREADS = 8
MAX_BYTES = {"smoke": 1 << 30, "quick": 8 << 30, "thorough": 32 << 30, "cpu": 64 << 20}
SECONDS = {"smoke": 0.5, "quick": 1.0, "thorough": 10.0, "cpu": 0.5}
INTERVAL_S = 0.25
HEADROOM_BYTES = 1 << 30  # left free beyond the file: the benchmark never fills a drive
FIO_DEPTH = 16
UNSET = (
    f"no scratch folder named ({SCRATCH_VARIABLE}, {SCRATCH_ENV} on the node): set it to a folder on the node's local "
    "NVMe drive (the one jobs stage data and checkpoints on) to measure it"
)


def scratch_dir(scratch: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(folder, why not measured: a skip, why refused: an error) from the argument or the environment."""
    path = scratch if scratch is not None else os.environ.get(SCRATCH_ENV)
    if not path:
        return None, UNSET, None
    where = f"{SCRATCH_VARIABLE} ({SCRATCH_ENV}) is {path!r}"
    if not os.path.isabs(path):
        return None, None, f"{where}; expected an absolute path to a folder"
    real = os.path.realpath(path)
    if real == "/dev" or real.startswith("/dev/") or (os.path.exists(real) and not os.path.isdir(real)):
        return None, None, f"{where}; expected a folder of a mounted file system, never a device or a file"
    if not os.path.isdir(real):
        return None, None, f"{where}; no such folder on this node"
    if not os.access(real, os.W_OK):
        return None, None, f"{where}; not writable by this user"
    return real, None, None


def _samples(ends: list[tuple[float, int]], seconds: float) -> list[float]:
    """GB/s in each interval of the phase (the last, partial one left out unless it is the only one)."""
    step = min(INTERVAL_S, seconds / 4) if seconds > 0 else INTERVAL_S
    n = max(1, int(seconds / step))
    done = [0] * n
    for t, nbytes in ends:
        done[min(int(t / step), n - 1)] += nbytes
    return [b / step / 1e9 for b in done]


def _own_phase(path: str, write: bool, max_bytes: int, seconds: float, span: int) -> dict:
    """One phase with our own threads: {"bytes", "seconds", "ends": [(t, bytes)]}; span: the bytes a read may
    cycle over (what the write left)."""
    flags = (os.O_WRONLY | os.O_CREAT) if write else os.O_RDONLY
    fd = os.open(path, flags | os.O_DIRECT, 0o600)  # EINVAL: a file system without direct I/O (tmpfs)
    lock, ends, offset = threading.Lock(), [], [0]
    noise = os.urandom(BLOCK)  # incompressible: a drive that compresses or deduplicates shows its real rate
    t0 = time.monotonic()
    errors: list[str] = []

    def worker() -> None:
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        buf.write(noise)
        try:
            while time.monotonic() - t0 < seconds:
                with lock:
                    if write and offset[0] + BLOCK > max_bytes:
                        return
                    off = offset[0] % span if not write else offset[0]
                    offset[0] += BLOCK
                n = os.pwrite(fd, buf, off) if write else os.preadv(fd, [buf], off)
                with lock:
                    ends.append((time.monotonic() - t0, n))
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
        finally:
            buf.close()

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(THREADS)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if write:
        os.fsync(fd)  # what the drive holds: its cache flushed
    os.close(fd)
    if errors:
        raise OSError(f"{'write' if write else 'read'} of {path}: {errors[0]}")
    return {"bytes": sum(n for _, n in ends), "seconds": time.monotonic() - t0, "ends": ends}


def parse_fio(report: str, bw_log: str, rw: str) -> dict:
    """fio's JSON report (--output-format=json) and its bandwidth log (--write_bw_log, lines "msec, KiB/s, ddir,
    bs, offset"): {"bytes", "seconds", "samples_gbps", "version"}."""
    doc = json.loads(report[report.index("{") :])  # fio may print a warning line before the JSON
    job = doc["jobs"][0][rw]
    samples = [int(line.split(",")[1]) * 1024 / 1e9 for line in bw_log.splitlines() if line.count(",") >= 2]
    return {
        "bytes": job["io_bytes"],
        "seconds": job["runtime"] / 1000,
        "samples_gbps": samples,
        "version": doc.get("fio version"),
    }


def _fio_phase(fio: str, path: str, write: bool, size: int, seconds: float) -> dict:
    """One phase through fio; `size`: the write's most, the read's span (what the write left: fio would lay out
    the rest of a larger file first)."""
    rw = "write" if write else "read"
    with tempfile.TemporaryDirectory(prefix="gpufleet-fio-") as logs:
        prefix = os.path.join(logs, "bw")
        cmd = [
            fio,
            "--name=gpufleet",
            f"--filename={path}",
            f"--rw={rw}",
            f"--bs={BLOCK}",
            "--direct=1",
            "--ioengine=libaio",
            f"--iodepth={FIO_DEPTH}",
            f"--size={size}",
            f"--runtime={int(seconds * 1000)}ms",
            "--output-format=json",
            f"--write_bw_log={prefix}",
            f"--log_avg_msec={int(INTERVAL_S * 1000)}",
        ]
        cmd.append("--end_fsync=1" if write else "--time_based")  # what the drive holds; the read cycles over it
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=seconds + 120, env=dict(os.environ, LC_ALL="C")
        )
        if proc.returncode != 0:
            raise OSError(f"fio {rw} exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}")
        logs_read = "".join(p.read_text() for p in sorted(Path(logs).glob("bw_bw*.log")))
        return parse_fio(proc.stdout, logs_read, rw)


def run(depth: str = "quick", scratch: str | None = None) -> dict:
    folder, skipped, refused = scratch_dir(scratch)
    max_bytes, seconds = MAX_BYTES[depth], SECONDS[depth]
    out: dict = {
        "scratch": folder,
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "tier": depth,
            "block_bytes": BLOCK,
            "max_bytes": max_bytes,
            "seconds_per_phase": seconds,
            "interval_s": INTERVAL_S,
            "direct_io": True,
            "phases": "a new file written sequentially (then fsync), then read back",
            "statistic": "bytes / seconds",
        },
    }
    if skipped or refused:
        return {**out, "skipped": skipped, "error": refused}
    fs = os.statvfs(folder)
    out.update(free_bytes=fs.f_bavail * fs.f_frsize, total_bytes=fs.f_blocks * fs.f_frsize)
    if out["free_bytes"] < max_bytes + HEADROOM_BYTES:
        return {
            **out,
            "refused": f"{folder} has {out['free_bytes'] / 2**30:.1f} GiB free, less than the test file "
            f"({max_bytes / 2**30:g} GiB) and {HEADROOM_BYTES >> 30} GiB to spare: not written, the drive is full",
        }
    fio = shutil.which("fio")
    path = os.path.join(folder, f".gpufleet-disk-{os.getpid()}.tmp")
    watch = IoWatch(folder, host_watch.current().io_mib_s)
    out.update(device=watch.device, tool="fio" if fio else "O_DIRECT threads")
    out["method"]["how"] = (
        f"fio --direct=1 --ioengine=libaio --iodepth={FIO_DEPTH} --bs={BLOCK}"
        if fio
        else f"{THREADS} threads, one O_DIRECT request each in flight (pwrite, preadv), each block timed"
    )
    try:
        written = None
        for phase in ("write", "read"):
            watch.start()
            if fio:
                got = _fio_phase(fio, path, phase == "write", written or max_bytes, seconds)
                samples = got["samples_gbps"] or [got["bytes"] / got["seconds"] / 1e9]
                out["tool"] = f"fio {got.get('version') or ''}".strip()
            else:
                got = _own_phase(path, phase == "write", max_bytes, seconds, written or max_bytes)
                samples = _samples(got["ends"], got["seconds"])
            written = written or got["bytes"]
            io = watch.stop(got["bytes"], phase)
            gbps = got["bytes"] / got["seconds"] / 1e9 if got["seconds"] else None
            out[phase] = {
                "gbps": significant(gbps) if gbps else None,
                "samples_gbps": summarize(samples),
                "bytes": got["bytes"],
                "seconds": round(got["seconds"], 3),
                "io": io,
            }
    except OSError as exc:
        out["error"] = f"{exc.strerror or exc} ({path})" if isinstance(exc, OSError) and exc.strerror else str(exc)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    out["foreign"] = watch.foreign()
    return out
