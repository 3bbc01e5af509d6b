"""The calibration table: what each check says on healthy GPUs and on disturbed ones, per GPU model, and the
healthy spread that gives each relative limit its default.

Reads the node-runs tools/gpu_calibrate.py appended (one or more JSON-lines files: runs of different machines
and days add up) and writes:
  --table   Markdown (docs/results/calibration/table.md): per GPU model, per check, the node-runs, the false
            alarms on clean runs and the detections on disturbed runs (the node's own GPUs disturbed), each as the
            recorded run said and as today's judges say of the same figures (REPLAYED: checks.replay, the fleet
            layer over each round), and the healthy spread per sample, per GPU against its siblings, per node
            against the round's other nodes and against its own past, with the limit each gives (calibration.py), and
            the fabric error counters' healthy rates beside their limits (calibration_counters.py; with --soaks, the
            soaks' too);
  --limits  the folder of the per-model calibration files the engine reads (files/profiles/calibration/): per
            measure and metric the largest healthy figure, how many figures, and the runs they came from.
The calibration is written first and the replay reads it (where --limits is the calibration folder of
--profile-dir): the replayed false alarms are in-sample (the limits come from these very runs), the detections
are not.

  python3 tools/calibration_table.py docs/results/calibration [more.jsonl ...] \\
      --table docs/results/calibration/table.md --limits files/profiles/calibration [--json table.json] \\
      [--soaks docs/results/calibration/*-soak.json.gz]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import calibration, profiles  # noqa: E402
from gpufleet.checks import replay  # noqa: E402
from gpufleet.checks.soak import slowdown as soak_slowdown  # noqa: E402
from gpufleet.fleet import compare  # noqa: E402
from gpufleet.comparisons import metrics as fleet_metrics  # noqa: E402
from gpufleet.base.judge import ISOLATED_DEPTH_FACTOR, below_pct  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import calibration_counters  # noqa: E402
from calibration_from_runs import inventory_of  # noqa: E402


class _IndentedDumper(yaml.SafeDumper):
    """Indents lists under their key, as ansible-lint's yaml rule asks of files in the collection."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


FORMAT = "gpufleet-calibration/1"
NOT_PASSING = ("warn", "fail", "error")
# The fleet checks that hold a node against the store (its baseline, its past): the replay has no store, so today's
# columns say nothing of them ("-").
NEEDS_STORE = (
    "fleet.node_vs_baseline",
    "fleet.node_vs_baseline_fleet",
    "fleet.counters_since_previous_run",
    "fleet.fabric_since_previous_run",
    "fleet.returning_gpu",
)
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


def data_files(paths: list[Path]) -> list[Path]:
    """The files named, a folder's *.jsonl and *.jsonl.gz in name order."""
    out = []
    for path in paths:
        out += sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")]) if path.is_dir() else [path]
    return out


