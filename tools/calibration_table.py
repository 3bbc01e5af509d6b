"""The calibration table: what each check says on healthy GPUs and on disturbed ones, per GPU model, and the
healthy spread that gives each relative limit its default.

Reads the node-runs tools/gpu_calibrate.py appended (one or more JSON-lines files: runs of different machines
and days add up) and writes:
  --table   Markdown (docs/results/calibration/table.md): per GPU model, per check, the node-runs, the false
            alarms on clean runs and the detections on disturbed runs (the node's own GPUs disturbed), each as the
            recorded run said and as today's judges say of the same figures (REPLAYED: benchmarks.replay, the fleet
            layer over each round), and the healthy spread per sample, per GPU against its siblings, per node
            against the round's other nodes and against its own past, with the limit each gives (calibration.py), and
            the fabric error counters' healthy rates beside their limits (calibration_counters.py; with --soaks, the
            soaks' too);
  --limits  the folder of the per-model calibration files the engine reads (files/profiles/calibration/): per
            measure and metric the largest healthy figure, how many figures, and the runs they came from;
  --readme  README.md, its rows of host figures (calibration_host.py: the host's own figures' spread, limits and
            false alarms) made again.
The calibration is written first and the replay reads it (where --limits is the calibration folder of
--profile-dir): the replayed false alarms are in-sample (the limits come from these very runs), the detections
are not. The parts: calibration_rows.py reads the node-runs, calibration_spread.py measures the healthy spread,
calibration_outcomes.py counts what each check said, recorded and today, calibration_limits.py writes the calibration
files and holds each machine against the limits the others give, calibration_host.py tabulates the host's own figures,
calibration_counters.py rates the counters.

  python3 tools/calibration_table.py docs/results/calibration [more.jsonl ...] \\
      --table docs/results/calibration/table.md --limits files/profiles/calibration [--json table.json] \\
      [--soaks docs/results/calibration/*-soak.json.gz] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import calibration, profiles  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import calibration_counters  # noqa: E402
import calibration_host  # noqa: E402
from calibration_limits import generic_limits, held_out, write_limits  # noqa: E402
from calibration_outcomes import NEEDS_STORE, outcomes, replay_round  # noqa: E402
from calibration_rows import condition, data_files, machines, model_of, read_rows  # noqa: E402
from calibration_spread import SETS, measured_of  # noqa: E402


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
        lines += calibration_host.render(m["host_figures"])
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
    p.add_argument("--readme", type=Path, help="README.md whose rows of host figures to write again")
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
            write_limits(args.limits, model, profile, measured, mrows, files, str(args.table))
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
        held = held_out(mrows, generic)
        m.update(
            host_figures=calibration_host.host_figures(model, mrows, args.profile_dir, held) if m["profile"] else [],
            outcomes=outcomes(mrows, today),
            runs=len(mrows),
            rounds=len(rounds),
            clean=sum(condition(r) == "clean" for r in mrows),
            disturbed=sum(condition(r) == "disturbed" for r in mrows),
            beside=sum(condition(r) == "beside" for r in mrows),
            machines=len(set(machines(mrows))),
            held_out=held,
            commits=sorted({(r.get("commit") or "?")[:8] for r in mrows}),
            wall_s={c: _median([r.get("wall_s") for r in mrows if condition(r) == c]) for c in ("clean", "disturbed")},
        )
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(render(by_model, files + [str(f) for f in args.soaks], problems, generic))
    if args.json:
        args.json.write_text(json.dumps(by_model, indent=1, default=str) + "\n")
    if args.readme:
        calibration_host.write_readme(args.readme, [h for m in by_model.values() for h in m["host_figures"]])
    print(
        f"{len(rows)} node-runs of {len(by_model)} GPU model(s) -> {args.table}"
        + (f", {args.limits}" if args.limits else "")
        + (f"; {len(problems)} line(s) not read" if problems else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
