"""The gpufleet command line run in a process forked from the test's own, with what it was given and what it did:
its exit code, stdout and stderr, and (with `audit`) every file it opened, renamed or removed, from Python's audit
events. A fork costs milliseconds where a new interpreter costs a second of imports, and a command that hangs (on a
FIFO, say) is killed at `timeout_s`, which only a process of its own allows: the matrices of tests/test_file_faults.py
and tests/test_cli_every_command.py run hundreds of commands through it.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpufleet.commands import main as cli

# The audit events of what a command does to files: (event, the index of each path among the event's arguments).
AUDITED = {"open": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.link": (0, 1)}
# Linux capabilities that let root read and write whatever a file's mode says (capabilities(7)).
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


@dataclass
class Cell:
    argv: list[str]
    rc: int | None  # None: killed at the timeout
    out: str
    err: str
    touched: list[tuple[str, str, str]] = field(default_factory=list)  # (event, path, mode or "")

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def lines(self, stream: str = "err") -> list[str]:
        return (self.err if stream == "err" else self.out).splitlines()


def drop_file_capabilities() -> None:
    """This process, as root, gives up reading and writing past a file's mode (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH, from its effective and permitted sets): a file of mode 000 is unreadable to it as to any
    user. OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two words of bits
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    mask = ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= mask
    data[0].permitted &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _child(argv, cwd, stdin, folder, audit, before, env, stdout_closed) -> None:
    try:
        os.chdir(cwd)
        os.environ.update(env or {})
        for fd, name, flags in ((0, "stdin", os.O_RDONLY), (1, "out", os.O_WRONLY), (2, "err", os.O_WRONLY)):
            path = folder / name
            if fd == 0:
                path.write_bytes(stdin or b"")
            target = os.open(path, flags | (os.O_CREAT | os.O_TRUNC if fd else 0), 0o600)
            os.dup2(target, fd)
            os.close(target)
        if stdout_closed:  # a pipe whose reader is gone, as `gpufleet ... | head` leaves it once head has read enough
            reader, writer = os.pipe()
            os.close(reader)
            os.dup2(writer, 1)
            os.close(writer)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        touched: list = []
        if audit:

            def hook(event, args):
                if event in AUDITED:
                    for i in AUDITED[event]:
                        if isinstance(args[i], (str, bytes, os.PathLike)):
                            mode = str(args[1]) if event == "open" and len(args) > 1 else ""
                            touched.append((event, os.fsdecode(args[i]), mode))

            sys.addaudithook(hook)
        if before is not None:
            before()
        rc = cli.main(argv)
        if audit:
            (folder / "touched.json").write_text(json.dumps(touched))
    except SystemExit as exc:  # argparse's ending, --help, --version
        rc = exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
    except BaseException:  # an uncaught exception ends the command as the interpreter would: its traceback, 1
        traceback.print_exc()
        rc = 1
    try:
        try:
            sys.stdout.flush()
        except BrokenPipeError:  # what the interpreter says and does when stdout's last flush fails at its exit
            print(
                "Exception ignored while flushing sys.stdout:\nBrokenPipeError: [Errno 32] Broken pipe", file=sys.stderr
            )
            rc = 120
        sys.stderr.flush()
    finally:
        os._exit(rc if isinstance(rc, int) else 1)


def run(
    argv: list[str],
    *,
    cwd: Path,
    folder: Path,
    stdin: bytes | None = None,
    timeout_s: float = 60,
    audit: bool = False,
    before: Callable[[], None] | None = None,
    env: dict | None = None,
    stdout_closed: bool = False,
) -> Cell:
    """`gpufleet ARGV` in a forked process working in cwd; its streams are kept in `folder` (made); `stdout_closed`: its
    stdout a pipe nobody reads any more."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = multiprocessing.get_context("fork").Process(
        target=_child, args=(list(argv), cwd, stdin, folder, audit, before, env, stdout_closed)
    )
    proc.start()
    proc.join(timeout_s)  # waits on the process's end, not on a clock: the timeout only bounds a hang
    rc = proc.exitcode
    if proc.is_alive():
        proc.kill()
        proc.join()
        rc = None
    touched = folder / "touched.json"
    return Cell(
        list(argv),
        rc,
        (folder / "out").read_text(errors="replace"),
        (folder / "err").read_text(errors="replace"),
        [tuple(t) for t in json.loads(touched.read_text())] if touched.exists() else [],
    )
