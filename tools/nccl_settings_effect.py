"""The NCCL settings the nccl role writes, measured against running without them, with the collectives inside one node.

    python3 tools/nccl_settings_effect.py --out DIR [--record /etc/gpufleet/bringup.json] [--conf /etc/nccl.conf]
                                     [--tier quick] [--budget-s 480] [--nproc N]

Each variant is one run of the engine's own collective benchmark (`gpufleet.benchmarks.nccl.nccl_measure --worker`: all-reduce,
all-gather, reduce-scatter and all-to-all at 1 MiB to 4 GiB, CUDA events around back-to-back operations, the faster of
eager and CUDA-graph launch; busbw as nccl-tests defines it) under torchrun, started here directly and not through
`gpufleet bench nccl`, which sets NCCL_DEBUG=INFO for its own log and so could not measure NCCL_DEBUG. NCCL reads
its settings once a process, so every variant is a fresh run, with only the variables it names: every other NCCL_*
is taken out of the environment and the conf file (--conf, which NCCL reads in every process) is moved aside for
the whole measurement and put back after. NCCL_NVLS_ENABLE=0 in every run (NVLink multicast stays off).

The variants, in this order (the baseline again every few, so drift shows as the baseline's own spread):
    base                       none of the settings
    role:NAME                  each setting the nccl role wrote on this node (the record's nccl settings), alone
    role:all                   all of them, as the node runs after bringup.yml
    ib-documented              NCCL_IB_DISABLE=0, NCCL_NET_GDR_LEVEL=5, NCCL_IB_QPS_PER_CONNECTION=4, the role's
                               defaults for nodes with InfiniBand (no HCA here: NCCL has no IB transport to use them)
    seeds:ring, seeds:simple,  NCCL_ALGO=Ring, NCCL_PROTO=Simple, and both: what the seeds forced and the role leaves out
    seeds:ring+simple
    net:base, net:ifname       the ranks made to talk through NCCL's network transport (NCCL_P2P_DISABLE=1,
                               NCCL_SHM_DISABLE=1: sockets, as between nodes without an HCA), without and with the
                               role's NCCL_SOCKET_IFNAME, at the tier's sizes up to 256 MiB
A variant that cannot start before --budget-s is over is left out and named.

Writes DIR/runs/<variant>-<n>.json (the worker's output, with the environment it ran under), DIR/cells.csv
(every collective and size of every run), DIR/table.md and DIR/summary.txt; prints the summary last: per variant,
the busbw against the baseline's median (geometric mean over the sizes, the lowest and highest cell) and whether
that is within the baseline's own spread.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from gpufleet.benchmarks.nccl.nccl_measure import parse_nccl_log  # noqa: E402

MiB = 1 << 20
ALWAYS = {"NCCL_NVLS_ENABLE": "0", "NCCL_GRAPH_MIXING_SUPPORT": "0"}  # the second as gpufleet bench nccl runs it
IB_DOCUMENTED = {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "NCCL_IB_QPS_PER_CONNECTION": "4"}
NET_PATH = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
NET_MAX_BYTES = 256 * MiB
# A cell counts as moved when it leaves the baseline's own range over its runs by more than this much.
MARGIN = 0.02


def size_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def variants(role_settings: dict) -> list[tuple[str, dict, int | None]]:
    """(name, NCCL variables, size cap) in the order they run; the baseline recurs so drift shows."""
    role = [(f"role:{k}", {k: str(v)}, None) for k, v in sorted(role_settings.items())]
    out = [
        ("base", {}, None),
        *role,
        ("role:all", {k: str(v) for k, v in role_settings.items()}, None),
        ("base", {}, None),
        ("ib-documented", dict(IB_DOCUMENTED), None),
        ("seeds:ring", {"NCCL_ALGO": "Ring"}, None),
        ("seeds:simple", {"NCCL_PROTO": "Simple"}, None),
        ("seeds:ring+simple", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}, None),
        ("base", {}, None),
        ("net:base", dict(NET_PATH), NET_MAX_BYTES),
    ]
    ifname = role_settings.get("NCCL_SOCKET_IFNAME")
    if ifname:
        out.append(("net:ifname", {**NET_PATH, "NCCL_SOCKET_IFNAME": str(ifname)}, NET_MAX_BYTES))
    return out


def clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    return {**env, **ALWAYS, **extra}


def run_variant(
    out: Path,
    name: str,
    nccl_env: dict,
    max_bytes: int | None,
    tier: str,
    nproc: int,
    timeout_s: float,
    debug_dir: Path | None = None,
) -> dict:
    """One torchrun of the engine's worker; its output with how it ran."""
    result_path = out / "runs" / f"{name.replace(':', '_')}-{int(time.time() * 1000)}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "gpufleet.benchmarks.nccl.nccl_measure",
        "--worker",
        "--depth",
        tier,
        "--out",
        str(result_path),
    ]
    if max_bytes:
        cmd += ["--max-bytes", str(max_bytes)]
    extra = dict(nccl_env)
    if debug_dir:  # the evidence runs: what NCCL chose, in its own words, in files of its own
        extra.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,GRAPH", NCCL_DEBUG_FILE=str(debug_dir / "nccl.%h.%p.log")
        )
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=clean_env(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log = proc.communicate(timeout=timeout_s)[0]
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank: one process group
        log = proc.communicate()[0]
        timed_out = True
    doc = json.loads(result_path.read_text()) if result_path.exists() else {}
    doc.update(
        variant=name,
        nccl_env=nccl_env,
        max_bytes=max_bytes,
        rc=proc.returncode,
        timed_out=timed_out,
        seconds=round(time.monotonic() - start, 1),
        log_tail=log[-3000:],
    )
    result_path.write_text(json.dumps(doc, indent=1))
    return doc


def cells(doc: dict) -> dict:
    """(collective, size in bytes) -> busbw GB/s of a run's correct measurements."""
    return {
        (name, row["size_bytes"]): row["busbw_gbps"]
        for name, rows in (doc.get("collectives") or {}).items()
        for row in rows
        if row.get("correct") and row.get("busbw_gbps")
    }


def judge(runs: list[dict]) -> list[dict]:
    """Per variant: its cells against the baseline's median and range, per cell, summed up."""
    base = [cells(r) for r in runs if r["variant"] == "base"]
    keys = set().union(*base) if base else set()
    median = {k: statistics.median(b[k] for b in base if k in b) for k in keys}
    low = {k: min(b[k] for b in base if k in b) / median[k] for k in keys}
    high = {k: max(b[k] for b in base if k in b) / median[k] for k in keys}
    net_base = [cells(r) for r in runs if r["variant"] == "net:base"]
    rows = []
    for name in dict.fromkeys(r["variant"] for r in runs):
        mine = [cells(r) for r in runs if r["variant"] == name]
        ref, ref_low, ref_high, against = median, low, high, "base"
        if name == "net:ifname" and net_base:  # the network path against itself without the setting
            ref = {k: statistics.median(b[k] for b in net_base if k in b) for k in set().union(*net_base)}
            ref_low, ref_high, against = {k: 1.0 for k in ref}, {k: 1.0 for k in ref}, "net:base"
        ratios = {
            k: statistics.median(m[k] for m in mine if k in m) / ref[k] for k in set().union(*mine) & set(ref) if ref[k]
        }
        if not ratios:
            rows.append(
                {
                    "variant": name,
                    "against": against,
                    "cells": 0,
                    "runs": len(mine),
                    "verdict": "not comparable (no cell in common with its reference)",
                }
            )
            continue
        worst, best = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
        below = [k for k, r in ratios.items() if r < ref_low[k] - MARGIN]
        above = [k for k, r in ratios.items() if r > ref_high[k] + MARGIN]
        verdict = (
            "reference"
            if name == "base"
            else "hurts"
            if below and not above
            else "helps"
            if above and not below
            else "mixed"
            if above and below
            else "no effect beyond the baseline's spread"
        )
        rows.append(
            {
                "variant": name,
                "against": against,
                "runs": len(mine),
                "cells": len(ratios),
                "geomean_ratio": round(math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios)), 4),
                "worst": f"{worst[0]} {size_text(worst[1])} {ratios[worst]:.3f}",
                "best": f"{best[0]} {size_text(best[1])} {ratios[best]:.3f}",
                "cells_below": len(below),
                "cells_above": len(above),
                "verdict": verdict,
            }
        )
    return rows


