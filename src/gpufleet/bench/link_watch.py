"""The PCIe links of the NICs, the GPUs and the ports above them, read while a benchmark loads them.

An idle link may lower its speed on purpose (a GPU drops to 2.5 GT/s between kernels), so a link is judged by the
best it trained to while the node's benchmarks ran: every `interval_s` its speed and width are read
(collect.host.pcie_link_states) and the highest of each kept, with how many reads saw it below its maximum. GpuMonitor
runs one beside every step; checks.pcie_links judges what all of them saw.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpufleet.collect.host import pcie_link_states


class LinkWatch:
    """`start()`, a thread reads every `interval_s`, `stop()`, `summary()`. Never raises: a link that cannot be
    read keeps its reason."""

    def __init__(self, interval_s: float = 1.0, root: str = "/", links: list[dict] | None = None):
        self.interval_s, self.root = interval_s, Path(root)
        self.error: str | None = None
        try:
            self.links = pcie_link_states.links_of(root) if links is None else links
        except Exception as exc:  # the sampler must not take the benchmark down
            self.links, self.error = [], f"PCIe links not listed: {type(exc).__name__}: {exc}"
        self.seen: dict[str, dict] = {}
        self.samples = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        t = round(time.monotonic() - self._t0, 1)
        try:
            now = pcie_link_states.read(self.root, self.links)
        except Exception as exc:
            self.error = self.error or f"PCIe links not read: {type(exc).__name__}: {exc}"
            return
        self.samples += 1
        for link in self.links:
            reading, best = now[link["bdf"]], self.seen.setdefault(link["bdf"], {"reads": 0, "below_reads": 0})
            if "error" in reading:
                best.setdefault("error", reading["error"])
                continue
            best["reads"] += 1
            gen_max, width_max = link["max_gen"] or 0, link["max_width"] or 0
            best["below_reads"] += reading["gen"] < gen_max or reading["width"] < width_max
            if reading["gen"] > (best.get("gen") or 0):  # each at its best: a link is judged by the most it reached
                best.update(gen=reading["gen"], speed=reading["speed"], gen_t_s=t)
            if reading["width"] > (best.get("width") or 0):
                best.update(width=reading["width"], width_t_s=t)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self, t0: float | None = None) -> "LinkWatch":
        self._t0 = time.monotonic() if t0 is None else t0
        if self.links:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="link-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None
            self.sample()  # the last word

    def summary(self) -> dict:
        """{"interval_s", "samples", "error", "links": [plan entry + "best": {"gen", "width", "speed", "gen_t_s",
        "width_t_s" (when each was first seen), "reads", "below_reads" (reads below the maximum), "error"}]}."""
        return {
            "interval_s": self.interval_s,
            "samples": self.samples,
            "error": self.error,
            "links": [{**link, "best": self.seen.get(link["bdf"], {"reads": 0})} for link in self.links],
        }
