"""ansible-runner's event stream turned into where every node stands.

Each event of the playbook (ansible-runner's awx_display callback: playbook_on_task_start, runner_on_start,
runner_on_ok, ...) names the task, its module (resolved_action), the task file and the host. `classify()` maps
a task to a stage of the run and the check or benchmark under way; `FleetState.apply()` keeps, per node, its
stage, what it is doing, when it started and the worst verdict of the results seen so far (the modules return
host documents, so the statuses are in the events). Nothing here talks to Ansible: recorded events replay.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from gpufleet.base import registry, schema

# In the order a node goes through them; the progress bar counts a node's place in it.
STAGES = (
    "waiting",
    "reach",
    "lock",
    "checks",
    "counters",
    "benchmarks",
    "record",
    "cross-node",
    "fine-tune",
    "locate",
    "release",
    "report",
    "done",
)
CHECK_MODULES = registry.group_names()  # each check group's module is named after it
# Task files of the role whose tasks are a stage of their own, whatever the module.
STAGE_FILES = {
    "nccl_multinode": "cross-node",
    "finetune_multinode": "fine-tune",
    "locate": "locate",
    "lock_take": "lock",
    "release": "release",
}
# The task file of a job across nodes, which both runs across nodes share: its stage is the job's (fine-tune or not).
JOB_FILE = "job_across_nodes"
# Worst first for the "so far" column; unreachable is worse than any result.
_RANK = {
    "unreachable": 7,
    schema.ERROR: 6,
    schema.FAIL: 5,
    schema.WARN: 4,
    schema.INFO: 3,
    schema.PASS: 2,
    schema.SKIP: 1,
}
FINAL_EVENT = "playbook_on_stats"


def _suffix(task: str) -> str:
    """What a task name says after its colon: 'Run the benchmarks inside the node: matmul, nccl' -> 'matmul, nccl'."""
    return task.split(": ", 1)[1].strip() if ": " in task else ""


def _across(task: str) -> str:
    """What a task of a run across nodes starts: 'NCCL: a, b', 'training: a, b'; '' for its helper tasks."""
    members = _suffix(task)
    if not members or "{{" in members:
        return ""
    for word, what in (("NCCL", "NCCL"), ("training", "training"), ("fine-tune", "fine-tune")):
        if word in task:
            return f"{what}: {members}"
    return members


def classify(event_data: dict) -> tuple[str | None, str]:
    """(stage, what is under way) of a task, or (None, "") for tasks that are no stage of their own."""
    action = event_data.get("resolved_action") or event_data.get("task_action") or ""
    short = action.rsplit(".", 1)[-1]
    task = event_data.get("task") or ""
    path = (event_data.get("task_path") or "").rsplit(":", 1)[0]
    stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    in_role = "/tasks/" in path  # the playbooks' own tasks run on the controller
    if in_role and stem == JOB_FILE:  # its names are the caller's: "Start NCCL across the nodes at once: a, b"
        if "{{" in task:  # not templated yet: the stage from the module alone
            return {"finetune": "fine-tune", "benchmark": "cross-node"}.get(short), ""
        if (
            "of the round" in task
        ):  # a localisation round's group run (locate_round.yml): FleetState.describe says which
            return "locate", ""
        return ("fine-tune" if short == "finetune" or "fine-tune" in task else "cross-node"), _across(task)
    for prefix, stage in STAGE_FILES.items():
        if in_role and stem.startswith(prefix) and stem != "locate_report":
            if stage == "locate":  # which round and partner: FleetState.describe says, from locate.json
                return stage, ""
            return stage, _across(task)
    if short == "ping":
        return "reach", ""
    if short in ("node_lock", "node_take"):
        return "lock", ""
    if short == "node_validate":  # the whole node stage in one task, the lock first: its lines say what follows
        return "lock", ""
    if short in CHECK_MODULES:
        return "checks", short
    if short == "gpu_counters":
        return "counters", "after" if "after" in task else "before"
    if short == "benchmark":
        which = _suffix(task)
        return "benchmarks", which if which and "{{" not in which else ""
    if short in ("finetune",):
        return "fine-tune", ""
    if short == "host_record":  # on the controller, one node after another: the write-back
        return "record", "writing its host document"
    if short == "fleet_report":
        return "report", ""
    return None, ""


def status_counts(res: dict | None) -> dict[str, int]:
    """How many results of each status a task returned: a host document under `gpufleet`, or node_validate's own
    count (`status_counts`: it keeps the documents on the controller)."""
    res = res or {}
    if isinstance(res.get("status_counts"), dict):
        return {k: v for k, v in res["status_counts"].items() if isinstance(v, int)}
    docs = [res.get("gpufleet")]
    counts: dict[str, int] = {}
    for doc in docs:
        for r in doc.get("results") or [] if isinstance(doc, dict) else []:
            if isinstance(r, dict):
                counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
    return counts


# The lines node_validate prints as a node goes, with the statuses of what it measured so far:
# "[HOST] gpufleet: checks: gpu_inventory, gpu_health, host_hygiene | error=1 pass=40", "[HOST] gpufleet: benchmarks: matmul".
STAGE_LINE = re.compile(
    r"^\[(?P<host>[^\]]+)\] gpufleet: (?P<stage>[a-z-]+)(?:: (?P<what>[^|]*?))?(?: \| (?P<counts>[a-z]+=\d+(?: [a-z]+=\d+)*))?$"
)


@dataclass
class NodeState:
    host: str
    role: str = "node"  # or "peer": joins the runs across nodes only
    stage: str = "waiting"
    activity: str = ""
    started: float | None = None
    ended: float | None = None
    counts: dict = field(default_factory=dict)
    unreachable: bool = False
    final: str | None = None  # from report.json at the end: accepted, not accepted, or why there is none

    def so_far(self) -> str:
        if self.final:
            return self.final
        if self.unreachable:
            return "unreachable"
        if not self.counts:
            return "-"
        return max(self.counts, key=lambda s: _RANK.get(s, 0))

    def elapsed_s(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or now) - self.started

    def progress(self) -> float:
        """Where the node is, 0 to 1, by its place in STAGES."""
        return STAGES.index(self.stage) / (len(STAGES) - 1) if self.stage in STAGES else 0.0

    def key(self) -> tuple:
        """What a change in is worth a line in the plain view."""
        return (self.stage, self.activity, self.so_far())


@dataclass
class Failure:
    host: str
    task: str
    msg: str
    node_play: bool


class FleetState:
    """Every node of the run and where it stands; `apply(event)` returns the hosts whose state changed."""

    def __init__(self, hosts: list[str], peers: list[str] | None = None, clock=time.monotonic):
        self.clock = clock
        self.nodes: dict[str, NodeState] = {h: NodeState(h) for h in hosts}
        for p in peers or []:
            self.nodes.setdefault(p, NodeState(p, role="peer"))
        self.phase = "starting"
        self.failures: list[Failure] = []
        self.finished = False
        self.started = clock()
        self.tasks_seen = 0
        # A task's start waits here until it is seen to run: a task whose condition skips it reports a start too.
        self.pending: dict[str, tuple] = {}
        # describe(host) -> what the node does now, for stages whose tasks do not say it (locate: its round).
        self.describe = None

    def node(self, host: str | None) -> NodeState | None:
        return self.nodes.get(host) if host else None

    def apply(self, event: dict) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        now = self.clock()
        if kind == "playbook_on_play_start":
            self.phase = data.get("play") or data.get("name") or self.phase
            return ["run"]
        if kind == FINAL_EVENT:
            # The verdicts come from the report (finish()); the lines wait for them.
            self.finished = True
            self.pending.clear()
            for n in self.nodes.values():
                if n.started is not None and n.ended is None:
                    n.ended = now
            return []
        if kind == "verbose":
            line = STAGE_LINE.match((event.get("stdout") or "").strip())
            n = self.node(line.group("host")) if line else None
            if n is None or line.group("stage") not in STAGES:
                return []
            before = n.key()
            self.pending.pop(n.host, None)  # its task is under way: the start it reported must not come after this
            n.stage, n.activity = line.group("stage"), (line.group("what") or "").strip()
            if line.group("counts"):  # what the node measured so far, in place of what the events counted
                n.counts = {k: int(v) for k, v in (pair.split("=") for pair in line.group("counts").split())}
            return [n.host] if n.key() != before else []
        host = data.get("host")
        stage, activity = classify(data)
        if kind == "playbook_on_task_start":
            self.tasks_seen += 1
            if stage == "report":
                changed = []
                for n in self.nodes.values():
                    if n.stage != "report":
                        n.stage, n.activity = "report", ""
                        changed.append(n.host)
                return changed
            return []
        n = self.node(host)
        if kind.startswith("runner_on_failed") or kind.startswith("runner_item_on_failed"):
            res = data.get("res") or {}
            if not data.get("ignore_errors"):
                self.failures.append(
                    Failure(
                        host or "",
                        data.get("task") or "",
                        str(res.get("msg") or "")[:2000],
                        node_play=n is not None and stage is not None,
                    )
                )
        if n is None:
            return []
        before = n.key()
        uuid = data.get("task_uuid")
        if kind == "runner_on_start":
            if stage is not None:
                if n.started is None:
                    n.started = now
                self.pending[n.host] = (stage, activity, uuid, now)
            return []
        pending = self.pending.get(n.host)
        if pending and pending[2] == uuid:
            del self.pending[n.host]
            if kind != "runner_on_skipped":
                self._commit(n, pending)
        if kind == "runner_on_unreachable":
            n.unreachable = True
            n.counts[schema.ERROR] = n.counts.get(schema.ERROR, 0) + 1
        elif kind == "runner_on_ok" and (data.get("resolved_action") or "").endswith(".node_validate"):
            # Its count is the whole host document's: it replaces what its lines said so far.
            n.counts = {s: c for s, c in status_counts(data.get("res")).items() if s in _RANK}
            n.stage, n.activity = "record", "host document written"
            n.unreachable = n.unreachable or bool((data.get("res") or {}).get("node_lost"))
        elif kind in ("runner_on_ok", "runner_on_failed"):
            for status, count in status_counts(data.get("res")).items():
                if status in _RANK:
                    n.counts[status] = n.counts.get(status, 0) + count
            if kind == "runner_on_failed" and stage is not None and not data.get("ignore_errors"):
                # The role turns a module that could not answer into an error result.
                n.counts[schema.ERROR] = n.counts.get(schema.ERROR, 0) + 1
        return [n.host] if n.key() != before else []

    @staticmethod
    def _commit(n: NodeState, pending: tuple) -> None:
        stage, activity = pending[0], pending[1]
        if stage == n.stage and not activity:
            return  # a helper task of the same stage: keep what is under way
        n.stage, n.activity = stage, activity

    def tick(self, min_age_s: float = 0.2) -> list[str]:
        """Show the tasks that started a while ago and were not skipped; the hosts whose state changed."""
        now = self.clock()
        changed = []
        for host, pending in list(self.pending.items()):
            if now - pending[3] >= min_age_s:
                del self.pending[host]
                n = self.nodes[host]
                before = n.key()
                self._commit(n, pending)
                if n.key() != before:
                    changed.append(host)
        if self.describe is not None:
            for n in self.nodes.values():
                if n.stage == "locate":
                    what = self.describe(n.host)
                    if what and what != n.activity:
                        n.activity = what
                        if n.host not in changed:
                            changed.append(n.host)
        return changed

    def finish(self, finals: dict[str, str]) -> None:
        """The verdicts of the report (or why there is none) once the playbook is over."""
        now = self.clock()
        for host, final in finals.items():
            n = self.nodes.get(host)
            if n is None:
                n = self.nodes[host] = NodeState(host)
            n.final = final
            if n.started is not None and n.ended is None:
                n.ended = now
            n.stage, n.activity = "done", ""

    def progress(self) -> float:
        return sum(n.progress() for n in self.nodes.values() if n.role == "node")

    def total(self) -> int:
        return sum(1 for n in self.nodes.values() if n.role == "node")