def write_outputs(out: Path, runs: list[dict], left_out: list[str], evidence: dict) -> str:
    with open(out / "cells.csv", "w") as handle:
        handle.write("variant,run,collective,size_bytes,busbw_gbps\n")
        for n, run in enumerate(runs):
            for (name, size), busbw in sorted(cells(run).items()):
                handle.write(f"{run['variant']},{n},{name},{size},{busbw}\n")
    summary = judge(runs)
    base_runs = [cells(r) for r in runs if r["variant"] == "base"]
    spread = (
        max(
            (
                max(b[k] for b in base_runs if k in b) / min(b[k] for b in base_runs if k in b) - 1
                for k in set().union(*base_runs)
            ),
            default=0,
        )
        if len(base_runs) > 1
        else None
    )
    lines = [
        f"{'variant':20} {'against':9} {'runs':>4} {'cells':>5} {'geomean':>8}  {'worst cell':28} {'best cell':28} verdict"
    ]
    for row in summary:
        lines.append(
            f"{row['variant']:20} {row['against']:9} {row['runs']:>4} {row['cells']:>5} "
            f"{row.get('geomean_ratio', ''):>8}  {row.get('worst', ''):28} {row.get('best', ''):28} {row['verdict']}"
        )
    lines.append(
        f"baseline runs: {len(base_runs)}; their largest spread in one cell: "
        f"{'n/a' if spread is None else f'{spread * 100:.1f}%'}; a cell moved when it leaves the baseline's range "
        f"by more than {MARGIN * 100:.0f}%"
    )
    failed = [f"{r['variant']} (rc {r['rc']}{', timed out' if r['timed_out'] else ''})" for r in runs if r["rc"] != 0]
    if failed:
        lines.append("runs that failed: " + "; ".join(failed) + " (their log_tail in runs/)")
    if left_out:
        lines.append("left out for time: " + ", ".join(left_out))
    for name, what in evidence.items():
        lines.append(f"NCCL's log, {name}: transports {what.get('transports')}, network {what.get('networks')}")
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    (out / "summary.json").write_text(
        json.dumps(
            {"variants": summary, "left_out": left_out, "evidence": evidence, "baseline_spread": spread}, indent=1
        )
    )
    by_variant = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append(cells(run))
    keys = sorted(set().union(*[c for cs in by_variant.values() for c in cs]))
    table = ["| collective | size | " + " | ".join(by_variant) + " |", "|---|---:|" + "---:|" * len(by_variant)]
    for key in keys:
        vals = [
            statistics.median([c[key] for c in cs if key in c]) if any(key in c for c in cs) else None
            for cs in by_variant.values()
        ]
        table.append(
            f"| {key[0]} | {size_text(key[1])} | " + " | ".join("" if v is None else f"{v:.4g}" for v in vals) + " |"
        )
    (out / "table.md").write_text("busbw GB/s, median over a variant's runs\n\n" + "\n".join(table) + "\n")
    return text


