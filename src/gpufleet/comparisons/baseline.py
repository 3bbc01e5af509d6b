"""Comparisons with the baseline run: the node and each GPU against the baseline's figure for them, and the
node against the baseline's fleet median.
"""

from __future__ import annotations

import statistics

from gpufleet.comparisons import gpu_text
from gpufleet.comparisons.findings import (
    comparison_row,
    evidence_rows,
    flagged_from,
    fleet_result,
    gap_text,
    judge_comparisons,
    limit_text,
)
from gpufleet.comparisons.against import Against
from gpufleet.comparisons.peers import Settle, node_rows
from gpufleet.comparisons.trusted import apart_text, compared
from gpufleet.comparisons.thresholds import BASE_FAIL, BASE_WARN, Thresholds
from gpufleet.base.schema import SKIP


def _comparable(m: dict, b: dict) -> str | None:
    """Why a figure cannot be held against a baseline figure, or None."""
    if bool(m.get("cpu")) != bool(b.get("cpu")):
        return "one of the two is a CPU run"
    if m["context"] != b.get("context"):
        return f"measured differently (baseline {b.get('context')}, this run {m['context']})"
    return None


def baseline_index(base: list[dict]) -> tuple[dict, dict]:
    """({host: {metric: node-level row}}, {(uuid, metric): GPU row}) of the baseline's rows, built once per run."""
    node_base: dict[str, dict] = {}
    for b in base:
        if b["gpu_index"] is None:
            node_base.setdefault(b["host"], {})[b["metric"]] = b
    return node_base, {(b["uuid"], b["metric"]): b for b in base if b["gpu_index"] is not None and b["uuid"]}


def node_vs_baseline_rows(host: str, node_metrics: dict, thresholds: Thresholds, against: Against) -> list[dict]:
    """The rows of node_vs_baseline: none without a baseline's figures."""
    if against.base_index is None:
        return []
    return _baseline_rows(host, node_metrics, against.base_id, thresholds, against.base_index)[0]


def _baseline_rows(
    host: str, node_metrics: dict, base_id: str, thresholds: Thresholds, index: tuple
) -> tuple[list[dict], list[dict]]:
    """(rows, figures not comparable): the node and each GPU against the baseline's figure for them. index:
    baseline_index() of the baseline's rows, so that a run of many nodes does not go through every row per node."""
    comparisons, not_comparable = [], []
    by_host, gpu_base = index
    node_base = by_host.get(host, {})
    for m in node_metrics["metrics"]:
        if m["scope"] == "node":
            b, what = node_base.get(m["key"]), f"baseline run {base_id}'s figure for this node"
        elif m.get("uuid"):
            b = gpu_base.get((m["uuid"], m["key"]))
            what = f"baseline run {base_id}'s figure for this GPU" + (
                f" (then in node {b['host']})" if b and b["host"] != host else ""
            )
        else:
            continue
        if b is None:
            continue
        why = _comparable(m, {"cpu": b["cpu"], "context": b["context"]})
        if why:
            not_comparable.append({"metric": m["key"], "index": m.get("index"), "uuid": m.get("uuid"), "why": why})
            continue
        if b["value"] > 0:
            comparisons.append(
                comparison_row(m, b["value"], what, thresholds, BASE_WARN, BASE_FAIL, baseline_host=b["host"])
            )
    return comparisons, not_comparable


def node_vs_baseline(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against, settle: Settle | None = None
) -> dict:
    """The node and each GPU against the baseline run's figures for them (`against.base_rows`)."""
    threshold = thresholds.pair(BASE_WARN, BASE_FAIL)
    if against.base_note:
        return fleet_result("node_vs_baseline", SKIP, against.base_note, threshold=threshold)
    base_id = against.base_id
    index = against.base_index if against.base_index is not None else baseline_index(against.base_rows)
    comparisons, not_comparable = _baseline_rows(host, node_metrics, base_id, thresholds, index)
    if settle:
        comparisons = [settle("node_vs_baseline", c) for c in comparisons]
    if not comparisons:
        why = (
            f"nothing comparable: {not_comparable[0]['why']}"
            if not_comparable
            else f"node {host} and its GPUs are not in baseline run {base_id} (node_vs_baseline_fleet holds it against that run's fleet)"
        )
        return fleet_result(
            "node_vs_baseline",
            SKIP,
            why,
            threshold=threshold,
            detail={"baseline": base_id, "not_comparable": not_comparable},
        )
    status, reason, below_pct, trust = judge_comparisons(
        comparisons,
        thresholds,
        BASE_WARN,
        BASE_FAIL,
        lambda c: f"{gpu_text(c)} " if c.get("index") is not None or c.get("uuid") else f"node {host} ",
    )
    if reason is None:
        mine = [c["metric"] for c in compared(comparisons)]
        reason = (
            f"node {host} and its GPUs within {limit_text(thresholds, BASE_WARN, mine)} of baseline run {base_id} on "
            f"{len(mine)} figure(s); {gap_text(comparisons)}"
        )
    reason += apart_text(comparisons, node_metrics.get("apart"))
    return fleet_result(
        "node_vs_baseline",
        status,
        reason,
        cpu=any(c["cpu"] for c in comparisons),
        value=below_pct,
        unit="% below",
        threshold=threshold,
        trust=trust,
        remedy="the node or GPU got slower than when the baseline was taken: compare this run's health checks and "
        "versions (driver, firmware) with the baseline's; re-run the benchmarks; service what stays slow",
        detail={
            "baseline": base_id,
            "comparisons": evidence_rows(comparisons),
            "not_comparable": not_comparable,
            "flagged_gpus": flagged_from(comparisons),
        },
    )