def read_rows(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Every node-run of the files (gzip where the name ends .gz), in file order; and what could not be read, line
    by line."""
    rows, problems = [], []
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                problems.append(f"{path}:{n}: not JSON ({exc})")
                continue
            if not isinstance(row, dict) or row.get("format") != FORMAT or not isinstance(row.get("document"), dict):
                problems.append(f"{path}:{n}: not a {FORMAT} node-run with a document")
                continue
            row["_file"] = str(path)
            rows.append(row)
    return rows, problems


def model_of(row: dict) -> str:
    return (row.get("machine") or {}).get("gpu_model") or "unknown"


def machine_of(row: dict) -> str:
    m = row.get("machine") or {}
    return f"{m.get('host')}|{m.get('gpu_model')}|{m.get('gpus_on_machine')}"


def machines(rows: list[dict]) -> list[int]:
    """Each row's machine (a number), told apart by its GPUs: lent machines share the host name `vm`, and
    calibration_from_runs names the machine of a run folder itself, so the same GPUs under two names are one machine.
    A round's GPUs are one machine's; rounds that share a GPU are the same machine."""
    by_round: dict = defaultdict(set)
    for r in rows:
        uuids = {g.get("uuid") for g in (inventory_of(r.get("document") or {}).get("gpus") or [])} - {None}
        by_round[(r.get("round"), machine_of(r))] |= uuids or {machine_of(r)}
    groups: list[set] = []
    for found in by_round.values():
        for g in [g for g in groups if g & found]:
            groups.remove(g)
            found |= g
        groups.append(found)
    where = {key: next(n for n, g in enumerate(groups) if found <= g) for key, found in by_round.items()}
    return [where[(r.get("round"), machine_of(r))] for r in rows]


def condition(row: dict) -> str:
    """clean; disturbed (this node's GPUs); beside (another node's GPUs disturbed in the same round)."""
    if row.get("condition") == "clean":
        return "clean"
    return "disturbed" if row.get("node_affected") else "beside"


# ---------------------------------------------------------------- healthy spread


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
        gpus = ",".join(sorted({m["uuid"] for m in metrics if m["scope"] == "gpu" and m.get("uuid")}))
        for m in metrics:
            if m["cpu"] or m["shared"] or m["value"] <= 0:
                continue
            who = m["uuid"] if m["scope"] == "gpu" else f"{machine_of(r)}|{r['node']}|{gpus}"
            if not who:
                continue
            key = (who, m["key"], m["context"])
            if past[key]:
                out["node_vs_past_pct"][m["key"]].append(
                    (round(max(0.0, below_pct(m["value"], statistics.median(past[key]))), 2), r["round"])
                )
            past[key].append(m["value"])
    return out


def soak_windows(doc: dict) -> dict[str, list[float]]:
    """A clean soak's windows below their own best windows' median (checks.soak.slowdown's reference), per figure."""
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
            windows = windows[1:]  # its first window holds that cold round (bench/soak/outcome.py), never a window's
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


# ---------------------------------------------------------------- replay


def replay_round(members: list[dict], run_id: str, profile_dir: Path | None) -> dict[str, list[dict]]:
    """{node: today's results}: each node's benchmark figures judged again, then the fleet layer over the round."""
    nodes = {}
    for r in members:
        doc = r["document"]
        prof = doc.get("profile") or {}
        overrides = {
            k: e["value"]
            for k, e in (prof.get("thresholds") or {}).items()
            if isinstance(e, dict) and str(e.get("source", "")).startswith("inventory override")
        }
        try:
            profile = profiles.resolve(
                None, profile_name=prof.get("name") or profiles.GENERIC, overrides=overrides, profile_dir=profile_dir
            )
        except profiles.ProfileError:
            profile = profiles.resolve(None, profile_name=profiles.GENERIC, profile_dir=profile_dir)
        results = [x for x in replay.benchmark_results(doc.get("results") or [], profile) if x.get("group") != "fleet"]
        nodes[r["node"]] = {
            "results": results,
            "profile": {"name": profile["name"], "thresholds": profile["thresholds"]},
            "versions": doc.get("versions") or {},
        }
    fleet = compare.evaluate(run_id, nodes, store=None, store_note="replayed without the store of the calibration run")
    return {node: n["results"] + fleet["results"].get(node, []) for node, n in nodes.items()}


def recorded_statuses(row: dict) -> tuple[dict[str, str], set[str]]:
    """(each check's status as the run's report said it, the checks the report accepted that the node's document
    did not: a stable fact the baseline had accepted, held against the store and not warned again)."""
    out = {}
    for res in row["document"].get("results") or []:
        out[f"{res.get('group')}.{res.get('check')}"] = res.get("status")
    report = row.get("report") or {}
    listed = {f"{f.get('group')}.{f.get('check')}": f.get("status") for f in report.get("not_passing") or []}
    accepted = set()
    if "not_passing" in report:
        accepted = {check for check, status in out.items() if status in NOT_PASSING and check not in listed}
        out.update(dict.fromkeys(accepted, "info"))
    out.update(listed)
    return out, accepted


def verdict_of(statuses: dict) -> str:
    values = set(statuses.values())
    return "fail" if values & {"fail", "error"} else "warn" if "warn" in values else "pass"


def names_process(statuses: dict, results: list[dict] | None = None) -> bool:
    return any(k.endswith(("_processes", ".processes", "processes_after")) for k, s in statuses.items() if s == "fail")


# ---------------------------------------------------------------- the table


def outcomes(rows: list[dict], today: dict) -> dict:
    """Per check: clean runs, false alarms, disturbed runs, detections (recorded, today); and the node verdicts."""
    table: dict = defaultdict(
        lambda: {
            "clean": 0,
            "fa_rec": 0,
            "fa_now": 0,
            "disturbed": 0,
            "det_rec": 0,
            "det_now": 0,
            "beside": 0,
            "beside_rec": 0,
            "beside_now": 0,
        }
    )
    for r in rows:
        cond = condition(r)
        rec, accepted = recorded_statuses(r)
        now = {f"{x.get('group')}.{x.get('check')}": x.get("status") for x in today.get((r["round"], r["node"]), [])}
        # The replay has no store: what the report accepted against it stays accepted where today judged it the same.
        doc = {f"{x.get('group')}.{x.get('check')}": x.get("status") for x in r["document"].get("results") or []}
        now.update({c: "info" for c in accepted if now.get(c) == doc.get(c)})
        rec["node verdict"] = (r.get("report") or {}).get("verdict") or verdict_of(rec)
        now["node verdict"] = verdict_of(now) if now else rec["node verdict"]
        rec["node not accepted, process named"] = (
            "fail" if rec["node verdict"] in ("fail", "error") and names_process(rec) else "pass"
        )
        now["node not accepted, process named"] = (
            "fail" if now["node verdict"] in ("fail", "error") and names_process(now) else "pass"
        )
        for check in set(rec) | set(now):
            t = table[check]
            bad_rec, bad_now = rec.get(check) in NOT_PASSING, now.get(check) in NOT_PASSING
            if cond == "clean":
                t["clean"] += 1
                t["fa_rec"] += bad_rec
                t["fa_now"] += bad_now
            elif cond == "disturbed":
                t["disturbed"] += 1
                t["det_rec"] += bad_rec
                t["det_now"] += bad_now
            else:
                t["beside"] += 1
                t["beside_rec"] += bad_rec
                t["beside_now"] += bad_now
    return table


def generic_limits(profile_dir: Path | None) -> dict:
    base = profiles.resolve(None, profile_name=profiles.GENERIC, profile_dir=profile_dir)["thresholds"]
    return {k: base[k]["value"] for k in calibration.MEASURE_OF if k in base}


def held_out(rows: list[dict], generic: dict) -> dict:
    """Each machine judged on the limits the other machines' clean runs give (leave one machine out): per measure
    and metric, the machines and figures held out, how many lie above that limit, and the worst of them; and the
    clean rounds with any figure above. The figure a limit is compared with is the one the calibration measures
    (calibration.MEASURE_OF), so a figure above it is one the judge would not pass; where the others set no
    limit, the generic one applies."""
    clean = [r for r in rows if condition(r) == "clean"]
    ids = machines(clean)
    out: dict = {}
    rounds_above: set = set()
    for machine in sorted(set(ids)):
        rest = spreads([r for r, m in zip(clean, ids) if m != machine])
        for measure, metrics in spreads([r for r, m in zip(clean, ids) if m == machine]).items():
            key = SETS[measure][0]  # the warn level (node_vs_past also sets confirm_band_pct)
            for metric, figs in metrics.items():
                ref = rest.get(measure, {}).get(metric)
                limit = calibration.limit_for(summarize(ref), generic.get(key)) if ref else None
                limit = generic.get(key) if limit is None else limit
                if not figs or limit is None:
                    continue
                t = out.setdefault((measure, metric), {"machines": 0, "figures": 0, "above": 0, "worst": None})
                t["machines"] += 1
                t["figures"] += len(figs)
                above = [(v, where) for v, where in figs if v > limit]
                t["above"] += len(above)
                rounds_above |= {where.split("/")[0] for _, where in above}
                worst = max((v for v, _ in above), default=None)
                if worst is not None and (t["worst"] is None or worst - limit > t["worst"][0] - t["worst"][1]):
                    t["worst"] = (worst, limit)
    return {
        "figures": [{"measure": measure, "metric": metric, **t} for (measure, metric), t in sorted(out.items())],
        "rounds": len({r["round"] for r in clean}),
        "rounds_above": sorted(rounds_above),
    }


def topology(row: dict) -> str | None:
    """The node's topology as calibration keys it: its GPU count (calibration.topology_of)."""
    m = row.get("machine") or {}
    return calibration.topology_of(len(m.get("node_gpus") or []) or m.get("gpus_on_machine"))


def measured_of(rows: list[dict]) -> dict:
    """{measure: {metric: summarize()}} of these rows' clean runs."""
    return {
        measure: {metric: summarize(figs) for metric, figs in metrics.items() if figs}
        for measure, metrics in spreads(rows).items()
    }


def _measures_doc(measured: dict, source: str) -> dict:
    return {
        measure: {
            metric: {
                "quantile": 1.0,
                "value": s["value"],
                "n": s["n"],
                "p95": s["p95"],
                "median": s["median"],
                "source": f"{source}; largest at {s['at']}",
            }
            for metric, s in sorted(metrics.items())
        }
        for measure, metrics in sorted(measured.items())
        if metrics
    }


def limits_file(model: str, profile: str, measured: dict, rows: list[dict], files: list[str], table_path: str) -> dict:
    rounds = sorted({r["round"] for r in rows if condition(r) == "clean"})
    commits = sorted({r.get("commit") or "?" for r in rows})
    source = f"{', '.join(files)}: {len(rounds)} clean round(s) {rounds[0] if rounds else ''}..{rounds[-1] if rounds else ''}"
    return {
        "format": calibration.FORMAT,
        "profile": profile,
        "gpu_models": [model],
        "table": table_path,
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": {
            "files": files,
            "clean_rounds": len(rounds),
            "commits": commits,
            "machines": sorted({machine_of(r) for r in rows}),
        },
        "measures": _measures_doc(measured, source),
        # Each topology's own figures (calibration.py: its limit where it has enough, else the model's, widened by
        # them where they show it too tight).
        "topologies": {
            shape: {"measures": _measures_doc(measured_of(members), f"{shape} nodes of {source}")}
            for shape, members in sorted(by_topology(rows).items())
        },
    }


def by_topology(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict = defaultdict(list)
    for r in rows:
        shape = topology(r)
        if shape:
            out[shape].append(r)
    return out


def render(by_model: dict, files: list[str], problems: list[str], generic: dict) -> str:
    lines = [
        "# Calibration table",
        "",
        f"From {', '.join(f'`{f}`' for f in files)} by `tools/calibration_table.py`. Per GPU model: each check's "
        "node-runs, its false alarms on clean runs (`warn`, `fail` or `error` where nothing was disturbed) and its "
        "detections on disturbed runs (the disturbance ran on the node's own GPUs), and what did not pass on the nodes "
        "beside a disturbed one (another node of the same machine); *recorded* is what the run said, "
        "*today* what today's judges say of the same figures (the benchmark figures and the fleet layer judged again; "
        "the other checks as recorded; `-` for the checks that hold a node against the store, which the replay has "
        "not). Today's false alarms are in-sample: the calibrated limits come from these runs.",
        "",
    ]
    if problems:
        lines += [f"Lines not read: {len(problems)} (" + "; ".join(problems[:5]) + ")", ""]
    for model, m in by_model.items():
        lines += [
            f"## {model}",
            "",
            f"Profile `{m['profile'] or 'none (no profile matches: not calibrated)'}`; "
            f"{m['runs']} node-runs ({m['clean']} clean, {m['disturbed']} disturbed, {m['beside']} beside a disturbed "
            f"node) in {m['rounds']} rounds on {m['machines']} machine(s); commits {', '.join(m['commits'])}; node "
            f"stage median {m['wall_s']['clean']} s clean, {m['wall_s']['disturbed']} s disturbed.",
            "",
            "| check | clean runs | false alarms recorded | false alarms today | disturbed runs | detections recorded | "
            "detections today | beside runs | not passing recorded | not passing today |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for check, t in sorted(m["outcomes"].items(), key=lambda kv: (not kv[0].startswith("node "), kv[0])):
            now = ("-", "-", "-") if check in NEEDS_STORE else (t["fa_now"], t["det_now"], t["beside_now"])
            lines.append(
                f"| `{check}` | {t['clean']} | {t['fa_rec']} | {now[0]} | {t['disturbed']} | {t['det_rec']} | "
                f"{now[1]} | {t['beside']} | {t['beside_rec']} | {now[2]} |"
            )
        lines += [
            "",
            "Healthy spread (percent; clean runs), and the limit it gives (x"
            f"{calibration.MARGIN_FACTOR:g} + {calibration.MARGIN_PCT:g}, from {calibration.MIN_N} figures on; from "
            "fewer, only where it is above the generic limit, marked *widens*):",
            "",
            "| measure | metric | figures | median | p95 | largest | limit | generic | sets |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for measure, metrics in sorted(m["measured"].items()):
            for metric, s in sorted(metrics.items()):
                keys = SETS[measure]
                # one limit a key, as calibration.apply sets them: few figures may widen one key's and not another's
                few = " *widens*" if s["n"] < calibration.MIN_N else ""
                limits = [calibration.limit_for(s, generic.get(k)) for k in keys]
                limit = ", ".join("-" if v is None else f"{v:g}{few}" for v in limits)
                lines.append(
                    f"| {measure} | {metric} | {s['n']} | {s['median']:g} | {s['p95']:g} | {s['value']:g} | {limit} | "
                    f"{', '.join(str(generic.get(k)) for k in keys)} | {', '.join(f'`{k}`' for k in keys)} |"
                )
        held = m["held_out"]["figures"]
        above = [h for h in held if h["above"]]
        lines += [
            "",
            f"Each machine against the limits the other machines give (leave one machine out, clean runs): "
            f"{sum(h['figures'] for h in held)} figures of {len(held)} measure-metrics held out, "
            f"{sum(h['above'] for h in above)} above the others' limit, in {len(m['held_out']['rounds_above'])} of "
            f"{m['held_out']['rounds']} clean rounds" + (":" if above else "."),
            "",
        ]
        if above:
            lines += [
                "| measure | metric | machines | figures | above | worst: figure, limit |",
                "| --- | --- | ---: | ---: | ---: | --- |",
            ]
            lines += [
                f"| {h['measure']} | {h['metric']} | {h['machines']} | {h['figures']} | {h['above']} | "
                f"{h['worst'][0]:g}, {h['worst'][1]:g} |"
                for h in above
            ]
            lines.append("")
        lines += calibration_counters.render(m["counter_rates"], m["counter_limits"])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _median(values: list) -> float | str:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 1) if values else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "data",
        nargs="+",
        type=Path,
        help="JSON-lines files of tools/gpu_calibrate.py (.jsonl or .jsonl.gz), or folders of them",
    )
    p.add_argument("--table", type=Path, required=True, help="the Markdown table to write")
    p.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="the profiles today's judges read (default: the engine's, files/profiles)",
    )
    p.add_argument(
        "--limits",
        type=Path,
        help="folder to write the per-model calibration files to (the engine reads "
        "<profile folder>/calibration: files/profiles/calibration)",
    )
    p.add_argument("--json", type=Path, help="the table as JSON too")
    p.add_argument(
        "--soaks",
        nargs="*",
        type=Path,
        default=[],
        help="soak documents (.json or .json.gz) whose counters to tabulate",
    )
    p.add_argument("--include-cpu", action="store_true", help="count CPU runs (a check of this script, no calibration)")
    args = p.parse_args(argv)
    missing = [str(f) for f in [*args.data, *args.soaks] if not f.exists()]
    if missing:
        p.error(f"no such data file or folder: {', '.join(missing)}")
    paths = data_files(args.data)
    rows, problems = read_rows(paths)
    files = [str(f) for f in paths]
    by_model_rows: dict = defaultdict(list)
    for r in rows:
        if model_of(r) != "cpu" or args.include_cpu:
            by_model_rows[model_of(r)].append(r)
    known = profiles.load_all(args.profile_dir)
    generic = generic_limits(args.profile_dir)
    base = profiles.resolve(None, profile_name=profiles.GENERIC, profile_dir=args.profile_dir)["thresholds"]
    counter_limits = {k: base[k]["value"] for k in calibration_counters.LIMIT_KEYS if k in base}
    soaks = calibration_counters.read_soaks(args.soaks)
    by_model = {}
    for model, mrows in sorted(by_model_rows.items()):
        profile = profiles.match(known, model)
        measured = measured_of(mrows)
        if args.limits and profile:
            args.limits.mkdir(parents=True, exist_ok=True)
            mine = {r["_file"] for r in mrows}  # this model's runs alone
            doc = limits_file(model, profile, measured, mrows, [f for f in files if f in mine], str(args.table))
            (args.limits / f"{profile}.yml").write_text(
                "# Written by tools/calibration_table.py from the calibration runs; see its table.\n"
                + yaml.dump(doc, Dumper=_IndentedDumper, sort_keys=False, width=60)
            )
        clean_docs = [r["document"] for r in mrows if condition(r) == "clean"]
        by_model[model] = {
            "profile": profile,
            "measured": measured,
            "rows": mrows,
            "counter_rates": calibration_counters.model_rates(clean_docs, soaks.get(model, {})),
            "counter_limits": counter_limits,
        }
    for model, m in by_model.items():  # after every calibration file is written: today's judges read them
        mrows = m.pop("rows")
        today = {}
        rounds: dict = defaultdict(list)
        for r in mrows:
            rounds[r["round"]].append(r)
        for rnd, members in rounds.items():
            for node, results in replay_round(members, rnd, args.profile_dir).items():
                today[(rnd, node)] = results
        m.update(
            outcomes=outcomes(mrows, today),
            runs=len(mrows),
            rounds=len(rounds),
            clean=sum(condition(r) == "clean" for r in mrows),
            disturbed=sum(condition(r) == "disturbed" for r in mrows),
            beside=sum(condition(r) == "beside" for r in mrows),
            machines=len(set(machines(mrows))),
            held_out=held_out(mrows, generic),
            commits=sorted({(r.get("commit") or "?")[:8] for r in mrows}),
            wall_s={c: _median([r.get("wall_s") for r in mrows if condition(r) == c]) for c in ("clean", "disturbed")},
        )
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(render(by_model, files + [str(f) for f in args.soaks], problems, generic))
    if args.json:
        args.json.write_text(json.dumps(by_model, indent=1, default=str) + "\n")
    print(
        f"{len(rows)} node-runs of {len(by_model)} GPU model(s) -> {args.table}"
        + (f", {args.limits}" if args.limits else "")
        + (f"; {len(problems)} line(s) not read" if problems else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
