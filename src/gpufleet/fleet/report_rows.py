"""The fleet view: per node, what report.html and report.md show against the fleet and the baseline."""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.fleet import flagged
from gpufleet.comparisons.confirm import status_of
from gpufleet.comparisons.peers import fleet_stats
from gpufleet.base.schema import PASS, SKIP


# The fleet view: what report.html and report.md show per node (the first metric a node has of each list).
VIEW_COLUMNS = (
    ("matmul", "bf16 matmul, slowest GPU", ("matmul_bf16_tflops",)),
    ("hbm", "HBM copy, slowest GPU", ("hbm_copy_gbps",)),
    (
        "busbw",
        "all_reduce busbw, largest sizes",
        ("nccl_node_all_reduce_busbw_gbps_gt_64MiB", "nccl_multinode_all_reduce_busbw_gbps_gt_64MiB"),
    ),
    (
        "tokens",
        "GPT-2 tokens/s per GPU",
        ("train_gpt2_node_tokens_per_s_per_gpu", "train_gpt2_multinode_tokens_per_s_per_gpu"),
    ),
)


def view_rows(
    metrics_by_host: dict, groups: dict, medians: dict, base_rows: list[dict], results: dict, stats: dict | None = None
) -> list[dict]:
    """Per node, the fleet view's columns: value, fleet median, baseline figure, deviations, worst status."""
    rows = []
    stats = stats if stats is not None else fleet_stats(groups)
    base_node = {(b["host"], b["metric"], b["context"]): b for b in base_rows if b["gpu_index"] is None}
    for host, node_metrics in metrics_by_host.items():
        by_key = {m["key"]: m for m in node_metrics["metrics"] if m["scope"] == "node"}
        checks = {r["check"]: r for r in results.get(host, [])}
        cols = {}
        for col, title, keys in VIEW_COLUMNS:
            m = next((by_key[k] for k in keys if k in by_key), None)
            if m is None:
                cols[col] = None
                continue
            members = groups.get((m["key"], m["context"]), {})
            # A median of one node is that node: nothing to show against.
            fleet_med = stats[(m["key"], m["context"])][0] if len(members) > 1 and not m["shared"] else None
            b = base_node.get((host, m["key"], m["context"]))
            bmed = medians.get((m["key"], m["context"]))
            statuses = []
            for check in ("node_vs_fleet", "node_vs_baseline", "node_vs_baseline_fleet"):
                for c in (checks.get(check, {}).get("detail") or {}).get("comparisons") or []:
                    if c["metric"] == m["key"] and c.get("index") is None:
                        statuses.append(status_of(c))
            gpu_outliers = [
                c
                for c in (checks.get("gpu_vs_node", {}).get("detail") or {}).get("comparisons") or []
                if c["metric"] == m["key"] and status_of(c) not in (PASS, SKIP)
            ]
            cols[col] = {
                "title": title,
                "metric": m["key"],
                "label": m["label"],
                "value": m["value"],
                "unit": m["unit"],
                "cpu": m["cpu"],
                "fleet_median": fleet_med,
                "fleet_n": len(members) if fleet_med is not None else 0,
                "vs_fleet_pct": None if not fleet_med else round((m["value"] - fleet_med) / fleet_med * 100, 2),
                "baseline": b["value"] if b else None,
                "vs_baseline_pct": round((m["value"] - b["value"]) / b["value"] * 100, 2) if b and b["value"] else None,
                "baseline_fleet_median": bmed["value"] if bmed else None,
                "status": schema.worst(statuses + [status_of(c) for c in gpu_outliers], default=PASS),
                "gpu_outliers": [
                    {**flagged(c), "deviation_pct": c["deviation_pct"], "status": c["status"]} for c in gpu_outliers
                ],
            }
        rows.append({"host": host, "columns": cols, "cpu": node_metrics["cpu"]})
    return rows
