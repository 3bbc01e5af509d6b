"""Calibration runs: what each check says on healthy GPUs, and on GPUs we disturb on purpose.

Runs the acceptance tier's node stage (the checks, the counters before, `bench matmul sdc`, `bench memory`, `bench
nccl` on a node of several GPUs, the counters after: the engine commands gpufleet.cluster.node_validate runs) again
and again until a time budget is spent, each round either clean or beside a disturbance of a random kind, on random
GPUs, starting at a random moment. After each round `gpufleet report` judges the round's nodes together (the fleet
checks included) against a store of its own, whose baseline is the first clean round. Each node-run is appended as
one JSON line to --data: the condition, the disturbance with its pids and times, the node's whole host document
(every figure, every timed sample in `values`, what the sampler saw in detail.monitor) and what the report said.
Appending is what makes runs on different machines and days add up; a run of a few minutes is useful alone.

Layouts: `split` makes each GPU a node of its own (CUDA_VISIBLE_DEVICES, gpus_expected 1), all measured at once as
a fleet of one-GPU nodes; `node` makes all GPUs one node. `--layout both` alternates by round.

Disturbance kinds (tools/gpu_disturb.py; each its own process, named gpu_disturb):
  compute     bf16 matmul loop on one GPU               memcopy   device-to-device copies on one GPU
  pcie        pinned host-device copies on one GPU      other_user two processes (matmul and copy) as uid 65534
  one_gpu     in the node layout: one GPU of several; in the split layout: a light matmul (size 2048)
  short       a matmul that lasts 1 to 3 s, inside one step
  host_cpu    no GPU: busy processes on 15-50% of the host's CPUs (gpu_disturb --kind cpu), as user
              gpufleet-neighbour (created when missing; run as root), on every node of the machine
  host_memory the host's memory held (60% of it) and streamed through by 2 processes of gpufleet-neighbour, in place
              before the round's stages start (gpu_disturb --kind memory)
  disk_full   the scratch drive (--scratch) filled to 512 MiB free, in place before the stages (--kind fill)
  disk_io     direct-I/O writers and readers on the scratch drive during the stages (--kind io)
The node stage includes the host's own step (`bench host`: memory, the drive at --scratch, a data loader) on the node
that holds GPU 0 (once a machine: the split layout's nodes share its memory and its drive). Every row
records the most the host's other processes used beside the benchmarks (`host_foreign_cpu_pct_max`, from
benchmark.<step>_processes; the node stages mark themselves with GPUFLEET_RUN_MARK, so the split layout's sibling
nodes are this run's): the clean rows' largest sets host_foreign_cpu_share_max; likewise the CPU steal of a VM
(`host_cpu_steal_pct_max`) sets its own limit. The disturbances are
calibration_disturbances.py's, the engine commands (the node stage, the report, the baseline)
calibration_node_stage.py's.

Usage (GPU machine, from a checkout):
  python3 tools/gpu_calibrate.py --out $OUT --data $OUT/runs.jsonl --budget-s 480 [--layout split|node|both]
      [--disturbed-share 0.5] [--kinds compute,memcopy,...] [--gpus-disturbed 1] [--seed N] [--cpu]
      [--scratch DIR]   (a folder on the node's local NVMe drive: gpufleet_scratch_dir; default $OUT/scratch)
The short table comes last; --cpu runs the same logic on a machine without a GPU (benchmarks on the CPU,
disturbances as CPU loops: not a calibration, a check of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from calibration_disturbances import (  # noqa: E402
    BEFORE_KINDS,
    HOST_KINDS,
    KINDS,
    Disturbance,
    let_others_run_python,
    plan_round,
)
from calibration_node_stage import node_stage, report, set_baseline  # noqa: E402

FORMAT = "gpufleet-calibration/1"
HOST_KEY = "host_foreign_cpu_share_max"
STEAL_KEY = "host_cpu_steal_pct_max"


def as_text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def machine_facts(cpu: bool) -> dict:
    if cpu:
        return {"gpu_model": "cpu", "gpus_on_machine": 1, "driver": None, "host": socket.gethostname()}
    import pynvml

    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return {"gpu_model": as_text(name), "gpus_on_machine": n, "driver": as_text(driver), "host": socket.gethostname()}


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except OSError:
        return None


def host_peak(doc: dict, steal: bool = False) -> float | None:
    """The most the host's other processes used together beside the node-run's benchmarks (percent of its CPUs),
    or with `steal` the most CPU steal (a VM's hypervisor): each benchmark.<step>_processes' detail, or where none
    came (a CPU run) each sampler's summary."""
    key = "host_cpu_steal_pct_max" if steal else "host_foreign_cpu_pct_max"
    details = [r.get("detail") or {} for r in doc.get("results") or []]
    peaks = [d[key] for d in details if d.get(key) is not None]
    hosts = [d["monitor"]["host"] for d in details if (d.get("monitor") or {}).get("host")]
    peaks = peaks or [(h.get("steal") or {}).get("peak_pct") if steal else h["peak"]["cpu_pct"] for h in hosts]
    peaks = [v for v in peaks if v is not None]
    return max(peaks) if peaks else None


def host_line(rows: list[dict]) -> str:
    """The host's foreign CPU share per node-run, clean and beside the host_cpu kind, against the limit; and the
    CPU steal of the clean node-runs, against its own."""
    limits = {(r["document"].get("profile") or {}).get("thresholds", {}).get(HOST_KEY, {}).get("value") for r in rows}
    parts = []
    for what, rs in (
        ("clean", [r for r in rows if r["condition"] == "clean"]),
        ("host_cpu", [r for r in rows if r["node_affected"] and r["disturbance"]["kind"] == "host_cpu"]),
    ):
        got = sorted(v for r in rs if (v := r.get("host_foreign_cpu_pct_max")) is not None)
        if got:
            parts.append(f"{what} {len(got)} node-runs: {got[0]:g} to {got[-1]:g}% (median {got[len(got) // 2]:g}%)")
    limit = ", ".join(f"{v:g}%" for v in sorted(v for v in limits if v is not None)) or "none read"
    seen = "; ".join(parts) or "none read"
    steal = sorted(v for r in rows if r["condition"] == "clean" and (v := r.get("host_cpu_steal_pct_max")) is not None)
    steal_limits = {
        (r["document"].get("profile") or {}).get("thresholds", {}).get(STEAL_KEY, {}).get("value") for r in rows
    }
    steal_limit = ", ".join(f"{v:g}%" for v in sorted(v for v in steal_limits if v is not None)) or "none read"
    steal_seen = f"clean {len(steal)} node-runs: {steal[0]:g} to {steal[-1]:g}%" if steal else "none read"
    return (
        f"host: the other processes' CPU share, largest per node-run: {seen}; {HOST_KEY} {limit}; "
        f"CPU steal, largest per node-run: {steal_seen}; {STEAL_KEY} {steal_limit}"
    )


def table(rows: list[dict]) -> str:
    """Per layout and condition: node-runs, verdicts, and the checks that did not pass (how often)."""
    lines = [
        f"{'layout':6} {'condition':10} {'runs':>4} {'pass':>4} {'warn':>4} {'fail':>4} {'err':>4}  not passing (count)"
    ]
    groups: dict = {}
    for r in rows:
        key = (r["layout"], "disturbed" if r["node_affected"] else ("clean" if r["condition"] == "clean" else "beside"))
        groups.setdefault(key, []).append(r)
    for (layout, cond), rs in sorted(groups.items()):
        verdicts = [x["report"].get("verdict") for x in rs]
        checks: dict = {}
        for x in rs:
            for f in x["report"].get("not_passing") or []:
                name = f"{f['group']}.{f['check']}:{f['status']}"
                checks[name] = checks.get(name, 0) + 1
        top = ", ".join(f"{k} ({v})" for k, v in sorted(checks.items(), key=lambda kv: -kv[1])[:6])
        lines.append(
            f"{layout:6} {cond:10} {len(rs):4} {verdicts.count('pass'):4} {verdicts.count('warn'):4} "
            f"{verdicts.count('fail'):4} {verdicts.count('error'):4}  {top or '-'}"
        )
    walls = sorted(r["wall_s"] for r in rows)
    if walls:
        lines.append(f"node stage wall: median {walls[len(walls) // 2]:.1f} s over {len(walls)} node-runs")
    return "\n".join(lines + [host_line(rows)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the rounds' run folders, the store and the log")
    p.add_argument("--data", required=True, help="JSON-lines file the node-runs are appended to")
    p.add_argument("--budget-s", type=float, default=480, help="no round starts after this many seconds")
    p.add_argument("--layout", choices=["split", "node", "both"], default="split")
    p.add_argument("--disturbed-share", type=float, default=0.5, help="share of rounds run beside a disturbance")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"disturbance kinds, comma-separated, of {KINDS}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--first-clean", type=int, default=1, help="rounds at the start that are always clean")
    p.add_argument(
        "--gpus-disturbed",
        type=int,
        default=1,
        help="GPUs a disturbance runs on (random ones, the kind's processes on each); more than 1 gives more "
        "disturbed node-runs a round in the split layout, fewer beside",
    )
    p.add_argument("--cpu", action="store_true", help="logic check on a machine without a GPU")
    p.add_argument(
        "--scratch", help="a folder on the node's local NVMe drive (gpufleet_scratch_dir); default OUT/scratch"
    )
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--kinds: expected some of {KINDS}, got {args.kinds!r}")
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    out = Path(args.out)
    scratch = args.scratch or str(out / "scratch")
    os.makedirs(scratch, exist_ok=True)
    reports = out / "calibration-reports"
    reports.mkdir(parents=True, exist_ok=True)
    # A reports folder and store per layout (baseline.json lies beside the store): a node of four GPUs is never
    # compared with a baseline of one-GPU nodes.
    dbs = {layout: reports / layout / "gpufleet.db" for layout in ("split", "node")}
    facts = machine_facts(args.cpu)
    if not args.cpu and "other_user" in kinds and os.geteuid() == 0:
        let_others_run_python()
    n_gpus = facts["gpus_on_machine"]
    commit = git_commit()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    t_start, rows, baseline_set = time.monotonic(), [], set()
    print(
        f"calibration: {facts}; seed {seed}; budget {args.budget_s} s; layout {args.layout}; kinds {kinds}", flush=True
    )
    k, stage_s = 0, {}
    while time.monotonic() - t_start < args.budget_s:
        layout = args.layout if args.layout != "both" else ("split" if k % 2 == 0 else "node")
        disturbed = k >= args.first_clean and rng.random() < args.disturbed_share
        plan = plan_round(rng, n_gpus, disturbed, kinds, stage_s.get(layout, 20.0), args.gpus_disturbed)
        if layout == "split":
            nodes = {f"gpu{i}": [i] for i in range(n_gpus)}
            thresholds = {"gpus_expected": n_gpus}  # NVML sees every GPU of the machine from each node
        else:
            nodes = {"node": list(range(n_gpus))}
            thresholds = {"gpus_expected": n_gpus}
        round_id = f"{stamp}-r{k:03d}-{layout}-{plan['kind'] if plan else 'clean'}"
        run_dir = reports / layout / round_id
        (run_dir / "hosts").mkdir(parents=True)
        dist = Disturbance(**plan, cpu=args.cpu, scratch=scratch) if plan else None
        stages: dict = {}

        # What each node's figures are held against (its baseline round, its GPUs' past), as validate.yml writes it.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "references",
                str(run_dir),
                "--db",
                str(dbs[layout]),
                *(f"--host={n}" for n in nodes),
            ],
            env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
            capture_output=True,
        )

        def one(node, gpus):
            stages[node] = node_stage(
                node, gpus, n_gpus, args.cpu, thresholds, run_dir / "references" / f"{node}.json", scratch
            )

        threads = [threading.Thread(target=one, args=(n, g)) for n, g in nodes.items()]
        t0 = time.monotonic()
        if dist:
            dist.start()
            if plan["kind"] in BEFORE_KINDS:  # the node comes with the fault: the stages meet it from their start
                dist.ready.wait(timeout=300)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if dist:
            dist.finish()
        stage_s[layout] = max(st["wall_s"] for st in stages.values())
        for node, st in stages.items():
            (run_dir / "hosts" / f"{node}.json").write_text(json.dumps(st["document"]))
        judged = report(run_dir, dbs[layout], list(nodes))
        if layout not in baseline_set and not plan:
            print(f"  baseline: {set_baseline(dbs[layout], round_id)}", flush=True)
            baseline_set.add(layout)
        for node, gpus in nodes.items():
            # Affected: the disturbance ran on this node's GPUs while its stage ran (the times overlap).
            st = stages[node]
            rec = dist.record if dist else {}
            overlap = (
                bool(rec.get("ready_epoch"))
                and rec["ready_epoch"] < st["ended_epoch"]
                and (rec.get("end_epoch") or st["ended_epoch"]) > st["started_epoch"]
            )
            affected = overlap and (args.cpu or plan["kind"] in HOST_KINDS or bool(set(plan["gpus"]) & set(gpus)))
            row = {
                "format": FORMAT,
                "round": round_id,
                "node": node,
                "layout": layout,
                "seed": seed,
                "machine": dict(facts, node_gpus=gpus),
                "commit": commit,
                "condition": "disturbed" if plan else "clean",
                "node_affected": affected,
                "disturbance": dist.record if dist else None,
                "wall_s": st["wall_s"],
                "host_foreign_cpu_pct_max": host_peak(st["document"]),
                "host_cpu_steal_pct_max": host_peak(st["document"], steal=True),
                "stage_epochs": [st["started_epoch"], st["ended_epoch"]],
                "document": stages[node]["document"],
                "report": judged.get(node) or {},
            }
            rows.append(row)
            with open(args.data, "a") as f:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        mine = [judged.get(n, {}) for n in nodes]
        print(
            f"[{time.monotonic() - t_start:6.0f} s] {round_id}: {time.monotonic() - t0:.1f} s; "
            + "; ".join(
                f"{n} {j.get('verdict')} {[f['group'] + '.' + f['check'] for f in j.get('not_passing') or []]}"
                for n, j in zip(nodes, mine)
            ),
            flush=True,
        )
        k += 1
    print()
    print(table(rows))
    with tarfile.open(out / "calibration-reports.tar.gz", "w:gz") as tar:  # the reports; the documents are in --data
        for f in sorted(reports.glob("*/*/report.*")):
            tar.add(f, arcname=str(f.relative_to(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
