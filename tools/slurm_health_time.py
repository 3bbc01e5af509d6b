"""Time `gpufleet check --slurm-health` on this node and watch that it puts no load on the GPUs.

Each run starts the health check as slurmd would (a fresh process, SLURMD_NODENAME set) with --dry-run, so a
hard fault prints the drain instead of calling scontrol. While it runs, NVML is polled: any compute process of
the check's own process tree on a GPU, and each GPU's utilisation, are recorded.

    python3 tools/slurm_health_time.py --runs 5 [--mode health|epilog] [--thresholds JSON] > slurm_health.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pynvml


def tree(pid: int) -> set[int]:
    """pid and its descendants, from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += kids.get(p, [])
    return out


def one_run(cmd: list[str], handles: list) -> dict:
    env = dict(os.environ, SLURMD_NODENAME="gpu-node-under-test")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen_pids: set[int] = set()
    util_max = 0
    polls = 0
    while p.poll() is None:
        ours = tree(p.pid)
        for h in handles:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if proc.pid in ours:
                    seen_pids.add(proc.pid)
            util_max = max(util_max, pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        polls += 1
        time.sleep(0.02)
    out, err = p.communicate()
    return {
        "wall_s": round(time.monotonic() - t0, 3),
        "rc": p.returncode,
        "stdout": out,
        "stderr_tail": err[-2000:],
        "own_processes_on_gpus": sorted(seen_pids),
        "gpu_util_max_pct": util_max,
        "nvml_polls": polls,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mode", default="health", choices=["health", "epilog"])
    ap.add_argument("--thresholds", default="{}")
    args = ap.parse_args()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    cmd = [
        sys.executable,
        "-m",
        "gpufleet",
        "check",
        f"--slurm-health={args.mode}",
        "--dry-run",
        "--thresholds",
        args.thresholds,
    ]
    runs = [one_run(cmd, handles) for run_number in range(args.runs)]
    walls = sorted(r["wall_s"] for r in runs)
    print(
        json.dumps(
            {
                "command": cmd,
                "gpus": len(handles),
                "runs": runs,
                "wall_s_median": walls[len(walls) // 2],
                "wall_s_max": walls[-1],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
