"""Read NVIDIA Xid events from the kernel log.

read(root="/") returns

    {"source": "/dev/kmsg" | "dmesg" | "journalctl -k -b" | "<root>/dev/kmsg",
     "readable": bool, "error": str | None, "lines": int,
     "xid_events": [{"pci": "0000:18:00", "xid": 79, "message": "NVRM: Xid (PCI:0000:18:00): 79, ..."}],
     "machine_checks": {"events": [{"cpu", "bank", "status", "uncorrected", ...}], "logged_lines": n}}
     (collect.machine_checks)

On a live host ("/") it reads the kernel ring buffer through /dev/kmsg without
blocking (needs root or kernel.dmesg_restrict=0), then falls back to `dmesg`
and to `journalctl -k -b`; when all fail, readable is False and error holds
every reason. Any other root means a test tree: <root>/dev/kmsg is read as a
plain text file, one kmsg record ("6,1234,5678,-;message") or plain message a
line. It never raises.

The ring buffer holds this boot only (and may have wrapped on a chatty host):
an Xid from before the last reboot is not seen.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

from gpufleet.collect import machine_checks

# "NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus."
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.\d)?\): (\d+)")
# kmsg record header: "priority,sequence,timestamp_us,flags;"
KMSG_HEADER_RE = re.compile(r"^\d+,\d+,\d+,[^;]*;")
COMMAND_TIMEOUT_S = 20


def parse_xid(line: str) -> dict | None:
    m = XID_RE.search(line)
    if not m:
        return None
    domain, bus, dev, code = m.groups()
    return {"pci": f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}", "xid": int(code), "message": line.strip()}


def _messages(lines) -> list[str]:
    """Message text of kmsg records (or plain lines); kmsg continuation lines (" KEY=value") dropped."""
    out = []
    for line in lines:
        if not line.strip() or line.startswith(" "):
            continue
        out.append(KMSG_HEADER_RE.sub("", line, count=1).rstrip("\n"))
    return out


def _read_kmsg() -> list[str]:
    """Every record in the ring buffer now, without waiting for new ones."""
    records = []
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except BlockingIOError:  # EAGAIN: caught up with the buffer
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading; go on
                    continue
                raise
            if not chunk:
                break
            records.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    return records


def _run(argv: list[str]) -> list[str]:
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}")
    return proc.stdout.splitlines()


def _result(source: str, lines: list[str] | None, error: str | None) -> dict:
    if lines is None:
        return {
            "source": source,
            "readable": False,
            "error": error,
            "lines": 0,
            "xid_events": [],
            "machine_checks": machine_checks.parse([]),
        }
    messages = _messages(lines)
    events = [e for e in map(parse_xid, messages) if e]
    return {
        "source": source,
        "readable": True,
        "error": None,
        "lines": len(messages),
        "xid_events": events,
        "machine_checks": machine_checks.parse(messages),
    }


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"no answer in {COMMAND_TIMEOUT_S} s"
    return str(exc) or type(exc).__name__


def read(root: str = "/") -> dict:
    if os.path.abspath(root) != "/":
        path = Path(root) / "dev" / "kmsg"
        try:
            return _result(str(path), path.read_text(errors="replace").splitlines(), None)
        except OSError as exc:
            return _result(str(path), None, f"{path}: {_why(exc)}")

    reasons = []
    for source, reader in (
        ("/dev/kmsg", _read_kmsg),
        ("dmesg", lambda: _run(["dmesg"])),
        ("journalctl -k -b", lambda: _run(["journalctl", "-k", "-b", "--no-pager", "-o", "cat"])),
    ):
        try:
            lines = reader()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            reasons.append(f"{source}: {_why(exc)}")
            continue
        if _messages(lines):
            return _result(source, lines, None)
        # A running kernel always has messages: none means we see a filtered or foreign log.
        reasons.append(f"{source}: no kernel messages")
    return _result("none", None, "kernel log unreadable: " + "; ".join(reasons))
