"""Comparisons between peers of one run: each GPU against its node's median, each node against the fleet's,
and a GPU whose benchmark samples spread far more than its siblings'.
"""

from __future__ import annotations

import statistics
from typing import Callable

from gpufleet.comparisons import flagged, gpu_text, figure_text

from gpufleet.comparisons import metric_keys
from gpufleet.comparisons.against import Against
from gpufleet.comparisons.character import held, steady_text
from gpufleet.comparisons.findings import (
    comparison_row,
    evidence_rows,
    flagged_from,
    fleet_result,
    gap_text,
    judge_comparisons,
    limit_text,
    listed_text,
)
from gpufleet.comparisons.robust import robust, robust_z
from gpufleet.base.calibration import UNCALIBRATED
from gpufleet.base.judge import Limit, judge
from gpufleet.comparisons.thresholds import (
    GPU_FAIL,
    GPU_WARN,
    MIN_NODES,
    NODE_FAIL,
    NODE_WARN,
    SPREAD_FLOOR,
    SPREAD_RATIO,
    Thresholds,
)
from gpufleet.base import schema
from gpufleet.comparisons.confirm import INCONCLUSIVE
from gpufleet.comparisons.trusted import apart_text, compared
from gpufleet.base.schema import INFO, PASS, SKIP, WARN


def node_rows(node_metrics: dict, *, shared: bool = False) -> list[dict]:
    return [m for m in node_metrics["metrics"] if m["scope"] == "node" and (shared or not m["shared"])]


def fleet_groups(metrics_by_host: dict[str, dict]) -> dict[tuple, dict[str, dict]]:
    """(metric, context) -> {host: node-level metric} over the nodes of the run, shared metrics left out."""
    groups: dict[tuple, dict[str, dict]] = {}
    for host, node_metrics in metrics_by_host.items():
        for m in node_rows(node_metrics):
            groups.setdefault((m["key"], m["context"]), {})[host] = m
    return groups


Settle = Callable[[str, dict], dict]  # (check, row) -> the row as it stands (confirm.settle)


def gpu_vs_node_rows(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against | None = None
) -> list[dict]:
    """Each GPU against its node's median, one row a GPU and metric; with `against.past` (character.past_deviations) a
    GPU is also held against its own place among its siblings in earlier runs."""
    past = against.past if against else {}
    comparisons = []
    for key in metric_keys.GPU_METRICS:
        rows = [m for m in node_metrics["metrics"] if m["key"] == key and m["scope"] == "gpu"]
        if len(rows) < 2:
            continue
        if min(m["value"] for m in rows) <= 0:
            continue  # a figure of zero is no measurement to hold others against
        if len(rows) == 2:
            for m, other in (rows, rows[::-1]):
                comparisons.append(
                    comparison_row(
                        m,
                        other["value"],
                        f"its only sibling {gpu_text(other).split(' (')[0]} at",
                        thresholds,
                        GPU_WARN,
                        GPU_FAIL,
                        held_against=other,
                        n=2,
                        robust_z=None,
                        context=m["context"],
                    )
                )
            continue
        med, mad = robust([m["value"] for m in rows])
        for m in rows:
            comparisons.append(
                comparison_row(
                    m,
                    med,
                    "the node median",
                    thresholds,
                    GPU_WARN,
                    GPU_FAIL,
                    n=len(rows),
                    mad=round(mad, 4),
                    robust_z=robust_z(m["value"], med, mad),
                    context=m["context"],
                )
            )
    return [held(c, past or {}, thresholds) for c in comparisons]


