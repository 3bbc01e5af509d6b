"""The small readers every host reading shares: a text file, an integer, a CPU list, a link's target, a folder."""

from __future__ import annotations

import os
from pathlib import Path


def read_text(path: Path) -> tuple[str | None, str | None]:
    """(stripped text, None) or (None, reason)."""
    try:
        return path.read_text(errors="replace").strip(), None
    except FileNotFoundError:
        return None, f"{path}: not present"
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def parse_int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def parse_cpulist(text: str | None) -> list[int]:
    """The kernel's CPU list, '0-55,112-167' -> [0, ..., 55, 112, ..., 167]; '' (a NUMA node of memory alone) -> []."""
    cpus: list[int] = []
    for part in (text or "").strip().split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit():
            cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def listdir(path: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None
