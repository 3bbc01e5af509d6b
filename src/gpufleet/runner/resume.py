"""Which nodes and stages of a run to run again, from what its folder holds.

Stages: `node` (reach, checks, counters, benchmarks: the results of every group but the ones below),
`multinode` (NCCL and training across the nodes: group benchmark_multinode) and `finetune` (group finetune).
A stage of a node runs again when it did not finish:
    - no host document, or one that cannot be read;
    - the node could not be reached, a module could not run on it, or another run held it;
    - the invocation that ran the stage was cut off (interrupted, its controller killed) before it wrote the
      node's document (runner/runner.json, when the runner ran it);
    - a stage the run covers has no results in the document; the node only sat out the run across nodes
      (left out, or alone), or that run did not come together;
and, unless only the unfinished are asked for, when any of its results failed or erred.
A node whose node stage runs again runs its later stages again too; their runs across nodes take the run's
nodes that finished as peers (gpufleet_peers), so nothing that finished runs again.

The plan is a list of steps, each one playbook run (one attempt of the run): `--limit` its nodes and
`gpufleet_stages` its stages. Stages are taken in order (node, multinode, finetune) and those with the same
nodes share a step, so a node whose node stage is done is never in a step that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.base import registry, runs, schema
from gpufleet.runner.record import RunFolder

STAGES = ("node", "multinode", "finetune")
CROSS_GROUPS = {"multinode": "benchmark_multinode", "finetune": "finetune"}
# Groups of the run folder that are no node's own stage.
FLEET_GROUPS = ("fleet", "locate")
# Results that say a stage did not get to run, whatever the mode.
UNFINISHED_CHECKS = ("reachable", "engine", "results_file")
UNFINISHED_GROUPS = ("connection", "lock")
BAD = (schema.FAIL, schema.ERROR)


@dataclass
class Step:
    limit: list[str]
    stages: list[str]
    peers: list[str] = field(default_factory=list)


@dataclass
class ResumePlan:
    run_id: str
    hosts: list[str]
    stages: list[str]  # the stages the run covers
    reasons: dict  # host -> {stage: why it runs again}
    finished: list[str]  # nodes whose node stage finished (peers for the runs across nodes)
    steps: list[Step]
    tier: str

    def text(self) -> str:
        if not self.steps:
            return f"run {self.run_id}: nothing to run again: every node finished every stage the run covers"
        lines = [f"run {self.run_id}: {len(self.reasons)} node(s) to run again"]
        for host, why in self.reasons.items():
            lines.append(f"  {host}: " + "; ".join(f"{stage}: {text}" for stage, text in why.items()))
        for i, step in enumerate(self.steps, 1):
            peers = f", peers {', '.join(step.peers)}" if step.peers else ""
            lines.append(f"  step {i}: --limit {','.join(step.limit)}, stages {', '.join(step.stages)}{peers}")
        return "\n".join(lines)


def _truthy(value, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "yes", "1", "on")


def _node_results(doc: dict) -> list[dict]:
    cross = set(CROSS_GROUPS.values()) | set(FLEET_GROUPS)
    return [r for r in doc.get("results", []) if isinstance(r, dict) and r.get("group") not in cross]


def _names(results: list[dict]) -> str:
    names = [f"{r.get('group')}.{r.get('check')}" for r in results]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _last_invocation(folder: RunFolder, host: str, stage: str) -> dict | None:
    """The latest runner invocation whose run covered this stage of this host."""
    for inv in reversed((folder.record or {}).get("invocations", [])):
        if inv.get("command") == "locate":
            continue
        if host in (inv.get("hosts") or []) and stage in (inv.get("stages") or STAGES):
            return inv
    return None


def _cut_off(inv: dict | None) -> bool:
    return inv is not None and (inv.get("interrupted") or not inv.get("ended"))


def node_stage_reason(folder: RunFolder, host: str, only_unfinished: bool) -> str | None:
    if host in folder.unreadable:
        return f"its host document hosts/{host}.json {folder.unreadable[host]}"
    doc = folder.docs.get(host)
    if doc is None:
        return "no host document: its node stage did not finish"
    inv = _last_invocation(folder, host, "node")
    if _cut_off(inv) and folder.mtimes.get(host, 0) < inv.get("started_epoch", 0):
        return f"invocation {inv.get('n')} was cut off before the node's document was written"
    results = _node_results(doc)
    unfinished = [
        r
        for r in results
        if r.get("status") in BAD and (r.get("check") in UNFINISHED_CHECKS or r.get("group") in UNFINISHED_GROUPS)
    ]
    if any(r.get("check") == "reachable" for r in unfinished):
        return "it could not be reached"
    if unfinished:
        return f"it did not finish ({_names(unfinished)})"
    if not results:
        return "its host document holds no results of the node stage"
    if only_unfinished:
        return None
    failed = [r for r in results if r.get("status") == schema.FAIL]
    erred = [r for r in results if r.get("status") == schema.ERROR]
    if failed or erred:
        parts = ([f"failed {_names(failed)}"] if failed else []) + ([f"erred {_names(erred)}"] if erred else [])
        return "; ".join(parts)
    return None


def cross_stage_reason(folder: RunFolder, host: str, stage: str, only_unfinished: bool) -> str | None:
    doc = folder.docs.get(host) or {}
    group = CROSS_GROUPS[stage]
    results = [r for r in doc.get("results", []) if isinstance(r, dict) and r.get("group") == group]
    if not results:
        inv = _last_invocation(folder, host, stage)
        return "it was cut off before this stage" if _cut_off(inv) else "no results of this stage in its host document"
    if stage == "multinode" and not any(
        isinstance(r.get("detail"), dict) and r["detail"].get("multinode") for r in results
    ):
        return "it sat out the run across nodes (" + (results[0].get("reason") or "no reason given")[:160] + ")"
    # The one result a run across nodes leaves when it did not come together carries the run's own name.
    run_level = {"multinode": ("nccl", "train_gpt2"), "finetune": ("finetune",)}[stage]
    broken = [r for r in results if r.get("check") in run_level and r.get("status") == schema.ERROR]
    if broken:
        return f"the run across nodes did not finish ({_names(broken)})"
    if only_unfinished:
        return None
    bad = [r for r in results if r.get("status") in BAD]
    if bad:
        return f"{'failed' if any(r.get('status') == schema.FAIL for r in bad) else 'erred'} {_names(bad)}"
    return None


def run_stages(folder: RunFolder, hostvars: dict, extravars: dict) -> tuple[list[str], str]:
    """The stages the run covers, and its tier: what its first attempt asked for, and what applies."""
    run = folder.run or {}
    first_inv = next((i for i in (folder.record or {}).get("invocations", []) if i.get("command") != "locate"), {})
    tier = run.get("tier") or (first_inv.get("extravars") or {}).get("gpufleet_tier") or registry.DEFAULT_RUN_TIER
    asked = None
    attempts = [a for a in run.get("attempts") or [] if a.get("playbook") != "locate"]
    if attempts and attempts[0].get("stages"):
        asked = list(attempts[0]["stages"])
    elif first_inv.get("stages"):
        asked = list(first_inv["stages"])
    stages = [s for s in STAGES if asked is None or s in asked]
    if not any(t.across_nodes for t in registry.RUN_TIERS if t.name == tier):  # smoke and soak stay inside each node
        stages = [s for s in stages if s == "node"]
    return stages, tier


def _var(host: str, name: str, hostvars: dict, extravars: dict):
    if name in extravars:
        return extravars[name]
    return (hostvars.get(host) or {}).get(name)


def plan(
    folder: RunFolder,
    *,
    only_unfinished: bool = False,
    hostvars: dict | None = None,
    extravars: dict | None = None,
    peers: list[str] | None = None,
) -> ResumePlan:
    """What to run again; `hostvars` and `extravars` say which nodes take part in which stage."""
    hostvars, extravars = hostvars or {}, extravars or {}
    hosts = folder.hosts()
    stages, tier = run_stages(folder, hostvars, extravars)
    peers = [p for p in (peers or []) if p not in hosts]
    wants = {
        "node": lambda h: True,
        "multinode": lambda h: (
            len(hosts) + len(peers) > 1 and _truthy(_var(h, "gpufleet_nccl_multinode", hostvars, extravars), True)
        ),
        "finetune": lambda h: _truthy(_var(h, "gpufleet_finetune", hostvars, extravars), False),
    }
    reasons: dict[str, dict] = {}
    for host in hosts:
        why = {}
        if "node" in stages:
            node_why = node_stage_reason(folder, host, only_unfinished)
            if node_why:
                why["node"] = node_why
        for stage in ("multinode", "finetune"):
            if stage not in stages or not wants[stage](host):
                continue
            if "node" in why:
                why[stage] = "runs again with its node stage"
                continue
            cross_why = cross_stage_reason(folder, host, stage, only_unfinished)
            if cross_why:
                why[stage] = cross_why
        if why:
            reasons[host] = why
    finished = [h for h in hosts if "node" not in reasons.get(h, {}) and h in folder.docs]
    steps: list[Step] = []
    for stage in STAGES:
        limit = [h for h in hosts if stage in reasons.get(h, {})]
        if not limit:
            continue
        if steps and steps[-1].limit == limit:
            steps[-1].stages.append(stage)
        else:
            steps.append(Step(limit, [stage]))
    for step in steps:
        if any(s in CROSS_GROUPS for s in step.stages):
            step.peers = [h for h in finished if h not in step.limit] + peers
    run_id = runs.run_id_of(folder.run_dir)
    return ResumePlan(run_id, hosts, stages, reasons, finished, steps, tier)