def gpu_vs_node(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against | None = None, settle: Settle | None = None
) -> dict:
    """Each GPU's figures against its node's median and against its own place among its siblings in earlier runs.
    Its rows (gpu_vs_node_rows) as they stand (settle)."""
    comparisons = gpu_vs_node_rows(host, node_metrics, thresholds, against)
    if settle:
        comparisons = [settle("gpu_vs_node", c) for c in comparisons]
    cpu = any(c["cpu"] for c in comparisons)
    threshold = thresholds.pair(GPU_WARN, GPU_FAIL)
    if not comparisons:
        gpus = {m.get("cuda_index") for m in node_metrics["metrics"] if m["scope"] == "gpu"}
        why = (
            "one GPU measured on this node: no sibling to compare it with"
            if len(gpus) == 1
            else "no per-GPU benchmark figures in this node's results (matmul and memory did not run or gave no figure)"
        )
        return fleet_result("gpu_vs_node", SKIP, why, threshold=threshold)
    status, reason, below_pct, trust = judge_comparisons(
        comparisons, thresholds, GPU_WARN, GPU_FAIL, lambda c: f"{gpu_text(c)} "
    )
    if reason is None:
        n_gpus = max(c["n"] for c in comparisons)
        keys = sorted({c["metric"] for c in compared(comparisons)}, key=metric_keys.GPU_METRICS.index)
        within = "of each other" if n_gpus == 2 else "of the node median"
        reason = (
            f"all {n_gpus} GPUs within {limit_text(thresholds, GPU_WARN, keys)} {within} on {len(keys)} metric(s) "
            f"({', '.join(metric_keys.describe(k)['label'] for k in keys)}); {gap_text(comparisons)}{steady_text(comparisons)}"
        )
    reason += apart_text(comparisons, node_metrics.get("apart"))
    return fleet_result(
        "gpu_vs_node",
        status,
        reason,
        cpu=cpu,
        value=below_pct,
        unit="% below",
        threshold=threshold,
        trust=trust,
        remedy="compare that GPU's clocks, power and temperature in the benchmark's monitor detail and its health "
        "checks, and its earlier runs (gpufleet history <uuid>); re-run the node's benchmarks; a GPU that "
        "stays slow needs service (reseat, RMA)",
        detail={"comparisons": evidence_rows(comparisons), "flagged_gpus": flagged_from(comparisons)},
    )


def fleet_stats(groups: dict) -> dict[tuple, tuple[float, float]]:
    """(metric, context) -> (median, MAD) of the nodes' figures: once per run, not once per node."""
    return {k: robust([m["value"] for m in members.values()]) for k, members in groups.items()}


def node_vs_fleet(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against | None = None, settle: Settle | None = None
) -> dict:
    """The node against this run's fleet median of each figure (`against.groups`, `against.stats`)."""
    groups, stats = (against.groups, against.stats) if against else ({}, {})
    min_nodes = thresholds.value(MIN_NODES) or 3
    threshold = thresholds.field(NODE_WARN, fail=thresholds.field(NODE_FAIL), min_nodes=thresholds.field(MIN_NODES))
    mine = node_rows(node_metrics)
    if not mine:
        return fleet_result(
            "node_vs_fleet",
            SKIP,
            "no node-level benchmark figures in this node's results to compare with the fleet",
            threshold=threshold,
        )
    comparisons, too_few = [], {}
    for m in mine:
        members = groups.get((m["key"], m["context"]), {})
        if len(members) < min_nodes:
            too_few[m["key"]] = len(members)
            continue
        key = (m["key"], m["context"])
        med, mad = stats[key] if stats and key in stats else robust([x["value"] for x in members.values()])
        if med <= 0:
            continue
        comparisons.append(
            comparison_row(
                m,
                med,
                f"the fleet median of {len(members)} nodes",
                thresholds,
                NODE_WARN,
                NODE_FAIL,
                n=len(members),
                mad=round(mad, 4),
                robust_z=robust_z(m["value"], med, mad),
            )
        )
    if settle:
        comparisons = [settle("node_vs_fleet", c) for c in comparisons]
    cpu = any(m["cpu"] for m in mine)
    if not comparisons:
        n = max(too_few.values(), default=0)
        why = f"{n} node(s) of this run have these figures; a fleet median needs at least {min_nodes} ({MIN_NODES})" + (
            ": with two, the median cannot tell which one is off" if n == 2 else ""
        )
        return fleet_result("node_vs_fleet", SKIP, why, threshold=threshold, detail={"nodes_with_figures": too_few})
    status, reason, below_pct, trust = judge_comparisons(
        comparisons, thresholds, NODE_WARN, NODE_FAIL, lambda c: f"node {host} "
    )
    if reason is None:
        mine = [c["metric"] for c in compared(comparisons)]
        reason = (
            f"node {host} within {limit_text(thresholds, NODE_WARN, mine)} of the fleet median on {len(mine)} metric(s); "
            f"{gap_text(comparisons)}"
        )
    reason += apart_text(comparisons, node_metrics.get("apart"))
    return fleet_result(
        "node_vs_fleet",
        status,
        reason,
        cpu=cpu,
        value=below_pct,
        unit="% below",
        threshold=threshold,
        trust=trust,
        remedy="compare this node's checks (clocks, power limit, PCIe link, NVLink, host tuning) with a node near "
        "the median; re-run validate.yml --limit for it; a node that stays slow holds back every job it joins",
        detail={"comparisons": evidence_rows(comparisons), "too_few_nodes": too_few},
    )


