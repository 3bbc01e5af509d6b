"""A GPU's own character: some GPUs are steadily a few percent slower than their siblings and still inside their
model's healthy spread (a 4 x H100 with one GPU about 4% below the others in every run). Such a GPU is held
against its own past in the store, so that it is not named again in every run: what warns is a change against
that past, more than fleet_below_baseline_warn_pct (calibrated: the model's run-to-run spread of a figure). A GPU
outside the healthy spread (fleet_gpu_below_node_warn_pct) is named at once, whatever its past.

    deviations(rows)                                  {(host, uuid, metric, context): [% below its siblings'
                                                      median, newest run first]} of the store's gpu_past() rows
    past_deviations(store, metrics_by_host, run_id)   the same, {(uuid, metric, context): ...}, of the GPUs these
                                                      nodes hold, over their node's latest HISTORY_RUNS accepted runs
    held(row, past, thresholds)
        a gpu_vs_node comparison with its own past: `own_past`, and warn where the GPU moved against it
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from gpufleet.comparisons import gpu_text
from gpufleet.comparisons.thresholds import BASE_WARN, Thresholds
from gpufleet.base.judge import Limit, below_pct, judge
from gpufleet.base.schema import PASS, WARN

HISTORY_RUNS = 5  # the latest runs a GPU is held against
MIN_RUNS = 2  # fewer than this is no character yet


def deviations(rows: list[dict]) -> dict[tuple, list[float]]:
    """{(host, uuid, metric, context): [% below its siblings' median, newest run first]} of a store's gpu_past()
    rows (newest run first), at most HISTORY_RUNS runs a GPU."""
    groups: dict[tuple, list] = defaultdict(list)  # newest run first: the store's order
    for r in rows:
        groups[(r["run_id"], r["host"], r["metric"], r["context"])].append((r["uuid"], r["value"]))
    out: dict[tuple, list[float]] = defaultdict(list)
    for (_, host, metric, context), members in groups.items():
        values = [v for _, v in members]
        if len(values) < 2 or min(values) <= 0:
            continue
        for i, (uuid, value) in enumerate(members):
            key = (host, uuid, metric, context)
            if len(out[key]) >= HISTORY_RUNS:
                continue
            ref = statistics.median(values) if len(values) > 2 else values[1 - i]
            out[key].append(round(below_pct(value, ref), 2))
    return dict(out)


def past_deviations(store: Any, metrics_by_host: dict[str, dict], run_id: str) -> dict[tuple, list[float]]:
    """{(uuid, metric, context): [...]} (deviations()) of the GPUs these nodes hold now."""
    if store is None:
        return {}
    wanted = {
        m["uuid"] for f in metrics_by_host.values() for m in f["metrics"] if m["scope"] == "gpu" and m.get("uuid")
    }
    out: dict[tuple, list[float]] = {}
    for (_, uuid, metric, context), past in deviations(
        store.gpu_past(list(metrics_by_host), run_id, HISTORY_RUNS)
    ).items():
        if uuid in wanted and (uuid, metric, context) not in out:
            out[(uuid, metric, context)] = past
    return out


def held(row: dict, past: dict[tuple, list[float]], thresholds: Thresholds) -> dict:
    """The comparison row with `own_past` where the GPU has one: {"runs", "usual_below_pct", "change_pct",
    "limit_pct", "changed"}; a passing row whose GPU moved more than the limit against its usual place warns."""
    mine = past.get((row.get("uuid"), row["metric"], row.get("context")))
    if not mine or len(mine) < MIN_RUNS or row.get("not_compared"):  # a figure not the node's: held against nothing
        return row
    usual = statistics.median(mine)
    change = round(-row["deviation_pct"] - usual, 2)
    limit = thresholds.value(BASE_WARN, row["metric"])
    changed = judge(change, Limit(BASE_WARN, limit, breach=WARN)).status == WARN
    own = {
        "runs": len(mine),
        "usual_below_pct": round(usual, 2),
        "change_pct": change,
        "limit_pct": limit,
        "changed": changed,
    }
    return {**row, "own_past": own, "status": WARN if changed and row["status"] == PASS else row["status"]}


def steady_text(rows: list[dict]) -> str:
    """ "; held against their own past, not named again: GPU 0 steadily 2.3% below its siblings (bf16 matmul, over
    its last 3 runs; and 3 more figures)" for the passing GPUs a percent or more below their siblings, as always."""
    by_gpu: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["status"] == PASS and r.get("own_past") and r["own_past"]["usual_below_pct"] >= 1.0:
            by_gpu[(r.get("index"), r.get("uuid"))].append(r)
    parts = []
    for mine in by_gpu.values():
        top = max(mine, key=lambda r: r["own_past"]["usual_below_pct"])
        more = f"; and {len(mine) - 1} more figure(s)" if len(mine) > 1 else ""
        parts.append(
            f"{gpu_text(top).split(' (')[0]} steadily {top['own_past']['usual_below_pct']:.1f}% below its siblings "
            f"({top['label']}, over its last {top['own_past']['runs']} runs, now {-top['deviation_pct']:.1f}%{more})"
        )
    return f"; held against their own past, not named again: {'; '.join(parts)}" if parts else ""
