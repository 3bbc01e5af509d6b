"""The host's own planted faults of the calibration harness (tools/gpu_disturb.py --kind memory | fill | io | memcpy,
tools/host_faults.py), run for real at small sizes: each says what it does once it is in place, names its
processes after its kind, and leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.bench import io_watch

DISTURB = Path(__file__).resolve().parents[1] / "tools" / "gpu_disturb.py"


def _disturb(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(prefix or []), sys.executable, str(DISTURB), *args], capture_output=True, text=True, timeout=300
    )


def test_io_writers_on_the_scratch_drive_are_seen_by_the_drives_watch_and_clean_up(tmp_path):
    watch = io_watch.IoWatch(str(tmp_path), limit_mib_s=1)
    if watch.device is None or io_watch.disk_counts(watch.device) is None:
        pytest.skip(f"{tmp_path} is on no block device in /proc/diskstats")
    watch.start()
    proc = _disturb("--kind", "io", "--path", str(tmp_path), "--procs", "1", "--seconds", "2")
    phase = watch.stop(own_bytes=0, phase="write")
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert "1 direct-I/O writers and readers on" in first and "time is up" in last
    assert phase["disturbed"] and phase["device_mib_s"] > 1, phase
    assert not list(tmp_path.iterdir())  # its file removed


def test_a_memory_hog_says_so_once_its_memory_is_held(tmp_path):
    proc = _disturb("--kind", "memory", "--share", "0.01", "--procs", "2", "--seconds", "1")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "2 processes hold" in first and "(1% of the host's memory) and stream through it" in first


def test_memory_copiers_say_so_and_how_fast_each_copied():
    """The neighbour of the issue's third case: processes copying memory, a core each (about 9% of the CPUs stays
    under the CPU-share limit on the machine that runs it)."""
    proc = _disturb("--kind", "memcpy", "--size", "8", "--procs", "2", "--seconds", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "2 processes copy 8 MiB buffers in memory, a core each, for 1 s (pids " in lines[0]
    rates = [line for line in lines if "GB/s copied over" in line]
    assert len(rates) == 2 and all(float(line.split(": ")[1].split()[0]) > 0 for line in rates)
    assert "time is up" in lines[-1]


def test_a_drive_filled_to_its_limit_leaves_512_mib_and_gives_it_back(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to fill a file system of its own (a tmpfs in a mount namespace)")
    # A tmpfs of 768 MiB in a mount namespace of its own: the fault fills it, never the machine's drive.
    # It runs until told to stop; the free space is read once it says it is in place, and again once it stopped.
    script = (
        'mount -t tmpfs -o size=768m none "$0" || exit 3; log=$(mktemp)\n'
        f'"{sys.executable}" "{DISTURB}" --kind fill --path "$0" --seconds 600 >"$log" 2>&1 & pid=$!\n'
        'until grep -q takes "$log" || ! kill -0 $pid 2>/dev/null; do sleep 0.1; done\n'
        'df -k --output=avail "$0" | tail -1; kill -TERM $pid; wait $pid; cat "$log"; df -k --output=avail "$0" | tail -1'
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode == 3:
        pytest.skip(f"no tmpfs in a mount namespace here: {proc.stderr.strip()[-200:]}")
    lines = proc.stdout.splitlines()
    held = [line for line in lines if "takes" in line]
    assert held and "left with 512 MiB free" in held[0], proc.stdout + proc.stderr
    avail = [int(line) for line in lines if line.strip().isdigit()]
    assert avail[0] <= 512 * 1024 + 64 and avail[-1] > 700 * 1024, avail  # full while it ran, given back after
