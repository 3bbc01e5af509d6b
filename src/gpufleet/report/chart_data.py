"""What the report's pictures show, as data: report.html draws it (svg.py), report.md writes it as small tables.

    gpu_bars(results)             per figure (bf16 matmul, HBM copy), each GPU beside its siblings' median, its past
                                  (the baseline run's figure for it, its usual place among its siblings) and the limits
    nccl_charts(node, report)     the NCCL busbw curves, each beside the baseline run's figures for it
    fleet_distributions(report)   per fleet-view figure, the distribution over the nodes, the outliers named

Everything comes from what the report holds: the node's results (the fleet layer's comparisons among them) and
the fleet layer's view and baseline medians.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpufleet.base import schema
from gpufleet.comparisons import figure_text, gpu_text, metrics
from gpufleet.comparisons.metric_keys import band_of, describe
from gpufleet.report.formatting import busbw_series, decided_limit, fleet_columns

BAR_METRICS = ("matmul_bf16_tflops", "hbm_copy_gbps")
# The benchmark result whose threshold is each bar figure's floor, the limit every GPU is held against alone.
FLOOR_CHECKS = {"matmul_bf16_tflops": "matmul_bf16", "hbm_copy_gbps": "hbm_bandwidth"}
OUTLIERS_NAMED = 12  # nodes named in a distribution picture; its table names every one


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------- each GPU beside its siblings and its past


def _comparisons(results: list[dict], check: str) -> list[dict]:
    res = next((r for r in results if r.get("group") == "fleet" and r.get("check") == check), None)
    detail = (res or {}).get("detail")
    return (
        [c for c in (detail or {}).get("comparisons") or [] if isinstance(c, dict)] if isinstance(detail, dict) else []
    )


def _by_gpu(rows: list[dict], metric: str) -> dict:
    out = {}
    for c in rows:
        if c.get("metric") == metric and (c.get("index") is not None or c.get("uuid")):
            out[c.get("uuid") or c.get("index")] = c
    return out


def gpu_bars(results: list[dict], per_gpu: list[dict] | None = None) -> list[dict]:
    """Per bar figure a node measured per GPU: {"metric", "label", "unit", "gpus": [{"gpu", "index", "uuid",
    "value", "status", "reference" (what the fleet held it against: its siblings' median, or its only sibling),
    "deviation_pct", "usual" (where its own past puts it against that reference), "baseline" (the baseline run's
    figure for this GPU)}], "sibling_limit" (the lowest figure the siblings' limit lets pass), "sibling_limit_pct",
    "floor" (the benchmark's own minimum), "floor_key"}."""
    # The report's nodes carry their per-GPU figures as the fleet layer extracted them (per_gpu): a document is
    # extracted once a report; a bare list of results is extracted here.
    rows_of = per_gpu if per_gpu is not None else metrics.extract(results)["metrics"]
    siblings, baseline = _comparisons(results, "gpu_vs_node"), _comparisons(results, "node_vs_baseline")
    sibling_res = next((r for r in results if r.get("group") == "fleet" and r.get("check") == "gpu_vs_node"), None)
    out = []
    for metric in BAR_METRICS:
        rows = [m for m in rows_of if m["key"] == metric and m["scope"] == "gpu"]
        if not rows:
            continue
        held, past = _by_gpu(siblings, metric), _by_gpu(baseline, metric)
        gpus = []
        for m in rows:
            c = held.get(m.get("uuid") or m.get("index")) or {}
            b = past.get(m.get("uuid") or m.get("index")) or {}
            own = c.get("own_past") or {}
            ref = c.get("reference")
            gpus.append(
                {
                    "gpu": gpu_text(m).split(" (")[0],
                    "index": m.get("index"),
                    "uuid": m.get("uuid"),
                    "value": m["value"],
                    "status": c.get("status") or schema.PASS,
                    "reference": ref,
                    "deviation_pct": c.get("deviation_pct"),
                    "usual": ref * (1 - own["usual_below_pct"] / 100)
                    if _finite(ref) and _finite(own.get("usual_below_pct"))
                    else None,
                    "baseline": b.get("reference"),
                }
            )
        pct = None
        if sibling_res is not None and held:
            pct = _level_value(sibling_res.get("threshold"), metric)
        refs = [g["reference"] for g in gpus if _finite(g["reference"])]
        floor_res = next(
            (r for r in results if r.get("group") == "benchmark" and r.get("check") == FLOOR_CHECKS[metric]), None
        )
        floor = decided_limit(floor_res) if floor_res else None
        out.append(
            {
                "metric": metric,
                "label": describe(metric)["label"],
                "unit": describe(metric)["unit"],
                "gpus": gpus,
                # The reference of the slowest GPU: its siblings' median, or on two GPUs the faster one.
                "sibling_limit": min(refs) * (1 - pct / 100) if refs and _finite(pct) else None,
                "sibling_limit_pct": pct,
                "floor": floor["value"] if floor and _finite(floor.get("value")) else None,
                "floor_key": floor["key"] if floor else None,
            }
        )
    return out


def _level_value(threshold: Any, metric: str) -> Any:
    """The warn level of a pair for one metric: its own limit where calibrated, else the level's value."""
    if not isinstance(threshold, dict):
        return None
    own = (threshold.get("by_metric") or {}).get(metric)
    own = own.get("value") if isinstance(own, dict) else own
    return own if own is not None else threshold.get("value")


# ---------------------------------------------------------------- NCCL beside the baseline


def nccl_charts(node: dict, report: dict) -> list[dict]:
    """busbw_series() with each line's baseline: "baseline": [(size_bytes, busbw_gbps)] at the sizes the fleet layer
    compares (the largest of each size band): the baseline run's figure for this node where it had one, else the
    baseline run's fleet median at the same size and world size; "baseline_run" on the chart."""
    charts = busbw_series(node["results"])
    fleet = report.get("fleet") or {}
    base = fleet.get("baseline") or {}
    run = base.get("run_id") if not base.get("note") else None
    own = {c["metric"]: c for c in _comparisons(node["results"], "node_vs_baseline") if c.get("index") is None}
    medians = {(m.get("metric"), m.get("context")): m for m in (fleet.get("baseline_medians") or {}).values()}
    for chart in charts:
        scope = "multinode" if chart.get("group") == "benchmark_multinode" else "node"
        for line in chart["lines"]:
            points = []
            largest: dict[str, int] = {}
            for size, _ in line["points"]:
                band = band_of(size)
                largest[band] = max(largest.get(band, 0), size)
            for band, size in sorted(largest.items(), key=lambda kv: kv[1]):
                metric = f"nccl_{scope}_{line['label']}_busbw_gbps_{band}"
                ref = own.get(metric, {}).get("reference")
                if ref is None:
                    ref = (medians.get((metric, f"size={size},world={chart.get('world_size')}")) or {}).get("value")
                if _finite(ref):
                    points.append((size, float(ref)))
            line["baseline"] = points
        chart["baseline_run"] = run if any(line["baseline"] for line in chart["lines"]) else None
    return charts


# ---------------------------------------------------------------- the fleet, for many nodes


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _bulk(values: list[float], q1: float, median: float, q3: float) -> tuple[float, float]:
    """Where the middle of the fleet lies: the quartiles widened by three times their distance (at least 0.25% of
    the median), within the figures. What lies outside is drawn node by node, on an axis of its own."""
    pad = max(3 * (q3 - q1), abs(median) * 0.0025)
    return max(values[0], q1 - pad), min(values[-1], q3 + pad)


def fleet_distributions(report: dict, min_nodes: int = 3) -> list[dict]:
    """Per fleet-view figure with at least `min_nodes` nodes: {"column", "title", "unit", "n", "min", "q1", "median",
    "q3", "max", "bulk": (low, high) where the middle of the fleet lies, "fleet_median" (the fleet layer's),
    "baseline" (the baseline run's fleet median), "values" (every node's, sorted), "beyond": [{"host", "value",
    "status"}] (the nodes outside the bulk), "outliers": [{"host", "value", "status", "vs_fleet_pct"}] (the nodes the
    fleet layer did not pass on this figure, the slowest first; the slowest node when it passed them all and their
    figures differ, none when every node reads the same: "alike")}."""
    rows = (report.get("fleet") or {}).get("view") or []
    out = []
    for col, title, unit in fleet_columns(report):
        cells = [(r["host"], r["columns"][col]) for r in rows if r["columns"].get(col)]
        cells = [(h, c) for h, c in cells if _finite(c.get("value"))]
        if len(cells) < min_nodes:
            continue
        values = sorted(c["value"] for _, c in cells)
        q1, q2, q3 = _quartiles(values)
        low, high = _bulk(values, q1, q2, q3)
        flagged = sorted(((h, c) for h, c in cells if c["status"] != schema.PASS), key=lambda hc: hc[1]["value"])
        alike = figure_text(values[0]) == figure_text(values[-1])  # every node reads the same: none is the slowest
        if not flagged and not alike:
            flagged = [min(cells, key=lambda hc: hc[1]["value"])]
        medians = [c.get("fleet_median") for _, c in cells if _finite(c.get("fleet_median"))]
        bases = [c.get("baseline_fleet_median") for _, c in cells if _finite(c.get("baseline_fleet_median"))]
        out.append(
            {
                "column": col,
                "title": title,
                "unit": unit,
                "n": len(values),
                "min": values[0],
                "q1": q1,
                "median": q2,
                "q3": q3,
                "max": values[-1],
                "bulk": (low, high),
                "fleet_median": medians[0] if medians else None,
                "baseline": bases[0] if bases else None,
                "values": values,
                "alike": alike,
                "beyond": [
                    {"host": h, "value": c["value"], "status": c["status"]}
                    for h, c in cells
                    if not low <= c["value"] <= high
                ],
                "outliers": [
                    {"host": h, "value": c["value"], "status": c["status"], "vs_fleet_pct": c.get("vs_fleet_pct")}
                    for h, c in flagged
                ],
            }
        )
    return out
