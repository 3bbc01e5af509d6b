"""Waits on events, for tests that must hold on a busy machine (two shared cores, other test runs beside).

A test waits for what it needs to see, polled with a generous deadline, never for a fixed time: on a quiet
machine the wait ends at once, on a busy one it lasts as long as it must.

Processes a test run starts carry MARK in their environment (set below, inherited by everything they start),
so a test that looks for what was left running finds its own processes, not those of another test run on this
machine that runs the same programs.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

MARK = "TESTRUN_OF_GPUFLEET"
os.environ.setdefault(MARK, uuid.uuid4().hex)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.3):
    """Poll `predicate` until it returns something true; its value, or AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(interval_s)


def own_processes(pattern: str) -> list[str]:
    """'pid command line' of each running process of this test run whose command line matches `pattern`."""
    needle = f"{MARK}={os.environ[MARK]}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if not re.search(pattern, cmdline) or needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not reaped yet
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(f"{entry.name} {cmdline}")
    return found


def left_running(pattern: str, timeout_s: float = 60) -> list[str]:
    """The processes of this test run matching `pattern` still there after up to `timeout_s` (killed ones take a
    moment to go on a busy machine); empty once they are gone."""
    deadline = time.monotonic() + timeout_s
    while (left := own_processes(pattern)) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left
