"""The host's load from procfs: every process's CPU time with its parent and name, whose user it is, the swap
counters, and the CPU time the hypervisor gave to others (steal). The readers never raise: an unreadable /proc is
the error they return, a process that exited while listed is left out."""

from __future__ import annotations

import os
import pwd

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def parse_stat(text: str) -> dict | None:
    """One /proc/<pid>/stat line -> {"name", "ppid", "kernel", "ticks" (utime + stime, clock ticks), "threads" (the
    most cores it can use at once), "start_ticks" (the process's start after boot: with the pid, who it is)}; None
    when it is not such a line."""
    head, sep, rest = text.rpartition(")")  # the name may hold spaces and brackets
    fields = rest.split()
    if not sep or "(" not in head or len(fields) < 20:
        return None
    # After the name: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime cutime
    # cstime priority nice num_threads itrealvalue starttime (proc(5)).
    try:
        return {
            "name": head.partition("(")[2],
            "ppid": int(fields[1]),
            "kernel": bool(int(fields[6]) & PF_KTHREAD),
            "ticks": int(fields[11]) + int(fields[12]),
            "threads": int(fields[17]),
            "start_ticks": int(fields[19]),
        }
    except ValueError:
        return None


def processes(proc_root: str = "/proc") -> dict[int, dict]:
    """pid -> parse_stat() of every process in /proc; OSError when /proc itself cannot be listed."""
    out = {}
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry.name}/stat") as f:
                stat = parse_stat(f.read())
        except OSError:  # exited while listed
            continue
        if stat is not None:
            out[int(entry.name)] = stat
    return out


def descendants(root_pid: int, procs: dict[int, dict]) -> set[int]:
    """root_pid and every process below it, from the parents in `procs` (processes())."""
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p["ppid"], []).append(pid)
    tree, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def ancestors(pid: int, procs: dict[int, dict]) -> set[int]:
    """The processes above `pid` (its parent, theirs, ...), init (pid 1) left out: init is no run's."""
    out, p = set(), procs.get(pid)
    while p is not None and p["ppid"] > 1 and p["ppid"] not in out:
        out.add(p["ppid"])
        p = procs.get(p["ppid"])
    return out


def owner(pid: int, proc_root: str = "/proc") -> int | None:
    """The uid a process runs as (its /proc folder's owner), or None once it is gone."""
    try:
        return os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        return None


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (a container's): the number names it
        return str(uid)


def environ_has(pid: int, entry: bytes, proc_root: str = "/proc") -> bool:
    """Whether a process's environment holds `entry` (b"NAME=value"); False where this user may not read it (another
    user's process, unless root)."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def parse_vmstat(text: str) -> dict:
    """/proc/vmstat's swap counters: {"pswpin", "pswpout"} (pages swapped in and out since boot; None when absent)."""
    out: dict = {"pswpin": None, "pswpout": None}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in out and value.strip().isdigit():
            out[key] = int(value)
    return out


def _read(path: str, parse, whole, lacking: str) -> tuple:
    """(parse() of the file's text, None) where whole(it) says it holds what is asked; else (None, why)."""
    try:
        with open(path) as f:
            value = parse(f.read())
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    return (value, None) if whole(value) else (None, f"{path} has no {lacking}")


def read_swap(proc_root: str = "/proc") -> tuple[dict | None, str | None]:
    """(parse_vmstat() of /proc/vmstat, None), or (None, why)."""
    return _read(f"{proc_root}/vmstat", parse_vmstat, lambda swap: None not in swap.values(), "pswpin/pswpout")


def parse_steal(text: str) -> int | None:
    """/proc/stat's steal: clock ticks, over all CPUs since boot, in which a virtual machine's CPUs were ready to run
    and the hypervisor ran something else (the 8th figure of the `cpu` line, proc(5)); None where the line lacks it."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            return int(fields[8]) if len(fields) > 8 and fields[8].isdigit() else None
    return None


def read_steal(proc_root: str = "/proc") -> tuple[int | None, str | None]:
    """(parse_steal() of /proc/stat, None), or (None, why)."""
    return _read(f"{proc_root}/stat", parse_steal, lambda steal: steal is not None, "steal figure")
