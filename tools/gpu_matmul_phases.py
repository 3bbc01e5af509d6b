"""Where the matmul step's wall time goes on a GPU machine, phase by phase.

    python3 tools/gpu_matmul_phases.py [--rounds 2] [--before DIR] [--json OUT]

Each round, each case in a fresh Python process (as the engine starts one per benchmark):
- `before`: an older checkout's matmul.run("quick") (DIR/src on the path), timed as a whole;
- `matmul`: this checkout's matmul.run("quick"), timed as a whole;
- `matmul+sdc`: matmul.run("quick", sdc_depth="quick"), timed as a whole;
- `phases`: the same work as matmul+sdc in one spawned worker, every phase timed: the worker's start (its
  imports), torch, the CUDA context, the timed products (benchmarks.matmul.measure_device), each SDC phase (inputs
  drawn, each computation with its repeats, the hashes, the versions), the put; then in the parent the result's
  arrival, the worker's end (with and without the kill bench.gather does) and the sampler's exit.
The table comes last; --json keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(queue, barrier, fold: bool):
    marks = [("entered", time.time())]
    import torch

    from gpufleet.bench import torch_versions
    from gpufleet.benchmarks.matmul import matmul_measure as matmul
    from gpufleet.benchmarks.sdc import sdc_measure as sdc

    marks.append(("imports", time.time()))
    if fold:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = sdc.WORKSPACE_CONFIG
    barrier.wait()
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    marks.append(("cuda context", time.time()))
    matmul.measure_device(0, matmul.DEPTH_DTYPES.get("quick", matmul.DTYPES), "quick")
    torch.cuda.synchronize()
    marks.append(("timed products", time.time()))
    if fold:
        device = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.use_deterministic_algorithms(True)
        comps = sdc._computations(torch, device, sdc.SIZES["gpu"])
        torch.cuda.synchronize()
        marks.append(("sdc inputs", time.time()))
        firsts = {}
        for name, compute in comps.items():
            first = compute()
            sum(not torch.equal(compute(), first) for _ in range(sdc.REPEATS["gpu"] - 1))
            torch.cuda.synchronize()
            firsts[name] = first
            marks.append((f"sdc {name} x{sdc.REPEATS['gpu']}", time.time()))
        for name, first in firsts.items():
            sdc.tensor_sha256(first)
        marks.append(("sdc hashes", time.time()))
        torch_versions(), sdc.cublas_version(), torch.cuda.get_device_properties(device)
        marks.append(("versions", time.time()))
    marks.append(("put", time.time()))
    queue.put(marks)


def phases(fold: bool, kill: bool) -> list:
    import multiprocessing as mp

    from gpufleet.bench.monitor import GpuMonitor

    t0 = time.time()
    import torch

    torch.cuda.device_count()
    marks = [("parent torch+count", time.time())]
    with GpuMonitor() as mon:
        marks.append(("sampler started", time.time()))
        ctx = mp.get_context("spawn")
        queue, barrier = ctx.Queue(), ctx.Barrier(1)
        p = ctx.Process(target=_worker, args=(queue, barrier, fold))
        p.start()
        marks.append(("spawned", time.time()))
        worker_marks = queue.get(timeout=600)
        marks.append(("result arrived", time.time()))
        if kill:
            p.kill()
        p.join(timeout=60)
        marks.append(("worker ended" + (" (killed)" if kill else ""), time.time()))
    marks.append(("sampler stopped", time.time()))
    seen = [(p["first_s"], p["last_s"]) for p in mon.summary()["processes"]]
    allm = sorted(marks + [(f"worker: {n}", t) for n, t in worker_marks], key=lambda m: m[1])
    out, prev = [], t0
    for name, t in allm:
        out.append({"phase": name, "s": round(t - prev, 3), "at_s": round(t - t0, 3)})
        prev = t
    return [{"phase": "sampler saw the worker on the GPU (s since sampler start)", "s": None, "at_s": seen}] + out


def _draws(queue):
    """Ways to draw the SDC products' inputs (two 8192-square fp32 matrices), after a CUDA context and the timed
    products, as in the matmul worker: seconds each, on a clean process state."""
    import torch

    from gpufleet.benchmarks.matmul import matmul_measure as matmul
    from gpufleet.benchmarks.sdc import sdc_measure as sdc

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = sdc.WORKSPACE_CONFIG
    torch.cuda.set_device(0)
    matmul.measure_device(0, ("bf16",), "quick")
    torch.cuda.synchronize()
    n, dev, rows = sdc.SIZES["gpu"]["matmul_fp32"], torch.device("cuda", 0), []

    def timed(label, fn):
        torch.cuda.synchronize()
        t = time.time()
        fn()
        torch.cuda.synchronize()
        rows.append((label, round(time.time() - t, 3)))

    timed("cpu randn, seeded generator, x2, to GPU", lambda: sdc._inputs(torch, n, dev))
    timed(
        "cpu rand, seeded generator, x2, to GPU",
        lambda: [torch.rand(n, n, generator=torch.Generator().manual_seed(1)).to(dev) for _ in range(2)],
    )
    timed(
        "gpu randn, seeded generator, x2",
        lambda: [torch.randn(n, n, device=dev, generator=torch.Generator(device=dev).manual_seed(1)) for _ in range(2)],
    )
    torch.use_deterministic_algorithms(True)
    timed("deterministic on: cpu randn, seeded, x2, to GPU", lambda: sdc._inputs(torch, n, dev))
    timed(
        "deterministic on: gpu randn, seeded, x2",
        lambda: [torch.randn(n, n, device=dev, generator=torch.Generator(device=dev).manual_seed(1)) for _ in range(2)],
    )
    timed("deterministic on: sdc.measure_device (all)", lambda: sdc.measure_device(0, "gpu"))
    rows.append(("measure_device phases_s", sdc.measure_device(0, "gpu")["phases_s"]))
    queue.put(rows)


def draws() -> list:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_draws, args=(queue,))
    p.start()
    rows = queue.get(timeout=600)
    p.join(timeout=60)
    return rows


def engine(names: list[str]) -> dict:
    """`python -m gpufleet bench NAMES --json` as the benchmark module runs it: wall s, each result's seconds,
    and the workers' phases (matmul detail.per_gpu[].phases_s, sdc's)."""
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", *names, "--depth", "quick", "--json", "--exit-zero"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = round(time.monotonic() - t0, 2)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        return {"names": names, "wall_s": wall, "rc": p.returncode, "stderr_tail": p.stderr[-1500:]}
    res = {r["check"]: r for r in doc["results"]}
    mm = (res.get("matmul_bf16") or {}).get("detail") or {}
    sd = (res.get("sdc") or {}).get("detail") or {}
    return {
        "names": names,
        "wall_s": wall,
        "rc": p.returncode,
        "doc_s": doc["seconds"],
        "results": {
            c: (r["status"], r.get("seconds"), r.get("trust"), len((r.get("detail") or {}).get("attempts") or []))
            for c, r in res.items()
        },
        "matmul_phases_s": {d: g.get("phases_s") for d, g in (mm.get("per_gpu") or {}).items()},
        "sdc_phases_s": {d: g.get("phases_s") for d, g in (sd.get("per_gpu") or {}).items()},
        "sampler_saw": [(x["first_s"], x["last_s"]) for x in (mm.get("monitor") or {}).get("processes") or []],
    }


CASE_CODE = {
    "before": "from gpufleet.benchmarks.matmul import matmul_measure as matmul; matmul.run('quick')",
    "matmul": "from gpufleet.benchmarks.matmul import matmul_measure as matmul; matmul.run('quick')",
    "matmul+sdc": "from gpufleet.benchmarks.matmul import matmul_measure as matmul; o = matmul.run('quick', sdc_depth='quick'); "
    "print('SDC', [v.get('seconds') for v in o['sdc']['per_device'].values()])",
}


def case(name: str, before: str | None) -> dict:
    env = dict(os.environ)
    if name == "before":
        env["PYTHONPATH"] = os.path.join(before, "src") + os.pathsep + env.get("PYTHONPATH", "")
    code = "import time; t=time.time(); " + CASE_CODE[name] + "; print('WALL', time.time()-t)"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    inner = next((float(x.split()[1]) for x in p.stdout.splitlines() if x.startswith("WALL")), None)
    sdc_s = next((x[4:] for x in p.stdout.splitlines() if x.startswith("SDC")), "")
    return {
        "case": name,
        "process_s": round(wall, 2),
        "run_s": round(inner, 2) if inner else None,
        "rc": p.returncode,
        "sdc_s": sdc_s,
        "stderr_tail": p.stderr[-800:],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before")
    ap.add_argument("--json")
    ap.add_argument("--phases-only", action="store_true")
    ap.add_argument("--engine", action="store_true", help="the real path: `gpufleet bench` runs and the input draws")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(HERE, "src"))
    report = {"cases": [], "phases": {}}
    if args.engine:
        report["engine"] = []
        for r in range(args.rounds):
            for names in (["matmul"], ["matmul", "sdc"]):
                e = engine(names)
                report["engine"].append(e)
                print(json.dumps(e), flush=True)
        report["draws"] = draws()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        print()
        for e in report["engine"]:
            print(f"{' '.join(e['names']):11} wall {e['wall_s']:6.2f}  results {e.get('results')}")
            print(
                f"            matmul worker {e.get('matmul_phases_s')}  sdc {e.get('sdc_phases_s')}  on GPU {e.get('sampler_saw')}"
            )
        for label, s_ in report["draws"]:
            print(f"  {label:50} {s_}")
        return 0
    if not args.phases_only:
        names = (["before"] if args.before else []) + ["matmul", "matmul+sdc"]
        for r in range(args.rounds):
            for n in names:
                c = case(n, args.before)
                c["round"] = r + 1
                report["cases"].append(c)
                print(json.dumps({k: c[k] for k in ("case", "round", "process_s", "run_s", "rc", "sdc_s")}), flush=True)
    for label, fold, kill in (
        ("matmul alone", False, True),
        ("matmul+sdc, killed as gather does", True, True),
        ("matmul+sdc, left to exit", True, False),
    ):
        report["phases"][label] = phases(fold, kill)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("\ncase         runs: process s (run s)")
    for n in dict.fromkeys(c["case"] for c in report["cases"]):
        rows = [c for c in report["cases"] if c["case"] == n]
        print(
            f"{n:12} "
            + ", ".join(f"{c['process_s']} ({c['run_s']})" for c in rows)
            + f"  median run {statistics.median([c['run_s'] or 0 for c in rows]):.2f}  rc {[c['rc'] for c in rows]} {rows[-1]['sdc_s']}"
        )
    for label, rows in report["phases"].items():
        print(f"\n{label}: {rows[0]['at_s']}")
        for row in rows[1:]:
            print(f"  {row['phase']:40} {row['s']:7.3f}  at {row['at_s']:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
