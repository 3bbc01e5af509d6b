"""The engine commands of the calibration runs (tools/gpu_calibrate.py): the acceptance tier's node stage for one
node, `gpufleet report` over a round's nodes, and the baseline set on the first clean round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.bench.launch import free_port  # noqa: E402

CHECK_GROUPS = ("gpu_inventory", "gpu_health", "host_hygiene")


def engine(args: list[str], env: dict, timeout_s: float) -> tuple[dict | None, str, float]:
    """One engine command: (its host document, or None; stderr's tail or the reason; seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpufleet", *args, "--json", "--exit-zero"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s} s", time.monotonic() - t0
    try:
        return json.loads(p.stdout), p.stderr[-2000:], time.monotonic() - t0
    except ValueError:
        return None, f"exit {p.returncode}: {(p.stderr or p.stdout)[-2000:]}", time.monotonic() - t0


def node_stage(
    node: str,
    gpus: list[int],
    n_machine_gpus: int,
    cpu: bool,
    thresholds: dict,
    references: Path | None = None,
    scratch: str | None = None,
) -> dict:
    """The acceptance tier's node stage for one node; its merged host document and the stage's seconds. references:
    the node's RUN_DIR/references/<node>.json, handed to its benchmarks as validate.yml hands them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), GPUFLEET_KEEP_LOGS="0", GPUFLEET_RUN_MARK=str(os.getpid()))
    if scratch:
        env["GPUFLEET_SCRATCH_DIR"] = scratch
    if not cpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    common = ["--host", node, "--thresholds", json.dumps(thresholds)]
    held = ["--references", references.read_text()] if references and references.is_file() else []
    steps = [
        ["check", *sum((["--group", g] for g in CHECK_GROUPS), []), *common],
        ["counters", "--phase", "before", *common],
        ["bench", "matmul", "sdc", "--depth", "quick", *common, *held],
        ["bench", "memory", "--depth", "quick", *common, *held],
    ]
    if len(gpus) > 1:
        steps.append(["bench", "nccl", "--depth", "quick", "--master-port", str(free_port()), *common, *held])
    if 0 in gpus:  # the host's own step once a machine: the split layout's nodes share its memory and drive
        steps.append(["bench", "host", "--depth", "quick", *common, *held])
    steps.append(["counters", "--phase", "after", *common])
    t0, epoch0, docs, errors = time.monotonic(), time.time(), [], []
    for step in steps:
        doc, err, secs = engine(step, env, 900)
        if doc is None:
            errors.append({"step": " ".join(step[:3]), "error": err})
        else:
            docs.append(doc)
    merged = dict(docs[0]) if docs else {"schema_version": 1, "host": node, "results": []}
    merged["results"] = [r for d in docs for r in d.get("results") or []]
    merged["host"] = node
    merged["seconds"] = round(sum(d.get("seconds") or 0 for d in docs), 2)
    for e in errors:  # an engine command that gave no document is an error result: nothing is dropped
        merged["results"].append(
            {
                "check": "engine",
                "group": "calibration",
                "status": "error",
                "reason": f"{e['step']}: {e['error']}",
                "value": None,
                "unit": None,
                "threshold": None,
                "remedy": None,
                "detail": {},
                "class": "software",
            }
        )
    return {
        "document": merged,
        "wall_s": round(time.monotonic() - t0, 2),
        "started_epoch": round(epoch0, 2),
        "ended_epoch": round(time.time(), 2),
    }


def report(run_dir: Path, db: Path, nodes: list[str]) -> dict:
    """`gpufleet report` over the round's host documents: each node's verdict and what did not pass."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "report",
            str(run_dir),
            "--db",
            str(db),
            "--json",
            *sum((["--expect-host", n] for n in nodes), []),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = {}
    try:
        rep = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError) as exc:
        return {n: {"verdict": None, "error": f"report exit {p.returncode}: {exc}; {p.stderr[-500:]}"} for n in nodes}
    for node in nodes:
        entry = (rep.get("nodes") or {}).get(node) or {}
        results = entry.get("results") or []
        out[node] = {
            "verdict": entry.get("verdict"),
            "not_passing": [
                {k: r.get(k) for k in ("check", "group", "status", "reason", "class")}
                for r in results
                if r.get("status") not in ("pass", "skip", "info")
            ],
        }
    return out


def set_baseline(db: Path, run_id: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(
        [sys.executable, "-m", "gpufleet", "baseline", "set", run_id, "--db", str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (p.stdout + p.stderr).strip()[-300:]
