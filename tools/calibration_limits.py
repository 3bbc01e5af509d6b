"""The per-model calibration files tools/calibration_table.py writes (files/profiles/calibration/: per measure and
metric the largest healthy figure, per topology too), and each machine judged on the limits the others give."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path

import yaml
from calibration_rows import condition, machine_of, machines
from calibration_spread import SETS, measured_of, spreads, summarize
from gpufleet.base import calibration, profiles


class _IndentedDumper(yaml.SafeDumper):
    """Indents lists under their key, as ansible-lint's yaml rule asks of files in the collection."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


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


def write_limits(
    folder: Path, model: str, profile: str, measured: dict, rows: list[dict], files: list[str], table_path: str
) -> None:
    """<folder>/<profile>.yml: the calibration file of one GPU model, from its own runs alone."""
    folder.mkdir(parents=True, exist_ok=True)
    mine = {r["_file"] for r in rows}  # this model's runs alone
    doc = limits_file(model, profile, measured, rows, [f for f in files if f in mine], table_path)
    (folder / f"{profile}.yml").write_text(
        "# Written by tools/calibration_table.py from the calibration runs; see its table.\n"
        + yaml.dump(doc, Dumper=_IndentedDumper, sort_keys=False, width=60)
    )
