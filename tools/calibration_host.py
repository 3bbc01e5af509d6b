"""The host's own figures in the calibration table (tools/calibration_table.py): the memory triad, the scratch
drive and the data loader, per GPU model and topology (the limits are per model and topology, as every relative
limit is: gpufleet.base.calibration). For each: the nodes and clean node-runs that read it, its range, its
run-to-run spread (each node below the median of its own earlier clean figures: node_vs_past_pct, which sets its
limit), the limit today's profile gives its drop against its past and whether calibration set it from MIN_N figures
of its own (until then a drop is information, not a warning: comparisons/trusted.py), and its false alarms on the
clean runs: recorded (the run's report warned or failed a comparison naming the figure) and today (today's judge,
comparisons.baseline, holding each clean node-run against its node's first clean run, as a site's first accepted run
becomes its baseline), beside the figures the leave-one-machine-out check finds above the other machines' limit.
README.md's rows of host figures are these (`--readme`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from calibration_limits import by_topology
from calibration_rows import condition
from calibration_spread import measured_of, node_of
from gpufleet.base import calibration, profiles
from gpufleet.comparisons import metric_keys
from gpufleet.comparisons import metrics as fleet_metrics
from gpufleet.comparisons.against import Against
from gpufleet.comparisons.baseline import baseline_index, node_vs_baseline_rows
from gpufleet.comparisons.thresholds import BASE_WARN, Thresholds

MEASURE = "node_vs_past_pct"
BEGIN = "<!-- host figures: written by tools/calibration_table.py --readme; edit the tool, not these rows -->"
END = "<!-- end of host figures -->"


def _baseline(node: str, first: tuple) -> Against:
    """A node's first clean run as the baseline it is held against (comparisons.baseline's rows of the store)."""
    run_id, found = first
    rows = [
        {"host": node, "metric": m["key"], "context": m["context"], "value": m["value"], "uuid": None}
        | {"gpu_index": None, "cpu": False, "unit": m["unit"]}
        for m in found
    ]
    return Against(base_id=run_id, base_index=baseline_index(rows))


def host_figures(model: str, rows: list[dict], profile_dir: Path | None, held: dict) -> list[dict]:
    """One row a topology and host figure: the module docstring's columns (held: calibration_limits.held_out())."""
    above = {(h["measure"], h["metric"]): h for h in held["figures"]}
    out = []
    for shape, members in sorted(by_topology(rows).items()):
        gpus = int(shape.removesuffix("gpu"))
        thresholds = Thresholds(profiles.resolve(model, profile_dir=profile_dir, gpus=gpus)["thresholds"])
        spread = measured_of(members).get(MEASURE, {})
        figures: dict = defaultdict(lambda: {"values": [], "nodes": set(), "fa_rec": 0, "fa_now": 0, "info_now": 0})
        first: dict[str, tuple] = {}
        for r in (r for r in members if condition(r) == "clean"):
            found = fleet_metrics.extract(r["document"])["metrics"]
            mine = [m for m in found if m["key"] in metric_keys.HOST_METRICS and m["scope"] == "node" and not m["cpu"]]
            if not mine:
                continue
            node = node_of(r, found)
            said = " ".join(
                str(p.get("reason"))
                for p in (r.get("report") or {}).get("not_passing") or []
                if p.get("group") == "fleet"
            )
            base = first.setdefault(node, (r["round"], mine))
            today = (
                {}
                if base[0] == r["round"]
                else {
                    c["metric"]: c["status"]
                    for c in node_vs_baseline_rows(r["node"], {"metrics": mine}, thresholds, _baseline(r["node"], base))
                }
            )
            for m in mine:
                f = figures[m["key"]]
                f["values"].append(m["value"])
                f["nodes"].add(node)
                f["fa_rec"] += metric_keys.describe(m["key"])["label"] in said
                f["fa_now"] += today.get(m["key"]) in ("warn", "fail")
                f["info_now"] += today.get(m["key"]) == "info"
        for metric, f in sorted(figures.items()):
            held_out = above.get((MEASURE, metric)) or {}
            out.append(
                {
                    "model": model,
                    "topology": shape,
                    "metric": metric,
                    "label": metric_keys.describe(metric)["label"],
                    "unit": metric_keys.describe(metric)["unit"],
                    "nodes": len(f["nodes"]),
                    "runs": len(f["values"]),
                    "range": (min(f["values"]), max(f["values"])),
                    "spread": spread.get(metric),
                    "limit": thresholds.value(BASE_WARN, metric),
                    "calibrated": thresholds.calibrated_own(BASE_WARN, metric),
                    "fa_rec": f["fa_rec"],
                    "fa_now": f["fa_now"],
                    "info_now": f["info_now"],
                    "held_out": (held_out.get("above", 0), held_out.get("figures", 0)),
                }
            )
    return out


