"""Formatting shared by the renderers (render_md, render_html, render_junit) and the runner's ending message:
a check's name, a value with its unit, a threshold with its source, a figure's trust, a failure's class, the
NCCL curves, the fleet view's cells."""

from __future__ import annotations

import json
import math
from typing import Any

from gpufleet.base import causes, failure_class, schema
from gpufleet.fleet import figure_text
from gpufleet.fleet.report_rows import VIEW_COLUMNS

# Worst first: the column order of count tables and the order findings are listed in.
STATUS_ORDER = sorted(schema.STATUSES, key=schema.severity, reverse=True)


def check_id(res: dict) -> str:
    """`<group>.<check>`, the name a check goes by in every report."""
    return f"{res['group']}.{res['check']}" if res.get("group") else res["check"]


def ordered_results(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(not passing, worst first; passing), each in the order the checks ran; information (information()) is
    neither: it is listed apart."""
    bad = sorted(
        (r for r in results if r["status"] not in (schema.PASS, schema.INFO)),
        key=lambda r: -schema.severity(r["status"]),
    )
    return bad, [r for r in results if r["status"] == schema.PASS]


INFO_TITLE = "Information: findings with no action for the operator; they do not change the verdict"


def information(results: list[dict]) -> list[dict]:
    """The results of status info, in the order the checks ran."""
    return [r for r in results if r["status"] == schema.INFO]


TRUST_NOT_RECORDED = "not recorded"  # a benchmark figure of a document made before results carried `trust`


def trust_text(res: dict) -> str:
    """How far a result's performance figure can be trusted (clean, confirmed, disturbed, inconclusive), "not
    recorded" for a benchmark figure without `trust` (older documents), "" for a result that is no such figure."""
    if res.get("trust") is not None:
        return str(res["trust"])
    figure = _finite(res.get("value")) and str(res.get("group") or "").startswith("benchmark")
    return TRUST_NOT_RECORDED if figure else ""


def class_text(res: dict) -> str:
    """The failure class of a result that did not pass (failure_class.of: its own, else its check's default), or ""."""
    return failure_class.of(res) or ""


def kept_locks(report: dict) -> list[str]:
    """The nodes whose locks the run could not give back, each with why (run.json's last attempt)."""
    kept = report.get("locks_not_given_back")
    if isinstance(kept, dict):
        return [f"{host} ({why})" if why else str(host) for host, why in kept.items()]
    return [str(kept)] if kept else []


def fmt_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0 or abs(v) >= 1:
            return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e15 else f"{v:.4g}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(fmt_scalar(x) for x in v)
    return json.dumps(v, sort_keys=True, default=str)


def value_text(res: dict) -> str:
    """The measured value with its unit, or "" when the check measured none."""
    v = res.get("value")
    if v is None:
        return ""
    unit = res.get("unit")
    return f"{fmt_scalar(v)} {unit}" if unit else fmt_scalar(v)


def threshold_text(threshold: Any) -> tuple[str, str]:
    """(what the value is held against, where that number comes from).

    A threshold is {"key", "value", "source", ...}. A benchmark's bound is
    {"key", "value", "min" or "max", "source"} and reads "key: min 700";
    any other field is shown by its own name, so new benchmarks need no
    change here.
    """
    if threshold in (None, {}, ""):
        return "", ""
    if not isinstance(threshold, dict):
        return fmt_scalar(threshold), ""
    extra = {k: v for k, v in threshold.items() if k not in ("key", "value", "source")}
    bounds = [k for k in ("min", "max") if k in extra and extra[k] == threshold.get("value")]
    parts = []
    if bounds:
        # The bound is the key's value: say it once, by what it is ("none set" when the profile has no figure).
        said = []
        for b in bounds:
            v = extra.pop(b)
            said.append("none set" if v is None else f"{b} {fmt_scalar(v)}")
        said = "; ".join(said)
        parts.append(f"{threshold['key']}: {said}" if "key" in threshold else said)
    elif "key" in threshold:
        parts.append(f"{threshold['key']} = {fmt_scalar(threshold.get('value'))}")
    elif "value" in threshold:
        parts.append(fmt_scalar(threshold["value"]))
    sources = [str(threshold.get("source") or "")]
    for k, v in extra.items():
        if isinstance(v, dict) and "value" in v:  # a second threshold inside the first: "key = value", its source too
            parts.append(f"{v.get('key', k)} = {fmt_scalar(v['value'])}")
            sources.append(str(v.get("source") or ""))
        else:
            parts.append(f"{k} {fmt_scalar(v)}")
    return "; ".join(parts), "; ".join(s for s in sources if s)


def decided_limit(res: dict) -> dict | None:
    """The limit that decided a result's status: {"key", "value", "source", "calibrated", "metric"}; None for a
    result held against no limit.

    The judge says so in `threshold.decided`. A document from before it does not: there the limit is derived as
    the judge derived it. A threshold of one limit is its own key, value and source. A warn/fail pair (the warn
    level's key, the fail level's inside it under `fail`, each with its per-metric `by_metric` limits where the
    model is calibrated) decided by the level of the result's status (fail for a failure, else warn) and the
    metric of its worst comparison (`detail.comparisons`: the worst status, then the farthest below its
    reference; for a pass the closest figure is the one farthest below)."""
    threshold = res.get("threshold")
    if not isinstance(threshold, dict):
        return None
    if isinstance(threshold.get("decided"), dict):
        return threshold["decided"]
    if "key" not in threshold:
        return None
    fail = threshold.get("fail")
    if not (isinstance(fail, dict) and "key" in fail):
        return limit_for(threshold, None, False)
    worst = worst_comparison(res)
    # A row past its limit once only (inconclusive) names the level it was past: `would_be`.
    failed = res.get("status") == schema.FAIL or (
        res.get("status") not in (schema.WARN, schema.FAIL) and worst.get("would_be") == schema.FAIL
    )
    return limit_for(threshold, worst.get("metric"), failed)


def limit_for(threshold: dict, metric: str | None, failed: bool) -> dict:
    """The limit of a warn/fail pair (or of a single limit) for one metric at one level: {"key", "value", "source",
    "calibrated", "metric"}; decided_limit() for a result, a comparison row's own limit (row_limit())."""
    fail = threshold.get("fail")
    level = fail if failed and isinstance(fail, dict) and "key" in fail else threshold
    own = (level.get("by_metric") if isinstance(level.get("by_metric"), dict) else {}).get(metric)
    source = level.get("source")
    if isinstance(own, dict):  # as a profile holds it: {"value", "source"}
        own, source = own.get("value"), own.get("source") or source
    elif own is not None:  # as a result holds it: the number alone
        source = f"the GPU model's calibration for {metric} (docs/calibration.md); without it: {source}"
    return {
        "key": level.get("key"),
        "value": own if own is not None else level.get("value"),
        "source": source,
        # Calibrated only where the metric has a limit of its own: a level's `calibrated` says that some metrics
        # have one (its by_metric), not that its own value is one.
        "calibrated": own is not None,
        "metric": metric,
    }


def row_limit(res: dict, row: dict) -> dict | None:
    """The limit one comparison row of a result was held against (at the level it reached)."""
    threshold = res.get("threshold")
    if not isinstance(threshold, dict) or "key" not in threshold:
        return None
    return limit_for(threshold, row.get("metric"), (row.get("would_be") or row.get("status")) == schema.FAIL)


def worst_comparison(res: dict) -> dict:
    """The comparison of `detail.comparisons` that decided a result: the worst status that stands (a row past its
    limit in one measurement only, `inconclusive`, just above a pass), then the farthest below its reference; {}
    when there is none."""
    detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
    rows = [c for c in detail.get("comparisons") or [] if isinstance(c, dict) and c.get("metric")]

    def rank(c: dict) -> float:
        status = c.get("status") or schema.PASS
        return schema.severity(status) if status in schema.STATUSES else schema.severity(schema.PASS) + 0.5

    return min(rows, key=lambda c: (-rank(c), _number(c.get("deviation_pct"), math.inf)), default={})


def _number(v: Any, default: float) -> float:
    return float(v) if _finite(v) else default


def decided_text(limit: dict) -> tuple[str, str]:
    """(the limit in words: `key = value for metric, calibrated`, its source)."""
    shown = f"{limit.get('key')} = {'none set' if limit.get('value') is None else fmt_scalar(limit['value'])}"
    if limit.get("metric"):
        shown += f" for {limit['metric']}"
    shown += ", calibrated" if limit.get("calibrated") else ", not calibrated"
    return shown, str(limit.get("source") or "")


def threshold_has_more(res: dict) -> bool:
    """Whether a result's threshold holds more than the limit that decided it (another level, limits per metric,
    a second limit): what the report folds away under that limit."""
    threshold = res.get("threshold")
    if not isinstance(threshold, dict):
        return False
    plain = {"key", "value", "source", "min", "max", "calibrated", "decided"}
    return any(k not in plain for k in threshold) or "key" not in threshold


def busbw_series(results: list[dict]) -> list[dict]:
    """NCCL bus bandwidth curves of one node, one chart each run (group, world size).

    A result counts when its detail has "rows" with size_bytes and busbw_gbps
    (gpufleet.benchmarks.nccl.nccl_judge.nccl). Returns [{"title", "group", "world_size",
    "nnodes", "backend", "lines": [{"label", "status", "points": [(size_bytes, busbw_gbps), ...]}]}].
    """
    charts: dict = {}
    for res in results:
        detail = res.get("detail")
        rows = detail.get("rows") if isinstance(detail, dict) else None
        if not isinstance(rows, list):
            continue
        points = sorted(
            (r["size_bytes"], float(r["busbw_gbps"]))
            for r in rows
            if isinstance(r, dict)
            and _finite(r.get("size_bytes"))
            and r["size_bytes"] > 0
            and _finite(r.get("busbw_gbps"))
        )
        if not points:
            continue
        world, nnodes = detail.get("world_size"), detail.get("nnodes")
        key = (res.get("group"), world, nnodes)
        if key not in charts:
            where = f"{world} ranks" if world else "ranks unknown"
            where += f" over {nnodes} nodes" if isinstance(nnodes, int) and nnodes > 1 else " in one node"
            backend = detail.get("backend")
            charts[key] = {
                "title": f"{res.get('group') or 'nccl'}: bus bandwidth, {where}" + (f" ({backend})" if backend else ""),
                "group": res.get("group"),
                "world_size": world,
                "nnodes": nnodes,
                "backend": backend,
                "lines": [],
            }
        label = res["check"][len("nccl_") :] if res["check"].startswith("nccl_") else res["check"]
        charts[key]["lines"].append({"label": label, "status": res["status"], "points": points})
    return list(charts.values())


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fleet_columns(report: dict) -> list[tuple[str, str, str | None]]:
    """(column, title, unit) of the fleet view that at least one node has a figure for."""
    rows = (report.get("fleet") or {}).get("view") or []
    out = []
    for col, title, _ in VIEW_COLUMNS:
        cells = [r["columns"].get(col) for r in rows if r["columns"].get(col)]
        if cells:
            out.append((col, title, cells[0]["unit"]))
    return out


FLEET_ROWS_MAX = 64  # past this many nodes the fleet view lists only the nodes with a figure that did not pass


def fleet_view_rows(report: dict) -> tuple[list[dict], int]:
    """(the fleet view's rows to list, how many are left out): every node up to FLEET_ROWS_MAX nodes; past that,
    the nodes with a figure the fleet layer did not pass (the distributions show the others; fleet.json has every
    row)."""
    rows = (report.get("fleet") or {}).get("view") or []
    if len(rows) <= FLEET_ROWS_MAX:
        return rows, 0
    shown = [r for r in rows if any(c and c["status"] != schema.PASS for c in r["columns"].values())]
    return shown, len(rows) - len(shown)


def left_out_text(left_out: int, shown: int) -> str:
    return (
        f"{shown} node(s) with a figure that did not pass are listed; the {left_out} other node(s) are in the "
        "distributions above, and every node's figures in fleet.json."
    )


def fleet_cell_parts(cell: dict) -> list[str]:
    """A view cell's figure, then against the fleet median and the baseline: ["791.6", "fleet -2.1% (808.5)", ...]."""
    parts = [figure_text(cell["value"])]
    if cell.get("vs_fleet_pct") is not None:
        parts.append(
            f"fleet {cell['vs_fleet_pct']:+.1f}% ({figure_text(cell['fleet_median'])}, {cell['fleet_n']} nodes)"
        )
    if cell.get("vs_baseline_pct") is not None:
        parts.append(f"baseline {cell['vs_baseline_pct']:+.1f}% ({figure_text(cell['baseline'])})")
    elif cell.get("baseline_fleet_median"):
        pct = (cell["value"] - cell["baseline_fleet_median"]) / cell["baseline_fleet_median"] * 100
        parts.append(f"baseline fleet {pct:+.1f}% ({figure_text(cell['baseline_fleet_median'])})")
    for g in cell.get("gpu_outliers") or []:
        parts.append(f"GPU {g['index'] if g['index'] is not None else '?'} {g['deviation_pct']:+.1f}% vs its node")
    return parts


def fleet_note(report: dict) -> str:
    """One sentence under the fleet view: what the figures are held against."""
    fleet = report.get("fleet") or {}
    base = fleet.get("baseline") or {}
    store = f"store {fleet['store']}" if fleet.get("store") else (fleet.get("store_note") or "no store")
    if base.get("run_id") and not base.get("note"):
        against = f"baseline run {base['run_id']} ({base.get('source')})"
    elif base.get("note") and fleet.get("store_note") and fleet["store_note"] in base["note"]:
        against = "no baseline"  # for the reason the store's sentence gives next: said once
    else:
        against = f"no baseline ({base.get('note') or 'none set'})"
    cpu = any(r.get("cpu") for r in fleet.get("view") or [])
    return (
        f"Each node's figure (slowest GPU where it is per GPU) against this run's fleet median and {against}; "
        f"{store}. WARN and FAIL mark outliers, which the node's fleet.* results explain."
        + (" CPU run: a logic check, not a performance figure." if cpu else "")
        + "".join(f" Store problem during this run: {p}." for p in fleet.get("store_problems") or [])
    )


VERSIONS_TITLE = "Software and firmware"
VERSIONS_HEAD = ("component", "the majority (nodes)", "nodes that differ", "baseline run's")
MAX_DIFFERING = 12  # nodes named in a cell; the node's fleet.versions result and report.json have every one


def versions_note(report: dict) -> str:
    tab = (report.get("fleet") or {}).get("versions") or {}
    base = (
        f"baseline run {tab['baseline_run']}"
        if tab.get("baseline_run")
        else f"no baseline ({tab.get('baseline_note') or 'none set'})"
    )
    return (
        f"One row per component across the {len(tab.get('hosts') or [])} node(s), those with a difference first; "
        f"held against {base}. A difference in NCCL or its net plugin fails the node (it is left out of the NCCL "
        "run across nodes); any other warns."
    )


def versions_rows(report: dict) -> list[dict]:
    """The software and firmware table's rows as text cells (VERSIONS_HEAD), with `differs` true where a node
    differs from the majority or the baseline."""
    tab = (report.get("fleet") or {}).get("versions") or {}
    rows = []
    for row in tab.get("rows") or []:
        named = [f"{d['host']}: {d['value']}" for d in row["differs"]]
        named += [
            f"{d['host']}: {d['value']} (against the baseline)"
            for d in row["baseline_differs"]
            if not any(x["host"] == d["host"] for x in row["differs"])
        ]
        more = len(named) - MAX_DIFFERING
        common = (
            f"{row['majority']} ({row['majority_n']} of {row['n']})"
            if row["majority"] is not None
            else f"no majority among {row['n']} node(s)"
        )
        base = row.get("baseline")
        rows.append(
            {
                "cells": (
                    row["label"],
                    common,
                    "; ".join(named[:MAX_DIFFERING]) + (f"; and {more} more" if more > 0 else ""),
                    f"{base['value']} ({base['n']} of {base['of']})" if base else "",
                ),
                "differs": bool(named),
            }
        )
    return rows


def node_versions_text(node: dict) -> str:
    v = node.get("versions") or {}
    names = (("driver", "driver"), ("cuda_driver", "CUDA"), ("kernel", "kernel"), ("os", "OS"), ("engine", "engine"))
    return ", ".join(f"{label} {v[k]}" for k, label in names if v.get(k))


def fleet_line(report: dict) -> str:
    """The nodes accepted or not, then the results by status, in the node table's columns and with its counts (a
    node is not accepted for an error as for a failure: "1 fail" beside a table of errors read as a contradiction)."""
    by = report["nodes_by_verdict"]
    n = sum(by.values())
    results = ", ".join(f"{(report.get('counts') or {}).get(s, 0)} {s}" for s in STATUS_ORDER)
    if report["verdict"] == schema.FAIL:
        return f"{by[schema.FAIL]} of {n} node(s) not accepted; results: {results}"
    warned = f", {by[schema.WARN]} with warnings" if by.get(schema.WARN) else ""
    return f"all {n} node(s) accepted{warned}; results: {results}"


def node_causes(node: dict) -> list[dict]:
    """The node's causes (causes.grouped), as report.json keeps them or, for a report made before it did, anew."""
    kept = node.get("causes")
    return kept if isinstance(kept, list) else causes.grouped(node["results"])


def findings(node: dict, limit: int = 6) -> tuple[list[str], int]:
    """What the node table says of a node: each cause of its failing results once (causes.label), then the checks
    that warn; (the first `limit`, how many more)."""
    items = [causes.label(g) for g in node_causes(node)]
    items += [check_id(r) for r in node["results"] if r["status"] == schema.WARN]
    return items[:limit], max(0, len(items) - limit)
