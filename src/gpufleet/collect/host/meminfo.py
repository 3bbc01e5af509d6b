"""The host's memory as a job would get it: /proc/meminfo's total and available memory, the free huge pages (kept
aside for jobs, so not in MemAvailable), and the processes holding the most resident memory, named.

    {"total_kib", "available_kib", "hugepages_free_kib", "reason": why unread (None when read),
     "largest": [{"pid", "name", "user", "rss_kib"}]}   the TOP_N biggest resident sets, biggest first
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.collect.host.files import read_text
from gpufleet.collect.host.load import user_name

TOP_N = 5


def parse_meminfo(text: str) -> dict:
    """`Name:  123 kB` lines -> {name: kiB (or a count for HugePages_*)}."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def largest(proc: Path, n: int = TOP_N) -> list[dict]:
    """The n processes with the largest resident set (statm's second field, in pages), named by comm and user."""
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    sizes = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        text, _ = read_text(proc / entry.name / "statm")
        fields = (text or "").split()
        if len(fields) > 1 and fields[1].isdigit():
            sizes.append((int(fields[1]) * page_kib, int(entry.name)))
    out = []
    for rss_kib, pid in sorted(sizes, reverse=True)[:n]:
        try:
            uid = os.stat(proc / str(pid)).st_uid
        except OSError:  # exited since
            continue
        out.append(
            {"pid": pid, "name": read_text(proc / str(pid) / "comm")[0], "user": user_name(uid), "rss_kib": rss_kib}
        )
    return out


def read_meminfo(root: Path) -> dict:
    text, why = read_text(root / "proc/meminfo")
    if text is None:
        return {"reason": why}
    info = parse_meminfo(text)
    if "MemTotal" not in info or "MemAvailable" not in info:
        return {"reason": f"{root / 'proc/meminfo'}: no MemTotal or MemAvailable line"}
    try:
        top = largest(root / "proc")
    except OSError as exc:
        top = [{"error": f"{root / 'proc'}: {exc.strerror or exc}"}]
    return {
        "total_kib": info["MemTotal"],
        "available_kib": info["MemAvailable"],
        "hugepages_free_kib": info.get("HugePages_Free", 0) * info.get("Hugepagesize", 0),
        "reason": None,
        "largest": top,
    }
