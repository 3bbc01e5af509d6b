"""Finding the slow node or link (gpufleet.fleet.locate) on simulated fleets of 4 to 256 nodes, and the files of a
localisation in a run folder (gpufleet.runner.locating), without a playbook.

A simulated fleet answers each group's NCCL run with a bus bandwidth: the normal figure with a few percent of
noise, 40% of it when the group holds the slow node, half of it when it holds both ends of the slow link.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from gpufleet.base.errors import InputError
from gpufleet.fleet import locate, locate_plan
from gpufleet.runner import locating

NORMAL_GBPS = 100.0


def names(n: int) -> list[str]:
    return [f"node{i:03d}" for i in range(n)]


def fleet(
    slow_node: str | None = None,
    slow_pair: tuple | None = None,
    noise: float = 0.05,
    seed: int = 7,
    failing: str | None = None,
    log: list | None = None,
):
    rnd = random.Random(seed)

    def measure(members):
        if log is not None:
            log.append(list(members))
        if failing in members:
            return None
        value = NORMAL_GBPS * (1 + rnd.uniform(-noise, noise))
        if slow_node in members:
            value *= 0.4
        if slow_pair and set(slow_pair) <= set(members):
            value *= 0.5
        return value

    return measure


def run_rounds(state: dict) -> list[list[list[str]]]:
    return [[g["members"] for g in r["groups"]] for r in state["rounds"]]


def assert_rounds_disjoint(state: dict) -> None:
    for r in state["rounds"]:
        seen = [m for g in r["groups"] for m in g["members"]]
        assert len(seen) == len(set(seen)), f"round {r['round']} uses a node twice: {r['groups']}"
        ports = [g["port"] for g in r["groups"]]
        assert len(ports) == len(set(ports)) and all(g["master"] == g["members"][0] for g in r["groups"])


# ---------------------------------------------------------------- pairing


@pytest.mark.parametrize("n", [4, 16, 17, 33])
def test_round_robin_puts_every_node_in_one_pair_a_round_and_pairs_every_two_nodes_once(n):
    nodes = names(n)
    seen_pairs = set()
    rounds = n - 1 if n % 2 == 0 else n
    for i in range(rounds):
        pairs, out = locate_plan.round_robin(nodes, i)
        members = [m for p in pairs for m in p] + out
        assert sorted(members) == sorted(nodes), "every node once a round"
        assert len(out) == n % 2
        seen_pairs |= {frozenset(p) for p in pairs}
    assert len(seen_pairs) == n * (n - 1) // 2
    pairs, out = locate_plan.round_robin(nodes, 0)
    assert pairs[0] == [nodes[0], nodes[1]] and pairs[1] == [nodes[2], nodes[3]], "round 1 pairs neighbours"


@pytest.mark.parametrize("n", [16, 64, 256])
def test_pairs_find_a_slow_node_in_two_rounds(n):
    nodes = names(n)
    slow = nodes[n // 3]
    state = locate.simulate(nodes, fleet(slow_node=slow), method="pairs")
    assert state["verdict"] == "found", state["summary"]
    assert len(state["rounds"]) == 2
    (finding,) = state["findings"]
    assert finding["kind"] == "node" and finding["node"] == slow and finding["why"] == "slow"
    assert state["summary"] == f"{slow} is slow"
    # Round 1: every node in one pair; round 2: the two suspects, each with a node known good.
    first, second = run_rounds(state)
    assert sorted(m for g in first for m in g) == sorted(nodes) and all(len(g) == 2 for g in first)
    partner = next(m for g in first if slow in g for m in g if m != slow)
    assert sorted(second) == sorted(
        [sorted([slow, g[1] if g[0] == slow else g[0]], key=nodes.index) for g in second if slow in g]
        + [g for g in second if partner in g]
    )
    assert all(len(g) == 2 for g in second) and {slow, partner} <= {m for g in second for m in g}
    assert partner in state["known_good"] and slow not in state["known_good"]
    # The finding quotes the figures of every round the node ran in.
    assert [e["round"] for e in finding["evidence"]] == [1, 2] and all(e["slow"] for e in finding["evidence"])
    assert "round 1 with" in finding["text"] and "round 2 with" in finding["text"]
    assert_rounds_disjoint(state)


@pytest.mark.parametrize("n", [16, 32, 100, 256])
def test_bisection_finds_a_slow_node_in_about_log2_rounds(n):
    nodes = names(n)
    slow = nodes[(n * 5) // 7]
    log: list = []
    state = locate.simulate(nodes, fleet(slow_node=slow, log=log), method="bisect")
    assert state["method"] == "bisect"
    assert [f["node"] for f in state["findings"]] == [slow], state["summary"]
    rounds = len(state["rounds"])
    assert rounds <= math.ceil(math.log2(n)), (rounds, run_rounds(state))
    if n & (n - 1) == 0:
        assert rounds == int(math.log2(n))
    # Round 1 runs the two halves of the whole fleet at once; each later round halves the slow group.
    first = run_rounds(state)[0]
    assert first == [nodes[: (n + 1) // 2], nodes[(n + 1) // 2 :]]
    sizes = [max(len(g) for g in groups) for groups in run_rounds(state)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 2
    # Each round runs at most the groups it needs: the halves of the slow group, never the whole fleet again.
    assert all(len(groups) <= 2 for groups in run_rounds(state))
    assert_rounds_disjoint(state)


def test_auto_pairs_small_fleets_and_bisects_large_ones():
    assert locate.start(names(16))["method"] == "pairs"
    assert locate.start(names(32))["method"] == "bisect"
    assert locate.start(names(3), method="bisect")["method"] == "pairs", "halves of one node are pairs"
    assert locate.start(names(40), bisect_min_nodes=64)["method"] == "pairs"


@pytest.mark.parametrize("n", [16, 256])
def test_pairs_tell_a_slow_link_from_a_slow_node(n):
    nodes = names(n)
    pair = (nodes[4], nodes[5])  # partners in round 1
    state = locate.simulate(nodes, fleet(slow_pair=pair), method="pairs")
    assert len(state["rounds"]) == 2
    (finding,) = state["findings"]
    assert finding["kind"] == "link" and finding["pair"] == list(pair), state["summary"]
    assert state["summary"] == f"the link between {pair[0]} and {pair[1]} is slow"
    # Both ends ran at the reference with other partners in round 2.
    second = run_rounds(state)[1]
    assert len(second) == 2 and all(len(g) == 2 for g in second)
    assert not any(set(pair) <= set(g) for g in second)
    assert set(pair) <= set(state["known_good"])


@pytest.mark.parametrize("n", [17, 64])
def test_a_slow_link_between_nodes_not_paired_first_is_found_in_the_round_that_pairs_them(n):
    nodes = names(n)
    pair = (nodes[0], nodes[n - 1])
    one_round = locate.simulate(nodes, fleet(slow_pair=pair), method="pairs")
    if n % 2 == 0:  # not tried together in round 1: nothing to see with one round of pairs
        assert one_round["verdict"] == "none"
    state = locate.simulate(nodes, fleet(slow_pair=pair), method="pairs", pair_rounds=n)
    (finding,) = state["findings"]
    assert finding["kind"] == "link" and finding["pair"] == list(pair)
    met = next(i for i in range(n) if list(pair) in locate_plan.round_robin(nodes, i)[0])
    # The rounds of new pairs up to the one that pairs them, then one round to clear both ends; the odd node out
    # of round 1 is tried in round 2 (here: with node000, which is how an odd fleet meets the link early).
    assert len(state["rounds"]) <= met + 2
    assert_rounds_disjoint(state)


def test_bisection_follows_a_slow_link_inside_one_half_to_the_pair():
    nodes = names(16)
    pair = (nodes[0], nodes[1])
    state = locate.simulate(nodes, fleet(slow_pair=pair), method="bisect")
    (finding,) = state["findings"]
    assert finding["kind"] == "link" and finding["pair"] == list(pair)
    assert len(state["rounds"]) == 4  # 8, 4, 2 nodes, then each end with a known-good partner


def test_bisection_does_not_see_a_link_its_halves_never_run_together():
    nodes = names(16)
    state = locate.simulate(nodes, fleet(slow_pair=(nodes[0], nodes[15])), method="bisect")
    assert state["verdict"] == "none" and len(state["rounds"]) == 1


def test_two_slow_nodes_are_both_named():
    nodes = names(64)
    slow = {nodes[3], nodes[40]}

    def measure(members):
        return NORMAL_GBPS * (0.4 if slow & set(members) else 1.0)

    state = locate.simulate(nodes, measure, method="pairs")
    assert {f["node"] for f in state["findings"]} == slow and state["verdict"] == "found", state["summary"]
    # Halves are judged against each other: with a slow node in each, only a known figure tells them slow.
    state = locate.simulate(nodes, measure, method="bisect")
    assert state["verdict"] == "none"
    state = locate.simulate(nodes, measure, method="bisect", reference_gbps=NORMAL_GBPS)
    assert {f["node"] for f in state["findings"]} == slow and state["verdict"] == "found", state["summary"]
    assert len(state["rounds"]) == 6, "both halves followed in the same rounds"


def test_nothing_slow_stops_after_the_first_round():
    state = locate.simulate(names(16), fleet(), method="pairs")
    assert state["verdict"] == "none" and state["findings"] == [] and len(state["rounds"]) == 1
    assert state["summary"].startswith("no slow node or link")
    assert state["known_good"] == names(16)
    state = locate.simulate(names(64), fleet(), method="bisect")
    assert state["verdict"] == "none" and len(state["rounds"]) == 1


def test_the_odd_node_out_is_tried_with_a_node_known_good():
    nodes = names(5)
    state = locate.simulate(nodes, fleet(), method="pairs")
    assert run_rounds(state)[0] == [nodes[0:2], nodes[2:4]]
    assert run_rounds(state)[1] == [[nodes[0], nodes[4]]]
    assert state["verdict"] == "none"
    state = locate.simulate(nodes, fleet(slow_node=nodes[4]), method="pairs")
    assert [f["node"] for f in state["findings"]] == [nodes[4]]


def test_three_nodes_need_a_reference_and_then_tell_node_from_link_without_a_known_good_one():
    nodes = names(3)
    # Round 1 is one pair: nothing to compare it with, and the state says so.
    state = locate.simulate(nodes, fleet(slow_node=nodes[1]), method="pairs")
    assert state["verdict"] == "none" and "give reference_gbps" in state["notes"][0]
    state = locate.simulate(nodes, fleet(slow_node=nodes[1]), method="pairs", reference_gbps=NORMAL_GBPS)
    assert [f["node"] for f in state["findings"]] == [nodes[1]] and len(state["rounds"]) == 3
    state = locate.simulate(nodes, fleet(slow_pair=(nodes[0], nodes[1])), method="pairs", reference_gbps=NORMAL_GBPS)
    assert [f["pair"] for f in state["findings"]] == [[nodes[0], nodes[1]]] and len(state["rounds"]) == 3


def test_two_nodes_slow_together_cannot_be_told_apart():
    state = locate.simulate(names(2), lambda members: 1.0 if len(members) == 2 else 0.0, reference_gbps=10.0)
    assert state["verdict"] == "inconclusive" and state["findings"][0]["kind"] == "group"
    assert "no other node is left" in " ".join(state["notes"])


def test_a_group_that_did_not_run_is_slow_and_the_node_that_fails_everywhere_is_named():
    nodes = names(8)
    state = locate.simulate(nodes, fleet(failing=nodes[2]), method="pairs")
    (finding,) = state["findings"]
    assert finding["node"] == nodes[2] and finding["why"] == "failed"
    assert all(e["status"] == "failed" and e["busbw_gbps"] is None for e in finding["evidence"])
    assert "failed to run" in finding["text"]


def test_the_reference_is_the_rounds_median_and_never_drops():
    state = locate.start(names(8), method="pairs")
    figures = [{"busbw_gbps": v} for v in (100.0, 90.0, 40.0, 110.0)]
    state = locate.record_round(state, figures)
    r1 = state["rounds"][0]
    assert r1["reference_gbps"] == 95.0 and r1["limit_gbps"] == 76.0
    assert [g["slow"] for g in r1["groups"]] == [False, False, True, False]
    # Round 2 has two groups: its best figure, but not under round 1's reference.
    state = locate.record_round(state, [{"busbw_gbps": 30.0}, {"busbw_gbps": 80.0}])
    r2 = state["rounds"][1]
    assert r2["reference_gbps"] == 95.0 and [g["slow"] for g in r2["groups"]] == [True, False]
    assert state["done"] and [f["node"] for f in state["findings"]] == [r1["groups"][2]["members"][0]]
    # A fixed reference judges every round.
    state = locate.start(names(4), method="pairs", reference_gbps=200.0)
    state = locate.record_round(state, [{"busbw_gbps": 100.0}, {"busbw_gbps": 100.0}])
    assert state["rounds"][0]["limit_gbps"] == 160.0 and all(g["slow"] for g in state["rounds"][0]["groups"])


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="two nodes or more"):
        locate.start(["a"])
    with pytest.raises(ValueError, match="distinct"):
        locate.start(["a", "a"])
    with pytest.raises(ValueError, match="ratio"):
        locate.start(["a", "b"], ratio=1.5)
    with pytest.raises(ValueError, match="method"):
        locate.start(["a", "b", "c", "d"], method="random")
    state = locate.start(["a", "b"])
    with pytest.raises(ValueError, match="has 1 groups; got 2 figures"):
        locate.record_round(state, [{}, {}])


def test_the_state_is_plain_json_and_a_cap_on_rounds_stops_with_what_is_known():
    nodes = names(64)
    state = locate.simulate(nodes, fleet(slow_node=nodes[9]), method="bisect", max_rounds=3)
    assert json.loads(json.dumps(state)) == state
    assert len(state["rounds"]) == 3 and state["verdict"] == "inconclusive"
    assert "max_rounds" in " ".join(state["notes"])
    (group,) = [f for f in state["findings"] if f["kind"] == "group"]
    assert nodes[9] in group["members"] and len(group["members"]) == 8


# ---------------------------------------------------------------- the files in a run folder


def round_file(run_dir, k, host, members, value=None, error=None, failed_reason=None):
    results = []
    if value is not None:
        results.append(
            {
                "check": "nccl_all_reduce",
                "status": "skip",
                "value": value,
                "unit": "GB/s",
                "reason": "all_reduce busbw at 64 KiB over 4 ranks: 0.02 GB/s; CPU run: logic check only, not a performance figure",
                "detail": {
                    "rows": [{"size_bytes": 4096, "busbw_gbps": 0.01}, {"size_bytes": 65536, "busbw_gbps": value}]
                },
            }
        )
    if failed_reason:
        results.append({"check": "nccl", "status": "fail", "value": None, "reason": failed_reason})
    path = run_dir / "locate" / f"round-{k}" / f"{host}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host, "round": k, "members": members, "results": results, "error": error}))


def test_step_reads_each_nodes_round_file_judges_the_round_and_writes_locate_json(tmp_path):
    nodes = ["a", "b", "c", "d"]
    state = locating.step(tmp_path, start=True, nodes=nodes, left_out={"e": "the node did not answer"}, method="pairs")
    assert state["next"]["round"] == 1 and [g["members"] for g in state["next"]["groups"]] == [["a", "b"], ["c", "d"]]
    assert state["threshold"]["key"] == "locate_busbw_ratio_min" and state["threshold"]["value"] == 0.8
    assert state["threshold"]["source"].startswith("gpufleet default")
    on_disk = json.loads((tmp_path / "locate.json").read_text())
    assert on_disk["left_out"] == {"e": "the node did not answer"} and not on_disk["done"]

    for host in ("a", "b"):
        round_file(tmp_path, 1, host, ["a", "b"], value=0.0231)
    round_file(tmp_path, 1, "c", ["c", "d"], value=0.002)
    round_file(tmp_path, 1, "d", ["c", "d"], value=0.002)
    state = locating.step(tmp_path)
    assert state["device"] == "cpu" and "not performance figures" in state["note"]
    r1 = state["rounds"][0]
    assert [g["busbw_gbps"] for g in r1["groups"]] == [0.0231, 0.002] and r1["groups"][0]["size_bytes"] == 65536
    assert [g["slow"] for g in r1["groups"]] == [False, True]
    assert [g["members"] for g in state["next"]["groups"]] == [["a", "c"], ["b", "d"]]

    # d's run never came together (its partner b reported a failure); c ran slow with a.
    round_file(tmp_path, 2, "a", ["a", "c"], value=0.002)
    round_file(tmp_path, 2, "c", ["a", "c"], value=0.002)
    round_file(tmp_path, 2, "b", ["b", "d"], failed_reason="NCCL benchmark timed out and was killed")
    round_file(tmp_path, 2, "d", ["b", "d"], error="the NCCL run did not finish on this node")
    state = locating.step(tmp_path)
    assert state["done"] and state["verdict"] == "found"
    assert {f["node"] for f in state["findings"]} == {"c", "d"}
    d = next(f for f in state["findings"] if f["node"] == "d")
    assert d["evidence"][-1]["status"] == "failed"
    assert d["evidence"][-1]["reason"] == (
        "b: NCCL benchmark timed out and was killed; d: the NCCL run did not finish on this node"
    )
    summary = locating.step_summary(state, tmp_path)
    assert summary["done"] and summary["rounds_run"] == 2 and summary["locate_json"] == str(tmp_path / "locate.json")
    # Done is done: another step changes nothing.
    assert locating.step(tmp_path)["rounds"] == state["rounds"]


def test_a_missing_round_file_fails_its_group_naming_the_node():
    fig = locating.figure_of({"a": {"results": []}, "b": None}, ["a", "b"])
    assert fig["status"] == "failed" and fig["reason"] == "no result from b: the run did not finish there"
    fig = locating.figure_of({"a": {"results": []}, "b": {"results": []}}, ["a", "b"])
    assert fig["status"] == "failed" and "no all_reduce figure" in fig["reason"]


def test_step_with_fewer_than_two_nodes_concludes_at_once_and_says_who_was_left_out(tmp_path):
    state = locating.step(tmp_path, start=True, nodes=["a"], left_out={"b": "another run holds it"})
    assert state["done"] and state["verdict"] == "inconclusive" and state["rounds"] == []
    assert "b: another run holds it" in state["summary"]


def test_step_refuses_bad_input_naming_it(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        locating.step(tmp_path / "nope", start=True, nodes=["a", "b"])
    with pytest.raises(InputError, match="start the localisation first"):
        locating.step(tmp_path)
    with pytest.raises(InputError, match="ratio"):
        locating.step(tmp_path, start=True, nodes=["a", "b"], ratio=2.0)
    with pytest.raises(InputError, match="gpufleet_thresholds.locate_busbw_ratio_min = 'high' has the wrong type"):
        locating._ratio(None, {"locate_busbw_ratio_min": "high"})
    value, source = locating._ratio(None, {"locate_busbw_ratio_min": 0.5, "gpus_expected": 8})
    assert value == 0.5 and source == "inventory override (gpufleet_thresholds)"
    with pytest.raises(InputError, match="a node name"):
        locating.step(tmp_path, start=True, nodes=["a", "../b"])
