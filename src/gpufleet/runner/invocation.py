"""One playbook run of a run (`Invocation`: what it runs, on which nodes, with which variables) and what it
gives back (`Outcome`: the exit code, each node's final verdict, why a node was not accepted).

Exit codes: 0 every node accepted, 1 some node not accepted, 2 could not run, 130 interrupted (runner/core.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.base.errors import InputError

EXIT_ACCEPTED, EXIT_NOT_ACCEPTED, EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 130
# Variables the runner sets itself; the operator gives them through its options.
RESERVED_VARS = {
    "gpufleet_run_id": "--run-id",
    "gpufleet_reports_dir": "--reports-dir",
    "gpufleet_resume": "gpufleet fleet resume",
    "gpufleet_stages": "gpufleet fleet resume (it picks the stages)",
    "gpufleet_peers": "gpufleet fleet accept --peers",
    "gpufleet_tier": "--tier",
    "gpufleet_soak_duration_s": "--soak-duration-s",
}
ACCEPTED, NOT_ACCEPTED = "accepted", "not accepted"


@dataclass
class Invocation:
    """One playbook run of a run: what it runs and on which nodes."""

    command: str  # run, accept, resume, locate
    playbook: str  # validate, locate
    run_id: str
    reports_dir: Path
    inventory: str
    hosts: list[str]  # the nodes it covers (the limit), in inventory order
    limit: list[str] | None = None
    peers: list[str] = field(default_factory=list)
    stages: list[str] | None = None
    resume: bool = False
    user_vars: dict = field(default_factory=dict)  # -e and --tier: kept for a resume
    extra_vars: dict = field(default_factory=dict)  # playbook-specific (locate's options)

    @property
    def run_dir(self) -> Path:
        return self.reports_dir / self.run_id

    def extravars(self) -> dict:
        out = dict(self.user_vars)
        out.update(self.extra_vars)
        out["gpufleet_run_id"] = self.run_id
        out["gpufleet_reports_dir"] = str(self.reports_dir)
        if self.resume:
            out["gpufleet_resume"] = True
        if self.stages:
            out["gpufleet_stages"] = list(self.stages)
        if self.peers:
            out["gpufleet_peers"] = list(self.peers)
        return out


@dataclass
class Outcome:
    exit: int
    status: str  # ansible-runner's: successful, failed, canceled, ... or "error"
    rc: int | None
    interrupted: bool
    finals: dict  # host -> accepted / not accepted / why there is no verdict
    report: dict | None
    failures: list
    message: str = ""
    why: dict = field(default_factory=dict)  # host not accepted -> its failing checks, worst first (not_accepted_why)


def check_user_vars(user_vars: dict) -> None:
    for name, option in RESERVED_VARS.items():
        if name in user_vars:
            raise InputError(f"-e {name} is set by the runner; use {option} instead")