def _range(row: dict) -> str:
    lo, hi = row["range"]
    scale = 1e6 if row["unit"] == "tokens/s/GPU" else 1
    unit = "M tokens/s a GPU" if scale > 1 else row["unit"]
    return f"{lo / scale:.4g}{'' if lo == hi else f'-{hi / scale:.4g}'} {unit}"


def _spread(row: dict) -> str:
    s = row["spread"]
    return f"{s['n']}: {s['median']:g}, {s['p95']:g}, {s['value']:g}" if s else "0"


def _limit(row: dict) -> str:
    if row["calibrated"]:
        return f"{row['limit']:g}% (calibrated)"
    return f"{row['limit']:g}%, not calibrated: a drop is information"


def render(host_rows: list[dict]) -> list[str]:
    """The table's lines of one model's host figures."""
    if not host_rows:
        return ["Host figures: none in the clean node-runs (the host step ran in none of them)."]
    lines = [
        "Host figures (comparisons/trusted.py): each clean node-run's figure, its node below the median of its own "
        "earlier clean figures (the run-to-run spread that sets `fleet_below_baseline_warn_pct` for it: figures, "
        f"median, p95, largest, %), the limit today's profile gives (calibrated from {calibration.MIN_N} figures of "
        "its own, else a drop is information), its false alarms on the clean runs as recorded and today (today's judge "
        "holding each run against its node's first clean run; `information` beside them), and its figures above the "
        "limit the other machines give (leave one machine out):",
        "",
        "| topology | figure | nodes | clean runs | range | below its own past | limit today | false alarms "
        "recorded | false alarms today | information today | above the others' limit |",
        "| --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in host_rows:
        lines.append(
            f"| {r['topology']} | {r['label']} | {r['nodes']} | {r['runs']} | {_range(r)} | {_spread(r)} | "
            f"{_limit(r)} | {r['fa_rec']} | {r['fa_now']} | {r['info_now']} | "
            f"{r['held_out'][0]} of {r['held_out'][1]} |"
        )
    return lines


def readme_rows(host_rows: list[dict]) -> list[str]:
    """README.md's rows of host figures: every model's, one a topology and figure."""
    lines = [
        BEGIN,
        "| GPU model, node | host figure | nodes, clean runs | range | below its own past: figures, median, p95, "
        "largest (%) | limit today | false alarms recorded / today |",
        "| --- | --- | ---: | --- | --- | --- | ---: |",
    ]
    for r in host_rows:
        lines.append(
            f"| {r['model']}, {r['topology'].removesuffix('gpu')} GPU(s) | {r['label']} | {r['nodes']}, {r['runs']} | "
            f"{_range(r)} | {_spread(r)} | {_limit(r)} | {r['fa_rec']} / {r['fa_now']} |"
        )
    return [*lines, END]


def write_readme(path: Path, host_rows: list[dict]) -> None:
    """README.md with its rows of host figures (between BEGIN and END) made again; a README without those lines is
    refused, naming them."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no rows of host figures to replace (the lines {BEGIN!r} and {END!r})")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(head + "\n".join(readme_rows(host_rows)) + tail)
