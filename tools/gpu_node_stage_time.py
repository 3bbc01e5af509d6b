"""The node stage a sweep job runs on its node (`gpufleet node-stage`), timed on a GPU machine, for the cost of a
sweep per node and week (docs/fleet-in-service.md). No Slurm is needed: this is what runs inside the job.

    OUT=<dir> python3 tools/gpu_node_stage_time.py [--runs 3] [--python python3]

Each tier (smoke, acceptance) --runs times, one after another on GPUs nothing else uses: the wall time of the
process, the engine's own seconds, the verdict, the GPUs. Under $OUT: each run's folder (its host document), the
report of each (--no-store), times.json, and last a table: per tier the median wall time, GPU-hours per sweep of a
node with this many GPUs and of an 8-GPU node, and per node and week at each cadence.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CADENCES = (("hourly", 168), ("every 4 h", 42), ("daily", 7), ("weekly", 1))


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    out = Path(os.environ["OUT"])
    gpus = gpu_count()
    thresholds = json.dumps({"gpus_expected": gpus}) if gpus else "{}"
    rows = []
    for tier in ("smoke", "acceptance"):
        for i in range(1, args.runs + 1):
            run_id = f"{tier}-{i}"
            run_dir = out / "reports" / run_id
            (run_dir / "hosts").mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            done = subprocess.run(
                [
                    args.python,
                    "-m",
                    "gpufleet",
                    "node-stage",
                    "--tier",
                    tier,
                    "--run-dir",
                    str(run_dir),
                    "--run-id",
                    run_id,
                    "--host",
                    "node0",
                    "--lock-path",
                    str(out / "node.lock"),
                    "--thresholds",
                    thresholds,
                ],
                capture_output=True,
                text=True,
            )
            wall_s = time.monotonic() - t0
            (run_dir / "node-stage.log").write_text(done.stdout + done.stderr)
            doc = (
                json.loads((run_dir / "hosts" / "node0.json").read_text())
                if (run_dir / "hosts" / "node0.json").exists()
                else {}
            )
            report = subprocess.run(
                [args.python, "-m", "gpufleet", "report", str(run_dir), "--no-store", "--json"],
                capture_output=True,
                text=True,
            )
            verdict = json.loads(report.stdout)["verdict"] if report.stdout.strip().startswith("{") else "no report"
            rows.append(
                {
                    "tier": tier,
                    "run": i,
                    "rc": done.returncode,
                    "wall_s": round(wall_s, 1),
                    "engine_s": doc.get("seconds"),
                    "verdict": verdict,
                    "gpus": gpus,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    (out / "times.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(
        f"\n{'tier':11} {'median s':>8} {'GPU-h/sweep':>11} {'8-GPU node':>10}  "
        + "  ".join(f"{c:>10}" for c, _ in CADENCES)
    )
    for tier in ("smoke", "acceptance"):
        wall = statistics.median(r["wall_s"] for r in rows if r["tier"] == tier)
        per8 = wall * 8 / 3600
        print(
            f"{tier:11} {wall:8.1f} {wall * max(gpus, 1) / 3600:11.4f} {per8:10.4f}  "
            + "  ".join(f"{per8 * n:10.3f}" for _, n in CADENCES)
            + "   (GPU-h per 8-GPU node per week)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
