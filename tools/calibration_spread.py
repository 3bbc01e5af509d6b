"""The healthy spread of the calibration table (tools/calibration_table.py): per sample, per GPU against its
siblings, per node against the round's other nodes and against its own past, over the clean node-runs of one GPU
model; each measure's figures summed up as the limits are set from them (gpufleet.base.calibration)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from calibration_rows import condition, machine_of
from gpufleet.base import calibration
from gpufleet.base.judge import ISOLATED_DEPTH_FACTOR, below_pct
from gpufleet.benchmarks.soak import soak_slowdown as soak_slowdown
from gpufleet.comparisons import metrics as fleet_metrics

SAMPLED = {
    "matmul_bf16_tflops": ("matmul_bf16", "samples_tflops"),
    "hbm_copy_gbps": ("hbm", "samples_gbps"),
    "pcie_h2d_gbps": ("pcie", "samples_h2d_gbps"),
    "pcie_d2h_gbps": ("pcie", "samples_d2h_gbps"),
}
# Which limits each measure sets (calibration.MEASURE_OF, read the other way), for the table.
SETS = defaultdict(list)
for _key, _measure in calibration.MEASURE_OF.items():
    SETS[_measure].append(_key)


def _sample_values(samples: dict) -> list[float] | None:
    values = samples.get("values") if isinstance(samples, dict) else None
    return [float(v) for v in values] if isinstance(values, list) and len(values) >= 2 else None


def sampled_figures(doc: dict) -> list[dict]:
    """Every figure of the document with its timed samples: {"metric", "uuid", "values", "summary"}."""
    out = []
    for res in doc.get("results") or []:
        detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
        if res.get("group") != "benchmark" or res.get("trust") == "disturbed" or fleet_metrics.is_cpu(res):
            continue
        if res.get("check") == "matmul_bf16":
            for row in (detail.get("per_gpu") or {}).values():
                if isinstance(row, dict) and isinstance(row.get("samples_tflops"), dict):
                    out.append(
                        {"metric": "matmul_bf16_tflops", "uuid": row.get("uuid"), "summary": row["samples_tflops"]}
                    )
        elif res.get("check") == "hbm_bandwidth":  # the memory results share their detail: read it once
            per = detail.get("per_gpu") or {}
            for metric, (part, field) in SAMPLED.items():
                if part in ("hbm", "pcie"):
                    for row in (per.get(part) or {}).values():
                        if isinstance(row, dict) and isinstance(row.get(field), dict):
                            out.append({"metric": metric, "uuid": row.get("uuid"), "summary": row[field]})
    for f in out:
        f["values"] = _sample_values(f["summary"])
    return out


def healthy_drop(values: list[float]) -> float:
    """What a healthy figure's samples say for sample_drop_pct: the second-deepest drop below their median, or
    the deepest over ISOLATED_DEPTH_FACTOR, whichever is more (one low sample may go that much deeper)."""
    med = statistics.median(values)
    drops = sorted((below_pct(v, med) for v in values), reverse=True)
    return max(0.0, drops[1] if len(drops) > 1 else 0.0, drops[0] / ISOLATED_DEPTH_FACTOR)


def spreads(rows: list[dict]) -> dict:
    """{measure: {metric: [(figure, where it came from)]}} over the clean node-runs of one GPU model."""
    out: dict = defaultdict(lambda: defaultdict(list))
    clean = [r for r in rows if condition(r) == "clean"]
    for r in clean:
        where = f"{r['round']}/{r['node']}"
        for f in sampled_figures(r["document"]):
            if f["values"]:
                out["sample_drop_pct"][f["metric"]].append((round(healthy_drop(f["values"]), 2), where))
            s = f["summary"]
            if s.get("median"):
                out["sample_spread_pct"][f["metric"]].append(
                    (round(100 * (s["max"] - s["min"]) / s["median"], 2), where)
                )
        for metric, drops in soak_windows(r["document"]).items():
            out["soak_window_pct"][metric] += [(d, where) for d in drops]
        for res in r["document"].get("results") or []:  # the host's NUMA nodes against their siblings' median
            figs = [v["gbps"] for v in ((res.get("detail") or {}).get("per_node") or {}).values() if "gbps" in v]
            if res.get("check") == "host_memory_bandwidth" and not fleet_metrics.is_cpu(res) and len(figs) > 1:
                med = statistics.median(figs)
                out["numa_vs_node_pct"]["host_memory_gbps"] += [
                    (round(max(0.0, below_pct(v, med)), 2), where) for v in figs
                ]
    # Per machine and round: every GPU's figure against the others' (the fleet's gpu_vs_node), the node-level
    # figures against the round's nodes (node_vs_fleet), the spread of a node's GPUs.
    rounds: dict = defaultdict(list)
    for r in clean:
        rounds[(r["round"], machine_of(r))].append(r)
    for (rnd, _), members in rounds.items():
        found = {r["node"]: fleet_metrics.extract(r["document"]) for r in members}
        per_metric: dict = defaultdict(list)
        for found_one in found.values():
            for m in found_one["metrics"]:
                if m["scope"] == "gpu" and not m["cpu"]:
                    per_metric[m["key"]].append(m["value"])
        for metric, values in per_metric.items():
            if len(values) < 2 or min(values) <= 0:
                continue
            for i, v in enumerate(values):
                ref = statistics.median(values) if len(values) > 2 else values[1 - i]
                out["gpu_vs_node_pct"][metric].append((round(max(0.0, below_pct(v, ref)), 2), rnd))
            out["node_gpu_spread_pct"][metric].append((round(100 * (max(values) - min(values)) / max(values), 2), rnd))
        nodes: dict = defaultdict(list)
        for found_one in found.values():
            for m in found_one["metrics"]:
                if m["scope"] == "node" and not m["cpu"] and not m["shared"]:
                    nodes[m["key"]].append(m["value"])
        for metric, values in nodes.items():
            if len(values) >= 3 and min(values) > 0:
                med = statistics.median(values)
                out["node_vs_fleet_pct"][metric] += [(round(max(0.0, below_pct(v, med)), 2), rnd) for v in values]
    # Each GPU (uuid) and each node against the median of its own earlier clean figures, in the files' order. A node
    # is its GPUs (their uuids): machines of one kind lent at different times share a host name but not their GPUs.
    past: dict = defaultdict(list)
    for r in clean:
        metrics = fleet_metrics.extract(r["document"])["metrics"]
        node = node_of(r, metrics)
        for m in metrics:
            if m["cpu"] or m["shared"] or m["value"] <= 0:
                continue
            who = m["uuid"] if m["scope"] == "gpu" else node
            if not who:
                continue
            key = (who, m["key"], m["context"])
            if past[key]:
                out["node_vs_past_pct"][m["key"]].append(
                    (round(max(0.0, below_pct(m["value"], statistics.median(past[key]))), 2), r["round"])
                )
            past[key].append(m["value"])
    return out


def node_of(row: dict, metrics: list[dict]) -> str:
    """A node as its past knows it: its machine, its name and its GPUs (their uuids, from its figures metrics)."""
    gpus = ",".join(sorted({m["uuid"] for m in metrics if m["scope"] == "gpu" and m.get("uuid")}))
    return f"{machine_of(row)}|{row['node']}|{gpus}"


def soak_windows(doc: dict) -> dict[str, list[float]]:
    """A clean soak's windows below their own best windows' median (benchmarks.soak.soak_slowdown's reference), per figure."""
    out: dict = defaultdict(list)
    for res in doc.get("results") or []:
        if res.get("check") != "soak_slowdown" or res.get("status") in ("skip", "error") or fleet_metrics.is_cpu(res):
            continue
        detail = res.get("detail") or {}
        series = [
            (g.get("windows") or [], k)
            for g in (detail.get("per_gpu") or {}).values()
            for k in ("matmul_tflops", "hbm_gbps")
        ]
        nccl = detail.get("nccl") or {}
        windows = nccl.get("windows") or []
        if windows and "warm_up" not in nccl:  # recorded before the soak kept its first all_reduce round apart:
            windows = windows[
                1:
            ]  # its first window holds that cold round (benchmarks/soak/outcome.py), never a window's
        series.append((windows, "busbw_gbps"))
        for windows, key in series:
            values = [w[key] for w in windows if isinstance(w.get(key), (int, float))]
            if len(values) < 2:
                continue
            best = statistics.median(
                sorted(values, reverse=True)[: min(soak_slowdown.SOAK_BEST_WINDOWS, max(1, len(values) // 2))]
            )
            out[soak_slowdown.WINDOW_METRICS[key]] += [round(max(0.0, below_pct(v, best)), 2) for v in values]
    return out


def summarize(figures: list[tuple]) -> dict:
    values = sorted(v for v, _ in figures)
    p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
    return {
        "n": len(values),
        "median": round(statistics.median(values), 2),
        "p95": round(p95, 2),
        "value": round(values[-1], 2),
        "at": next(w for v, w in figures if v == values[-1]),
    }


def measured_of(rows: list[dict]) -> dict:
    """{measure: {metric: summarize()}} of these rows' clean runs."""
    return {
        measure: {metric: summarize(figs) for metric, figs in metrics.items() if figs}
        for measure, metrics in spreads(rows).items()
    }
