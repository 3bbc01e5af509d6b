"""Showing a run while it goes: a live table on a terminal, plain timestamped lines elsewhere (CI, a pipe).

Both show one line per node: its stage, the check or benchmark under way, the time since the node started and
the worst verdict of its results so far (at the end: accepted or not accepted). The plain view writes a line
each time one of those changes, never for the clock alone, so a log stays short:

    2026-11-23T10:00:03Z  node-a  checks      gpu_inventory, gpu_health, host_hygiene      12 s  so far error
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from gpufleet.runner.events import FleetState, NodeState

# Wide enough for the check groups of one task: "gpu_inventory, gpu_health, host_hygiene".
ACTIVITY_CHARS = 40


def timestamp(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at if at is not None else time.time()))


def verdict_text(n: NodeState) -> str:
    if n.final:
        return n.final
    if n.role == "peer" and n.so_far() == "-":
        return "peer"
    return f"so far {n.so_far()}"


def node_line(n: NodeState, now: float, host_width: int) -> str:
    activity = n.activity if len(n.activity) <= ACTIVITY_CHARS else n.activity[: ACTIVITY_CHARS - 3] + "..."
    return (
        f"{n.host:<{host_width}}  {n.stage:<10}  {activity:<{ACTIVITY_CHARS}}  {n.elapsed_s(now):>5.0f} s  "
        f"{verdict_text(n)}"
    )


class PlainView:
    """One timestamped line per change; messages as they come."""

    def __init__(self, stream: TextIO | None = None, wall=time.time):
        self.stream = stream or sys.stdout
        self.wall = wall
        self.fleet: FleetState | None = None
        self.shown: dict[str, tuple] = {}

    def _write(self, text: str) -> None:
        self.stream.write(f"{timestamp(self.wall())}  {text}\n")
        self.stream.flush()

    def start(self, fleet: FleetState) -> None:
        self.fleet = fleet
        self.shown = {}

    def message(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self._write(line)

    def update(self, hosts: list[str]) -> None:
        if self.fleet is None:
            return
        if "run" in hosts:  # a new play: also the controller's own ones (giving the nodes back, the report)
            self._write(f"play: {self.fleet.phase}")
        width = max((len(h) for h in self.fleet.nodes), default=4)
        now = self.fleet.clock()
        for host in hosts:
            n = self.fleet.nodes.get(host)
            if n is None or self.shown.get(host) == n.key() + (n.final,):
                continue
            self.shown[host] = n.key() + (n.final,)
            self._write(node_line(n, now, width))

    def stop(self) -> None:
        pass


class LiveView:
    """A rich Live table with a progress bar over the nodes, redrawn a few times a second."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console()
        self.fleet: FleetState | None = None
        self.live = None
        self.title = ""

    def _render(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        fleet = self.fleet
        now = fleet.clock()
        table = Table(title=self.title or None, title_justify="left", expand=False, pad_edge=False)
        for col, kw in (
            ("node", {}),
            ("stage", {}),
            ("now", {"max_width": 40}),
            ("elapsed", {"justify": "right"}),
            ("verdict so far", {}),
        ):
            table.add_column(col, **kw)
        style = {
            "error": "red",
            "fail": "red",
            "unreachable": "red",
            "not accepted": "bold red",
            "warn": "yellow",
            "pass": "green",
            "accepted": "bold green",
        }
        for n in fleet.nodes.values():
            verdict = n.final or ("peer" if n.role == "peer" and n.so_far() == "-" else n.so_far())
            table.add_row(
                n.host,
                n.stage,
                n.activity,
                f"{n.elapsed_s(now):.0f} s",
                Text(verdict, style=style.get(verdict, style.get(verdict.split(" ")[0], ""))),
            )
        total = max(fleet.total(), 1)
        done = fleet.progress()
        bar = ProgressBar(total=total, completed=done, width=40)
        line = Text(f" {done:.1f}/{total} nodes  {fleet.phase}")
        return Group(table, bar, line)

    def start(self, fleet: FleetState) -> None:
        from rich.live import Live

        self.fleet = fleet
        self.live = Live(console=self.console, refresh_per_second=4, get_renderable=self._render, transient=False)
        self.live.start()

    def message(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text, highlight=False, markup=False)
        else:
            self.console.print(text, highlight=False, markup=False)

    def update(self, hosts: list[str]) -> None:
        pass  # redrawn by Live itself

    def stop(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None


def make_view(plain: bool | None = None, stream: TextIO | None = None):
    """The live view on a terminal, the plain one otherwise (or when asked)."""
    stream = stream or sys.stdout
    if plain is None:
        plain = not (hasattr(stream, "isatty") and stream.isatty())
    if plain:
        return PlainView(stream)
    try:
        from rich.console import Console
    except ImportError:  # rich is in the controller extra; without it, the plain lines still say everything
        return PlainView(stream)
    return LiveView(Console(file=stream))