def baseline_medians(base: list[dict]) -> dict[tuple, dict]:
    """(metric, context) -> {"value" (median over the baseline's nodes), "n", "cpu", "unit"} of node-level rows."""
    groups: dict[tuple, list[dict]] = {}
    for b in base:
        if b["gpu_index"] is None:
            groups.setdefault((b["metric"], b["context"]), []).append(b)
    return {
        k: {
            "value": statistics.median(r["value"] for r in rows),
            "n": len(rows),
            "cpu": any(r["cpu"] for r in rows),
            "unit": rows[0]["unit"],
        }
        for k, rows in groups.items()
    }


def node_vs_baseline_fleet_rows(host: str, node_metrics: dict, thresholds: Thresholds, against: Against) -> list[dict]:
    """The rows of node_vs_baseline_fleet: none without the baseline's fleet medians."""
    if not against.medians:
        return []
    return _fleet_rows(node_metrics, against.medians, against.fleet_id, thresholds)[0]


def _fleet_rows(
    node_metrics: dict, medians: dict, base_id: str, thresholds: Thresholds
) -> tuple[list[dict], list[dict]]:
    """(rows, figures not comparable): the node against the baseline run's fleet median (baseline_medians())."""
    comparisons, not_comparable = [], []
    by_metric: dict[str, list] = {}
    for (key, context), med in medians.items():
        by_metric.setdefault(key, []).append((context, med))
    for m in node_rows(node_metrics, shared=True):
        options = by_metric.get(m["key"]) or []
        match = next((med for context, med in options if context == m["context"]), None)
        if match is None:
            if options:
                not_comparable.append(
                    {
                        "metric": m["key"],
                        "why": f"measured differently (baseline {options[0][0]}, this run {m['context']})",
                    }
                )
            continue
        if bool(match["cpu"]) != bool(m["cpu"]):
            not_comparable.append({"metric": m["key"], "why": "one of the two is a CPU run"})
            continue
        if match["value"] > 0:
            comparisons.append(
                comparison_row(
                    m,
                    match["value"],
                    f"baseline run {base_id}'s fleet median of {match['n']} node(s)",
                    thresholds,
                    BASE_WARN,
                    BASE_FAIL,
                    n=match["n"],
                )
            )
    return comparisons, not_comparable


def node_vs_baseline_fleet(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against, settle: Settle | None = None
) -> dict:
    """The node against the baseline run's fleet median of each figure (`against.medians`)."""
    threshold = thresholds.pair(BASE_WARN, BASE_FAIL)
    if against.base_note:
        return fleet_result("node_vs_baseline_fleet", SKIP, against.base_note, threshold=threshold)
    base_id = against.fleet_id
    comparisons, not_comparable = _fleet_rows(node_metrics, against.medians, base_id, thresholds)
    if settle:
        comparisons = [settle("node_vs_baseline_fleet", c) for c in comparisons]
    if not comparisons:
        why = (
            f"nothing comparable: {not_comparable[0]['why']}"
            if not_comparable
            else f"baseline run {base_id} has none of this node's figures"
        )
        return fleet_result(
            "node_vs_baseline_fleet",
            SKIP,
            why,
            threshold=threshold,
            detail={"baseline": base_id, "not_comparable": not_comparable},
        )
    status, reason, below_pct, trust = judge_comparisons(
        comparisons, thresholds, BASE_WARN, BASE_FAIL, lambda c: f"node {host} "
    )
    if reason is None:
        mine = [c["metric"] for c in compared(comparisons)]
        reason = (
            f"node {host} within {limit_text(thresholds, BASE_WARN, mine)} of baseline run {base_id}'s fleet median on "
            f"{len(mine)} metric(s); {gap_text(comparisons)}"
        )
    reason += apart_text(comparisons, node_metrics.get("apart"))
    return fleet_result(
        "node_vs_baseline_fleet",
        status,
        reason,
        cpu=any(c["cpu"] for c in comparisons),
        value=below_pct,
        unit="% below",
        threshold=threshold,
        trust=trust,
        remedy="this node is slower than the fleet was at the baseline: compare its checks with a node of the "
        "baseline run; a replacement node that is slower than the nodes it joins holds back every job",
        detail={"baseline": base_id, "comparisons": evidence_rows(comparisons), "not_comparable": not_comparable},
    )
