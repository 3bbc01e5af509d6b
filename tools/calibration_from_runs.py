"""Calibration lines from ordinary run folders: the clean node-runs of a validate (or `make validate`) kept under
docs/results/, in the format tools/gpu_calibrate.py appends, so that tools/calibration_table.py counts them.

A run counts as clean only by what it measured, never by its verdict (leaving out the runs that warned would hide
the false alarms the table exists to count): every process check of the node (gpu_health.processes, the
benchmarks' processes, counters.processes_after) passed or was skipped, that is no foreign process was seen on its
GPUs. A node-run that saw one is left out and said so. The machine is named by the caller (--machine): a run
folder does not say which lease or host it ran on.

  python3 tools/calibration_from_runs.py RUN_DIR [RUN_DIR ...] --machine NAME [--commit SHA] --out FILE.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import registry  # noqa: E402

FORMAT = "gpufleet-calibration/1"  # tools/gpu_calibrate.py's
# gpu_health.processes, every watched benchmark's <step>_processes (the soak's and the training gate's too), and
# counters.processes_after.
PROCESS_CHECKS = ("processes", "processes_after") + tuple(c.name for c in registry.watched_checks())


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a readable JSON document ({exc})") from None
    return doc if isinstance(doc, dict) else {}


def inventory_of(doc: dict) -> dict:
    for res in doc.get("results") or []:
        inv = (res.get("detail") or {}).get("inventory") if isinstance(res.get("detail"), dict) else None
        if isinstance(inv, dict) and inv.get("gpus"):
            return inv
    return {}


def _tier(doc: dict) -> str | None:
    for res in doc.get("results") or []:
        tier = (res.get("detail") or {}).get("tier") if isinstance(res.get("detail"), dict) else None
        if tier:
            return tier
    return None


def foreign_seen(doc: dict) -> list[str]:
    """The process checks of the node-run that did not pass: a foreign process was seen (or could not be ruled out)."""
    return [
        f"{r.get('group')}.{r['check']} {r.get('status')}"
        for r in doc.get("results") or []
        if r.get("check") in PROCESS_CHECKS and r.get("status") not in ("pass", "skip")
    ]


def rows_of(run_dir: Path, machine: str, commit: str | None = None) -> tuple[list[dict], list[str]]:
    """(a calibration line per clean node-run of the run folder, what was left out and why)."""
    hosts = sorted((run_dir / "hosts").glob("*.json"))
    if not hosts:
        raise SystemExit(f"{run_dir}: no hosts/*.json: expected a run folder of gpufleet validate")
    report = _read(run_dir / "report.json") if (run_dir / "report.json").is_file() else {}
    run_id = report.get("run_id") or (
        _read(run_dir / "run.json").get("run_id") if (run_dir / "run.json").is_file() else run_dir.name
    )
    rows, left_out = [], []
    for path in hosts:
        doc = _read(path)
        node = doc.get("host") or path.stem
        seen = foreign_seen(doc)
        if seen:
            left_out.append(f"{run_dir}/{node}: not clean ({', '.join(seen)})")
            continue
        inv = inventory_of(doc)
        gpus = inv.get("gpus") or []
        entry = (report.get("nodes") or {}).get(node) or {}
        rows.append(
            {
                "format": FORMAT,
                "round": f"{run_id}-run-clean",
                "node": node,
                "layout": "node",
                "seed": None,
                "machine": {
                    "gpu_model": gpus[0].get("name") if gpus else "unknown",
                    "gpus_on_machine": len(gpus),
                    "driver": inv.get("driver_version"),
                    "host": machine,
                    "node_gpus": [g.get("index") for g in gpus],
                },
                "commit": commit,
                "condition": "clean",
                "node_affected": False,
                "disturbance": None,
                "wall_s": doc.get("seconds"),
                "stage_epochs": None,
                "tier": _tier(doc),
                "source": str(run_dir),
                "document": doc,
                "report": {
                    "verdict": entry.get("verdict"),
                    "not_passing": [
                        {k: r.get(k) for k in ("check", "group", "status", "reason", "class")}
                        for r in entry.get("results") or []
                        if r.get("status") not in ("pass", "skip", "info")
                    ],
                },
            }
        )
    return rows, left_out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each with hosts/*.json)")
    p.add_argument("--machine", required=True, help="the machine the runs ran on, as the table should name it")
    p.add_argument("--commit", help="the commit the runs ran (a run folder does not record it)")
    p.add_argument("--out", required=True, type=Path, help="the calibration file to write (.jsonl or .jsonl.gz)")
    args = p.parse_args(argv)
    rows, left_out = [], []
    for run_dir in args.runs:
        got, skipped = rows_of(run_dir, args.machine, args.commit)
        rows += got
        left_out += skipped
    text = "".join(json.dumps(r, separators=(",", ":"), sort_keys=False) + "\n" for r in rows)
    data = gzip.compress(text.encode(), mtime=0) if args.out.name.endswith(".gz") else text.encode()
    args.out.write_bytes(data)
    for line in left_out:
        print(f"left out: {line}")
    print(f"{len(rows)} clean node-run(s) of {len(args.runs)} run folder(s) -> {args.out}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
