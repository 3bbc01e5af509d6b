"""Headless Chromium driven over its DevTools protocol, for the report's browser tests (tests/test_report_browser.py).

No extra package: Chromium is started with --remote-debugging-pipe, which speaks the protocol as NUL-separated JSON
messages on file descriptors 3 (its commands) and 4 (its answers and events). Every wait is on a message from the
browser (an answer, Page.loadEventFired); the timeouts only bound a browser that hangs.

Debian's `chromium` (scripts/system-deps.sh installs it for the tests). Started as root it needs --no-sandbox;
the other flags keep it off the network (no background requests, no component updates, no QUIC) and a fresh
--user-data-dir keeps runs apart.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)
TIMEOUT_S = 120.0  # a browser that has not answered by then hangs


def find() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _high(fd: int) -> int:
    """The same pipe end at 10 or above, so that the shell can put it at 3 or 4 without clobbering another."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    """One Chromium, one page: `open(path, width)` loads a file and waits for its load event; `evaluate()`,
    `screenshot()`; `console_errors` and `requests` gather what the page did."""

    def __init__(self, binary: str, log_dir: Path):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=log_dir)
        commands_r, self._commands = map(_high, os.pipe())
        self._answers, answers_w = map(_high, os.pipe())
        self.stderr = open(Path(log_dir) / "chromium.stderr", "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{commands_r} 4>&{answers_w}', "bash", binary, *FLAGS,
             f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(commands_r, answers_w),
            stdin=subprocess.DEVNULL,
            stdout=self.stderr,
            stderr=self.stderr,
        )  # fmt: skip
        os.close(commands_r)
        os.close(answers_w)
        self._buf, self._id, self.events = b"", 0, []
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    # ------------------------------------------------------------ the protocol

    def _next(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._answers], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"chromium did not answer in {TIMEOUT_S:g} s")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise EOFError(f"chromium exited ({self.proc.poll()}); its output: {self.stderr.name}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        self._note(msg)
        return msg

    def _note(self, msg: dict) -> None:
        """What the page did: console errors, uncaught exceptions, errors the browser logged, every request."""
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            self.console_errors.append(str(params["exceptionDetails"].get("text")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.console_errors.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])

    def call(self, method: str, session: bool = False, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._commands, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            answer = self._next(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result") or {}
            self.events.append(answer)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == self.session:
                return self.events.pop(i)
        while True:
            event = self._next(deadline)
            if event.get("method") == method and event.get("sessionId") == self.session:
                return event
            self.events.append(event)

    # ------------------------------------------------------------ the page

    def open(self, path: Path, width: int = 1400, height: int = 1000) -> None:
        """Load a file in a window `width` pixels wide and wait for its load event."""
        self.events.clear()
        self.console_errors.clear()
        self.requests.clear()
        self.call(
            "Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1,
            mobile=False,
        )  # fmt: skip
        self.call("Page.navigate", session=True, url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str, await_promise: bool = False):
        answer = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=await_promise
        )
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self, path: Path, clip: dict | None = None) -> Path:
        """A PNG of the page (the whole of it when no clip), written to path."""
        if clip is None:
            size = self.evaluate(
                "({width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight})"
            )
            clip = {"x": 0, "y": 0, **size}
        shot = self.call(
            "Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True, clip={**clip, "scale": 1}
        )
        Path(path).write_bytes(base64.b64decode(shot["data"]))
        return Path(path)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (EOFError, OSError, TimeoutError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._commands, self._answers):
            os.close(fd)
        self.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)