def settings_from(record: Path) -> dict:
    doc = json.loads(record.read_text())
    settings = (doc.get("roles", {}).get("nccl") or {}).get("settings")
    if not isinstance(settings, dict):
        raise SystemExit(f"{record} has no nccl section with settings: run bringup.yml (role nccl) first")
    return settings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--record", default="/etc/gpufleet/bringup.json", help="bring-up record with the nccl role's settings"
    )
    parser.add_argument("--conf", default="/etc/nccl.conf", help="NCCL's conf file, moved aside while measuring")
    parser.add_argument("--tier", default="quick", help="the benchmark's tier (cpu: gloo, logic only)")
    parser.add_argument("--nproc", type=int, help="ranks (default: the GPUs torch sees)")
    parser.add_argument("--budget-s", type=float, default=480, help="start no variant after this")
    parser.add_argument("--run-timeout-s", type=float, default=150)
    parser.add_argument("--evidence", action="store_true", help="then base and net:base again with NCCL's INFO log")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    role_settings = settings_from(Path(args.record))
    import torch  # here: the settings' file is read (and its errors said) without waiting for torch

    nproc = args.nproc or torch.cuda.device_count()
    if nproc < 2:
        raise SystemExit(f"{nproc} rank(s): collectives inside a node need two or more GPUs (--nproc)")
    conf, aside = Path(args.conf), Path(args.conf + ".gpufleet-measuring")
    started = time.monotonic()
    runs, left_out, evidence = [], [], {}
    if conf.exists():
        shutil.move(conf, aside)
    try:
        planned = variants(role_settings)
        for name, nccl_env, max_bytes in planned:
            spent = time.monotonic() - started
            last = runs[-1]["seconds"] if runs else 0
            if spent + last * 1.2 > args.budget_s:
                left_out.append(name)
                continue
            run = run_variant(out, name, nccl_env, max_bytes, args.tier, nproc, args.run_timeout_s)
            runs.append(run)
            print(f"== {name}: rc {run['rc']}, {run['seconds']} s, {len(cells(run))} cells", flush=True)
        if args.evidence:
            for name, nccl_env, max_bytes in (("base", {}, 64 * MiB), ("net:base", dict(NET_PATH), 64 * MiB)):
                if time.monotonic() - started > args.budget_s:
                    left_out.append(f"evidence {name}")
                    continue
                debug_dir = out / "nccl-logs" / name.replace(":", "_")
                debug_dir.mkdir(parents=True, exist_ok=True)
                run_variant(
                    out, f"evidence-{name}", nccl_env, max_bytes, args.tier, nproc, args.run_timeout_s, debug_dir
                )
                text = "".join(p.read_text(errors="replace") for p in sorted(debug_dir.glob("nccl.*.log")))
                parsed = parse_nccl_log(text)
                evidence[name] = {"transports": parsed["transports"], "networks": parsed["networks"]}
    finally:
        if aside.exists():
            shutil.move(aside, conf)
    (out / "method.json").write_text(
        json.dumps(
            {
                "role_settings": role_settings,
                "always": ALWAYS,
                "tier": args.tier,
                "nproc": nproc,
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
                "conf_moved_aside": str(conf),
                "variants": [v[0] for v in planned],
                "margin": MARGIN,
            },
            indent=1,
        )
    )
    print(write_outputs(out, runs, left_out, evidence), end="")
    return 0 if runs and all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