def sample_spread(
    host: str, node_metrics: dict, thresholds: Thresholds, against: Against | None = None, settle: Settle | None = None
) -> dict:
    """A GPU whose samples spread far more than its siblings' (the node's own figures: `against` is not read)."""
    ratio_max = thresholds.value(SPREAD_RATIO)
    threshold = thresholds.field(SPREAD_FLOOR, ratio=thresholds.field(SPREAD_RATIO))
    spreads = node_metrics["spreads"]
    if not spreads:
        return fleet_result(
            "sample_spread", SKIP, "no per-sample figures in this node's benchmark results", threshold=threshold
        )
    rows = []
    for key in dict.fromkeys(s["key"] for s in spreads):
        mine = [s for s in spreads if s["key"] == key]
        floor = thresholds.value(
            SPREAD_FLOOR, key
        )  # a calibrated model's: its healthy spread of this figure, with margin
        for s in mine:
            siblings = [o["spread_pct"] for o in mine if o is not s]
            sib = statistics.median(siblings) if siblings else None
            ratio = (
                None
                if sib is None
                else (s["spread_pct"] / sib if sib > 0 else (float("inf") if s["spread_pct"] > 0 else 1.0))
            )
            disturbed = (
                sib is not None
                and ratio_max is not None
                and judge(s["spread_pct"], Limit(SPREAD_FLOOR, floor, breach=WARN)).status == WARN
                and judge(ratio, Limit(SPREAD_RATIO, ratio_max, breach=WARN)).status == WARN
            )
            shown = None if ratio is None else "inf" if ratio == float("inf") else round(ratio, 2)
            rows.append(
                {
                    **s,
                    "siblings_median_spread_pct": sib,
                    "ratio": shown,
                    "floor_pct": floor,
                    "status": WARN if disturbed else PASS,
                }
            )
    keep = (
        "key",
        "index",
        "uuid",
        "serial",
        "n",
        "min",
        "median",
        "max",
        "spread_pct",
        "siblings_median_spread_pct",
        "ratio",
        "floor_pct",
        "status",
    )
    if settle:
        rows = [settle("sample_spread", r) for r in rows]
    cpu = any(s["cpu"] for s in spreads)
    bad = [r for r in rows if r["status"] == WARN]
    unsure = [r for r in rows if r["status"] == INCONCLUSIVE]
    if not any(r["siblings_median_spread_pct"] is not None for r in rows):
        worst = max(rows, key=lambda r: r["spread_pct"])
        return fleet_result(
            "sample_spread",
            SKIP,
            f"one GPU measured: no sibling to compare its sample spread with (largest: "
            f"{worst['label']} {worst['spread_pct']:.1f}%)",
            threshold=threshold,
            detail={"spreads": [{k: r[k] for k in keep} for r in rows]},
        )
    if bad or unsure:
        parts = []
        for r in sorted(bad + unsure, key=lambda r: (r in unsure, -r["spread_pct"])):
            unit = metric_keys.describe(r["key"])["unit"]
            ratio = (
                "with siblings at 0%"
                if r["ratio"] == "inf"
                else f"{r['ratio']:.1f} times its siblings' median spread {r['siblings_median_spread_pct']:.1f}%"
            )
            parts.append(
                f"{gpu_text(r)} {r['label']} samples spread {r['spread_pct']:.1f}% ({figure_text(r['min'])} to {figure_text(r['max'])} {unit}"
                f" over {r['n']} samples), {ratio} (thresholds: over {figure_text(r['floor_pct'])}%"
                f"{f' ({UNCALIBRATED})' if thresholds.uncalibrated(SPREAD_FLOOR, r['key']) else ''}"
                f" and over {figure_text(ratio_max)} times): "
                "disturbed while measured, its median is not the GPU's figure"
                + (f" (inconclusive: {r['unconfirmed']})" if r in unsure else "")
            )
        reason = listed_text(parts)
    else:
        worst = max(rows, key=lambda r: r["spread_pct"])
        reason = (
            f"no GPU's samples spread far more than its siblings' ({len(rows)} figure(s); largest: {gpu_text(worst)} "
            f"{worst['label']} {worst['spread_pct']:.1f}%)"
        )
    return fleet_result(
        "sample_spread",
        WARN if bad else INFO if unsure else PASS,
        reason,
        cpu=cpu,
        trust=schema.INCONCLUSIVE if unsure and not bad else None,
        value=max(r["spread_pct"] for r in rows),
        unit="%",
        threshold=threshold,
        remedy="look for another process on that GPU (gpu_health.processes) or a throttle in the benchmark's monitor "
        "detail; re-run the node's benchmarks on an idle node",
        detail={"spreads": [{k: r[k] for k in keep} for r in rows], "flagged_gpus": [flagged(r) for r in bad]},
    )
