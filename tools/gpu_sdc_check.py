"""Does the SDC check's premise hold on this GPU: are seeded products bit-identical across repeats and processes?

Usage: python3 tools/gpu_sdc_check.py [--processes 3] [--repeats 20] [--size 8192] [--device 0] [--json OUT]

Runs, in each of --processes fresh processes on one GPU, the computations of benchmark.sdc (benchmarks/sdc/sdc_measure.py: seeded
bf16 and fp32 8192-cube products with TF32 off, and the MLP's training steps) --repeats times, compares every
repeat with the first on the device (torch.equal) and hashes the first (sha256). Then the fp32 product again
with TF32 on, to show that TF32 gives other bits (why `tf32` is a comparable key). Prints a table per process
and a verdict per computation: identical across repeats and across processes, or not. Without CUDA it runs on
the CPU at --size (logic only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def one_process(device_index: int | None, size: int, repeats: int, queue) -> None:
    from gpufleet.benchmarks.sdc import sdc_measure as sdc

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = sdc.WORKSPACE_CONFIG
    try:
        import torch

        device = torch.device("cuda", device_index) if device_index is not None else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        sdc.deterministic_algorithms(torch)
        sizes = dict(sdc.SIZES["gpu"], matmul_bf16=size, matmul_fp32=size)
        rows = []
        computations = sdc._computations(torch, device, sizes)
        for name, compute in list(computations.items()) + [("matmul_fp32_tf32_on", computations["matmul_fp32"])]:
            torch.backends.cuda.matmul.allow_tf32 = name.endswith("tf32_on")
            t0 = time.monotonic()
            first = compute()
            same = sum(torch.equal(compute(), first) for _ in range(repeats - 1))
            if device.type == "cuda":
                torch.cuda.synchronize()
            rows.append(
                {
                    "computation": name,
                    "repeats": repeats,
                    "identical_to_first": same + 1,
                    "sha256": sdc.tensor_sha256(first),
                    "seconds": round(time.monotonic() - t0, 2),
                }
            )
        queue.put(
            {
                "pid": os.getpid(),
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "cublas": sdc.cublas_version(),
                "rows": rows,
            }
        )
    except Exception as exc:  # the table says which process failed and why
        queue.put({"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--size", type=int, default=8192, help="M = N = K of the products (default 8192)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", help="write every process's rows here")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    device = args.device if torch.cuda.is_available() else None
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    runs = []
    for _ in range(args.processes):  # one after the other: each its own CUDA context, cuBLAS handle and heuristics
        p = ctx.Process(target=one_process, args=(device, args.size, args.repeats, queue))
        p.start()
        runs.append(queue.get(timeout=1800))
        p.join()
    print(f"{'process':>8} {'computation':<22} {'identical/repeats':>18} {'sha256':<18} {'s':>7}")
    for i, run in enumerate(runs):
        if "error" in run:
            print(f"{i:>8} error: {run['error']}")
            continue
        for r in run["rows"]:
            print(
                f"{i:>8} {r['computation']:<22} {r['identical_to_first']:>8}/{r['repeats']:<9} {r['sha256'][:16]:<18} {r['seconds']:>7}"
            )
    ok = [r for r in runs if "error" not in r]
    if ok:
        print(
            f"\n{ok[0]['device']}, torch {ok[0]['torch']}, CUDA {ok[0]['cuda']}, cuBLAS {ok[0]['cublas']}, size {args.size}"
        )
    holds = bool(ok) and len(ok) == len(runs)
    for name in [r["computation"] for r in ok[0]["rows"]] if ok else []:
        per = [next(r for r in run["rows"] if r["computation"] == name) for run in ok]
        repeats_ok = all(r["identical_to_first"] == r["repeats"] for r in per)
        across_ok = len({r["sha256"] for r in per}) == 1
        print(
            f"{name:<22} repeats identical: {'yes' if repeats_ok else 'NO'}; across {len(per)} processes: "
            f"{'yes' if across_ok else 'NO'}"
        )
        if not name.endswith("tf32_on"):
            holds = holds and repeats_ok and across_ok
    if ok:
        rows = ok[0]["rows"]
        tf32_same = rows[1]["sha256"] == rows[-1]["sha256"]
        print(f"fp32 with TF32 on gives {'the same bits as' if tf32_same else 'other bits than'} TF32 off")
    print("premise holds" if holds else "premise does NOT hold: the SDC check's hashes are not comparable here")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "processes": runs, "premise_holds": holds}, f, indent=1)
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
