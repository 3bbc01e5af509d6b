"""Find the slow node or the slow link of a fleet from NCCL runs over groups of nodes, round after round.

Pure functions on one state (the document written as RUN_DIR/locate.json); the playbook
(playbooks/locate.yml) runs each round's groups at once, each under torchrun with its own master (the
group's first node) and its own port, and hands every group's all-reduce bus bandwidth back to
`record_round()`, which judges the round and plans the next one.

Methods:
    pairs   round 1 pairs every node with another (an odd node out is tested in the next round with a
            node already known good); more rounds of new pairs (round-robin) with `pair_rounds`.
    bisect  round 1 runs all-node NCCL on the two halves of the fleet at once; each round then splits the
            slow group's nodes in two and follows the slow half, so one slow node among N is found in
            about log2(N) rounds. A half of one node runs with a known-good partner.
    auto    bisect from `bisect_min_nodes` nodes, pairs below.

Judging a round: a group is slow when its figure is under `ratio` x the round's reference, or when it did not
run. The reference is the median of the round's figures (its best figure when it has fewer than three groups),
never below the reference of the round before; `reference_gbps` fixes it instead.

What a slow group means, over every round so far, and how the next round follows it up: locate_plan.py.
On the CPU the runs use gloo: the figures are not performance figures, but the logic is the same.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

from gpufleet.fleet.locate_plan import infer, observations, plan_next

SCHEMA_VERSION = 1
METHODS = ("auto", "pairs", "bisect")
# Key of files/profiles/generic.yml that holds the default ratio and its source.
RATIO_KEY = "locate_busbw_ratio_min"
DEFAULT_RATIO = 0.8
DEFAULT_BASE_PORT = 29521
DEFAULT_BISECT_MIN_NODES = 32
METRIC = "all_reduce bus bandwidth at the largest size measured (GB/s), from benchmark.nccl_all_reduce"


def default_max_rounds(n_nodes: int, pair_rounds: int = 1) -> int:
    """A bound on the rounds: the halving depth twice over, the extra pair rounds, and room for follow-ups."""
    return 2 * math.ceil(math.log2(max(n_nodes, 2))) + pair_rounds + 3


def choose_method(method: str, n_nodes: int, bisect_min_nodes: int = DEFAULT_BISECT_MIN_NODES) -> str:
    if method not in METHODS:
        raise ValueError(f"method {method!r}; expected one of {', '.join(METHODS)}")
    if n_nodes < 4:  # halves of one node each: pairs are the same runs, judged better
        return "pairs"
    if method == "auto":
        return "bisect" if n_nodes >= bisect_min_nodes else "pairs"
    return method


def start(
    nodes: list[str],
    *,
    method: str = "auto",
    ratio: float = DEFAULT_RATIO,
    ratio_source: str = "gpufleet default",
    reference_gbps: float | None = None,
    pair_rounds: int = 1,
    max_rounds: int | None = None,
    base_port: int = DEFAULT_BASE_PORT,
    bisect_min_nodes: int = DEFAULT_BISECT_MIN_NODES,
) -> dict:
    """A new localisation over `nodes` (in inventory order) with its first round planned in state["next"]."""
    if len(nodes) < 2:
        raise ValueError(f"locating a slow node needs two nodes or more; got {list(nodes)}")
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes must be distinct; got {list(nodes)}")
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio {ratio}; expected a fraction of the reference, above 0 and at most 1")
    if pair_rounds < 1:
        raise ValueError(f"pair_rounds {pair_rounds}; expected 1 or more")
    if not 0 < base_port < 65536:
        raise ValueError(f"base_port {base_port}; expected a TCP port")
    chosen = choose_method(method, len(nodes), bisect_min_nodes)
    state = {
        "schema_version": SCHEMA_VERSION,
        "nodes": list(nodes),
        "method": chosen,
        "method_asked": method,
        "metric": METRIC,
        "threshold": {"key": RATIO_KEY, "value": ratio, "source": ratio_source},
        "reference_gbps_fixed": reference_gbps,
        "pair_rounds": pair_rounds,
        "max_rounds": max_rounds or default_max_rounds(len(nodes), pair_rounds),
        "base_port": base_port,
        "rounds": [],
        "done": False,
        "next": None,
        "known_good": [],
        "suspects": [],
        "findings": [],
        "verdict": None,
        "summary": None,
    }
    return _advance(state)


# ---------------------------------------------------------------- rounds


def record_round(state: dict, figures: list[dict]) -> dict:
    """Judge the planned round with one figure per group, in the order of state["next"]["groups"].

    Each figure: {"busbw_gbps": float or None, "size_bytes": int or None, "status": "ok" or "failed",
    "reason": str or None}; a group that did not run (failed, or no figure) counts as slow.
    Returns the state with the round added and the next round planned (or the conclusion).
    """
    planned = state.get("next")
    if state["done"] or not planned:
        raise ValueError("no round is planned: the localisation is done")
    if len(figures) != len(planned["groups"]):
        raise ValueError(f"round {planned['round']} has {len(planned['groups'])} groups; got {len(figures)} figures")
    groups = []
    for g, fig in zip(planned["groups"], figures):
        value = fig.get("busbw_gbps")
        ran = fig.get("status", "ok") == "ok" and isinstance(value, (int, float)) and not isinstance(value, bool)
        groups.append(
            dict(
                g,
                busbw_gbps=value if ran else None,
                size_bytes=fig.get("size_bytes"),
                status="ok" if ran else "failed",
                reason=fig.get("reason"),
            )
        )
    values = [g["busbw_gbps"] for g in groups if g["busbw_gbps"] is not None]
    previous = state["rounds"][-1]["reference_gbps"] if state["rounds"] else None
    if state.get("reference_gbps_fixed"):
        reference = float(state["reference_gbps_fixed"])
    else:
        own = (statistics.median(values) if len(values) >= 3 else max(values)) if values else None
        reference = (
            max(x for x in (own, previous) if x is not None) if own is not None or previous is not None else None
        )
    limit = state["threshold"]["value"] * reference if reference is not None else None
    for g in groups:
        g["slow"] = g["busbw_gbps"] is None or limit is None or g["busbw_gbps"] < limit
    rec = {
        "round": planned["round"],
        "groups": groups,
        "reference_gbps": _round(reference),
        "limit_gbps": _round(limit),
    }
    if len(values) == 1 and previous is None and not state.get("reference_gbps_fixed"):
        # Nothing to compare with: the group is its own reference, so it cannot be slow.
        rec["note"] = (
            f"round {planned['round']} had one group and no reference to judge it by; with fewer than four "
            "nodes give reference_gbps (--reference-gbps)"
        )
    if planned.get("pair_round") is not None:
        rec["pair_round"] = planned["pair_round"]
    state = dict(state, rounds=state["rounds"] + [rec], next=None)
    return _advance(state)


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def _advance(state: dict) -> dict:
    know = (
        infer(state)
        if state["rounds"]
        else {"good": [], "slow_nodes": [], "links": [], "unexplained": [], "untested": list(state["nodes"])}
    )
    state = dict(
        state,
        known_good=know["good"],
        suspects=sorted(
            {n for g in know["unexplained"] for n in g["members"] if n not in know["good"]}, key=state["nodes"].index
        ),
    )
    groups, notes = plan_next(state)
    if groups and len(state["rounds"]) < state["max_rounds"]:
        pair_round = None
        if all(g["purpose"] == "pairs" for g in groups):
            pair_round = sum(1 for r in state["rounds"] if r.get("pair_round") is not None)
        for i, g in enumerate(groups):
            g["master"] = g["members"][0]
            g["port"] = state["base_port"] + i
        nxt = {"round": len(state["rounds"]) + 1, "groups": groups}
        if pair_round is not None:
            nxt["pair_round"] = pair_round
        return dict(state, next=nxt)
    if groups:
        notes.append(f"stopped after {state['max_rounds']} rounds (max_rounds) with slow groups still to follow")
    return conclude(state, know, notes)


def conclude(state: dict, know: dict, notes: list[str]) -> dict:
    obs = observations(state)
    findings = []
    for node in know["slow_nodes"]:
        mine = [g for g in obs if node in g["members"]]
        failed = all(g["status"] == "failed" for g in mine if g["slow"])
        findings.append(
            {
                "kind": "node",
                "node": node,
                "pair": None,
                "why": "failed" if failed else "slow",
                "text": (
                    f"{node} is slow: slow with every partner it was tried with ("
                    + "; ".join(_group_text(g, node) for g in mine)
                    + ")"
                ),
                "evidence": [_evidence(g) for g in mine],
            }
        )
    for a, b in know["links"]:
        mine = [g for g in obs if a in g["members"] or b in g["members"]]
        findings.append(
            {
                "kind": "link",
                "node": None,
                "pair": [a, b],
                "why": "slow",
                "text": (
                    f"the link between {a} and {b} is slow: they are slow together, and each runs at the reference "
                    "with other partners (" + "; ".join(_group_text(g) for g in mine) + ")"
                ),
                "evidence": [_evidence(g) for g in mine],
            }
        )
    open_groups = [
        g for g in know["unexplained"] if not any(f["kind"] == "node" and f["node"] in g["members"] for f in findings)
    ]
    for g in open_groups:
        findings.append(
            {
                "kind": "group",
                "node": None,
                "pair": None,
                "members": list(g["members"]),
                "why": "unexplained",
                "text": f"{', '.join(g['members'])} ran slow together in round {g['round']} "
                f"({_fig(g['busbw_gbps'])} GB/s, limit {_fig(g['limit_gbps'])}) and the rounds left "
                "did not tell which node or link",
                "evidence": [_evidence(g)],
            }
        )
    named = [f for f in findings if f["kind"] in ("node", "link")]
    if named and not open_groups:
        verdict = "found"
    elif findings:
        verdict = "inconclusive" if not named else "found"
    else:
        verdict = "none"
    if verdict == "none":
        summary = (
            f"no slow node or link: every group of {len(state['rounds'])} round(s) ran at "
            f"{state['threshold']['value']:.0%} of the reference or better"
        )
    else:
        summary = "; ".join(f["text"].split(":")[0] if f["kind"] != "group" else f["text"] for f in findings)
    notes = [r["note"] for r in state["rounds"] if r.get("note")] + notes
    return dict(
        state,
        done=True,
        next=None,
        findings=findings,
        verdict=verdict,
        summary=summary,
        notes=notes,
        known_good=know["good"],
        suspects=[],
    )


def _fig(x) -> str:
    return "no figure" if x is None else f"{x:g}"


def _group_text(g: dict, node: str | None = None) -> str:
    others = [m for m in g["members"] if m != node] if node else g["members"]
    what = "failed to run" if g["status"] == "failed" else f"{_fig(g['busbw_gbps'])} GB/s"
    mark = "slow" if g["slow"] else "ok"
    return f"round {g['round']} with {', '.join(others)}: {what} ({mark}, limit {_fig(g['limit_gbps'])})"


def _evidence(g: dict) -> dict:
    return {k: g.get(k) for k in ("round", "members", "busbw_gbps", "limit_gbps", "status", "slow", "reason")}


# ---------------------------------------------------------------- simulated fleets


def simulate(nodes: list[str], measure: Callable[[list[str]], float | None], **options) -> dict:
    """Run a whole localisation with `measure(members) -> busbw` standing in for the NCCL runs."""
    state = start(nodes, **options)
    while not state["done"]:
        figures = [{"busbw_gbps": measure(g["members"]), "status": "ok"} for g in state["next"]["groups"]]
        state = record_round(state, figures)
    return state
