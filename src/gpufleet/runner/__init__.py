"""The fleet runner: the collection's playbooks through ansible-runner, with a live view, resume and locate.

    from gpufleet import runner
    out = runner.fleet_run("inventory/site", tier="acceptance")          # validate.yml over gpu_nodes
    out = runner.fleet_accept(["node7"], peers=["node1"], inventory=...)  # a replaced node, node1 joining NCCL
    plan, out = runner.fleet_resume("20261123T100000Z", reports_dir="reports")
    out = runner.fleet_locate("inventory/site", method="auto")           # locate.yml: the slow node or link
    out.exit   # 0 accepted (locate: nothing slow), 1 not accepted (locate: found), 2 could not run, 130 interrupted

`gpufleet fleet run|accept|resume|locate` (runner/cli.py) is the same on the command line. The playbooks stay
what `ansible-playbook validate.yml` runs; the runner only drives them (core.py, one playbook run of a run:
invocation.py), says how each ended (ending.py), turns their events into the live view (events.py,
live_view.py), keeps its record and ansible-runner's artifacts under the run folder's runner/
(record.py), and decides what a resume runs again (resume.py).
"""

from __future__ import annotations

from gpufleet.runner.api import fleet_accept, fleet_locate, fleet_resume, fleet_run, parse_extra_vars
from gpufleet.runner.invocation import (
    EXIT_ACCEPTED,
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_NOT_ACCEPTED,
    Invocation,
    Outcome,
)

__all__ = [
    "fleet_run",
    "fleet_accept",
    "fleet_resume",
    "fleet_locate",
    "parse_extra_vars",
    "Invocation",
    "Outcome",
    "EXIT_ACCEPTED",
    "EXIT_NOT_ACCEPTED",
    "EXIT_COULD_NOT_RUN",
    "EXIT_INTERRUPTED",
]
