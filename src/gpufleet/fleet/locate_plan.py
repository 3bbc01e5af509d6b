"""The inference and planning of `gpufleet fleet locate` (locate.py holds the state and its rounds): what the
rounds so far say of each node and link, and which groups the next round runs.

What a slow group means, over every round so far:
    - a node in a group that ran at the reference is good (a slow node slows every group it is in);
    - a node not known good is slow when two slow groups have only that node in common: it is slow with
      every partner it was tried with;
    - a slow group whose nodes are all known good is a slow link between them (slow only together).
A slow group still unexplained is followed up in the next round: its nodes not known good are split in two
(each half of one node joins a known-good partner); a slow group of good nodes has its untested pairs run.
"""

from __future__ import annotations

from typing import Iterable


def round_robin(nodes: list[str], index: int) -> tuple[list[list[str]], list[str]]:
    """Round `index` (0-based) of the circle method: pairs, and the node left out when the count is odd.

    Round 0 pairs neighbours (nodes 0 and 1, 2 and 3, ...); the rounds up to n - 2 pair every node with every
    other once.
    """
    padded = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(padded)
    if n < 2:
        return [], [x for x in padded if x is not None]
    # Laid out so that the circle's round 0 is the neighbours: n0 n2 n4 ... n5 n3 n1.
    ring = padded[0::2] + padded[1::2][::-1]
    shift = index % (n - 1)
    rest = ring[1:]
    if shift:
        rest = rest[-shift:] + rest[:-shift]
    ring = [ring[0]] + rest
    pairs, out = [], []
    for i in range(n // 2):
        a, b = ring[i], ring[n - 1 - i]
        if a is None or b is None:
            out.append(a if b is None else b)
        else:
            pairs.append(sorted((a, b), key=nodes.index))
    pairs.sort(key=lambda p: nodes.index(p[0]))
    return pairs, out


def observations(state: dict) -> list[dict]:
    return [dict(g, round=r["round"], limit_gbps=r["limit_gbps"]) for r in state["rounds"] for g in r["groups"]]


def infer(state: dict) -> dict:
    """What the rounds so far say: good nodes, slow nodes, slow links, and the slow groups not yet explained."""
    nodes = state["nodes"]
    obs = observations(state)
    order = {n: i for i, n in enumerate(nodes)}
    good = {n for g in obs if not g["slow"] for n in g["members"]}
    slow_groups = [g for g in obs if g["slow"]]
    slow_nodes = []
    for n in nodes:
        if n in good:
            continue
        mine = [set(g["members"]) for g in slow_groups if n in g["members"]]
        if any(a & b == {n} for i, a in enumerate(mine) for b in mine[i + 1 :]):
            slow_nodes.append(n)
    links = []
    for g in slow_groups:
        members = set(g["members"])
        if len(members) == 2 and members <= good and not members & set(slow_nodes):
            pair = sorted(members, key=order.get)
            if pair not in links:
                links.append(pair)
    # A slow group is explained by a slow node in it, or by both ends of a slow link in it.
    unexplained = [
        g
        for g in slow_groups
        if not set(g["members"]) & set(slow_nodes) and not any(set(p) <= set(g["members"]) for p in links)
    ]
    # Follow the smallest: a slow group holding a smaller unexplained slow group is explained by it.
    minimal = [g for g in unexplained if not any(set(h["members"]) < set(g["members"]) for h in unexplained)]
    seen, dedup = set(), []
    for g in minimal:
        key = frozenset(g["members"])
        if key not in seen:
            seen.add(key)
            dedup.append(g)
    tested = {n for g in obs for n in g["members"]}
    return {
        "good": [n for n in nodes if n in good],
        "slow_nodes": slow_nodes,
        "links": links,
        "unexplained": dedup,
        "untested": [n for n in nodes if n not in tested],
    }


def _partners(obs: list[dict], node: str) -> set[str]:
    return {m for g in obs if node in g["members"] for m in g["members"]} - {node}


def _tested_pairs(obs: list[dict]) -> set[frozenset]:
    return {frozenset(g["members"]) for g in obs if len(g["members"]) == 2}


def plan_next(state: dict) -> tuple[list[dict], list[str]]:
    """The next round's groups (disjoint), and notes on what could not be followed up."""
    nodes = state["nodes"]
    order = {n: i for i, n in enumerate(nodes)}
    obs = observations(state)
    know = infer(state)
    good = set(know["good"])
    slow = set(know["slow_nodes"])
    used: set[str] = set()
    groups: list[dict] = []
    notes: list[str] = []

    def free(members: Iterable[str]) -> bool:
        return not (set(members) & used)

    def add(members: list[str], purpose: str) -> None:
        members = sorted(members, key=order.get)
        used.update(members)
        groups.append({"members": members, "purpose": purpose})

    def partner_for(node: str, prefer_good: bool = True) -> str | None:
        """A node to test `node` with: known good first, else one not known slow; never one tried with it."""
        tried = _partners(obs, node)
        pools = [[n for n in nodes if n in good]]
        if prefer_good:
            pools.append([n for n in nodes if n not in good and n not in slow])
        for pool in pools:
            for cand in pool:
                if cand != node and cand not in used and cand not in tried:
                    return cand
        return None

    if not state["rounds"]:
        if state["method"] == "bisect":
            half = (len(nodes) + 1) // 2
            for part in (nodes[:half], nodes[half:]):
                add(part, "halves")
        else:
            pairs, _ = round_robin(nodes, 0)
            for pair in pairs:
                add(pair, "pairs")
        return groups, notes

    for g in know["unexplained"]:
        members = list(g["members"])
        cands = [n for n in members if n not in good]
        if not cands:
            # Every node of the group is good elsewhere: a link between them. Run its untested pairs.
            tested = _tested_pairs(obs)
            for a, b in _pairs_within(members, order):
                if frozenset((a, b)) not in tested and free((a, b)):
                    add([a, b], "link")
            if not any(gr["purpose"] == "link" and set(gr["members"]) <= set(members) for gr in groups):
                if all(frozenset(p) in tested for p in _pairs_within(members, order)):
                    notes.append(
                        f"{', '.join(members)} are slow together in round {g['round']} while every pair of them "
                        "ran at the reference: more than one link, or load, slows them together"
                    )
            continue
        if not free(cands):
            continue  # some of its nodes are busy this round: next round
        if len(cands) == 1:
            node = cands[0]
            partner = partner_for(node)
            if partner is None:
                notes.append(_no_partner(node, obs))
                continue
            add([node, partner], "suspect")
            continue
        half = (len(cands) + 1) // 2
        for part in (cands[:half], cands[half:]):
            if len(part) == 1:
                partner = partner_for(part[0])
                if partner is None:
                    notes.append(_no_partner(part[0], obs))
                    continue
                add([part[0], partner], "suspect")
            elif free(part):
                add(part, "halves" if state["method"] == "bisect" else "suspect")

    for node in know["untested"]:
        if node in used:
            continue
        partner = partner_for(node)
        if partner is not None:
            add([node, partner], "untested")

    # More rounds of new pairs while nothing was found (a slow link shows only between the two nodes it joins).
    if (
        not groups
        and not know["unexplained"]
        and not know["slow_nodes"]
        and not know["links"]
        and state["method"] == "pairs"
    ):
        done_pair_rounds = sum(1 for r in state["rounds"] if r.get("pair_round") is not None)
        if done_pair_rounds < state["pair_rounds"] and len(nodes) > 2:
            pairs, _ = round_robin(nodes, done_pair_rounds)
            tested = _tested_pairs(obs)
            fresh = [p for p in pairs if frozenset(p) not in tested]
            for pair in fresh:
                add(pair, "pairs")
    return groups, notes


def _no_partner(node: str, obs: list[dict]) -> str:
    return (
        f"{node} is slow with {', '.join(sorted(_partners(obs, node))) or 'its partner'} but no other node is left "
        "to try it with, so a slow node cannot be told from a slow link"
    )


def _pairs_within(members: list[str], order: dict) -> list[tuple[str, str]]:
    members = sorted(members, key=order.get)
    out = []
    for i in range(max(len(members) - 1, 0)):
        pairs, _ = round_robin(members, i)
        out += [tuple(p) for p in pairs if tuple(p) not in out]
    return out
