"""GPT-2-small training gate on this machine: per-GPU batch sweep on one GPU, then every GPU with DDP.

Usage: python3 tools/train_gate_sweep.py OUT_DIR [batch ...]
Writes OUT_DIR/train-gate.json and prints a table: tokens/s per GPU, MFU (989 TFLOPS dense bf16
peak, H100/H200 datasheet), step time, peak memory, and the scaling efficiency.
"""

import json
import sys
from pathlib import Path

import torch

from gpufleet.base import numbers
from gpufleet.train import gpt2

PEAK_TFLOPS = 989


def row(tag, r):
    if r.get("rc") != 0:
        print(f"{tag:28} failed rc={r.get('rc')}: {r.get('log_tail', '')[:400]}")
        return
    r0 = r["ranks"][0]
    mfu = numbers.mfu(r["tokens_per_s_per_gpu"], r0["flops_per_token"], PEAK_TFLOPS)
    print(
        f"{tag:28} {r['tokens_per_s_per_gpu']:>10,.0f} tok/s/GPU  MFU {mfu:6.1%}  step {r0['step_s_median'] * 1e3:7.1f} ms  "
        f"mem {r0['peak_memory_gib']:5.1f} GiB  loss {r0['loss_first']:.2f}->{r0['loss_last']:.2f}"
    )


def main(out_dir, *batches):
    out = Path(out_dir)
    batches = [int(b) for b in batches] or [16, 32, 64]
    n = torch.cuda.device_count()
    results = {"single": {}, "all": None}
    for b in batches:
        results["single"][b] = gpt2.run(batch=b, nproc_per_node=1, steps=30, warmup=10)
        row(f"1 GPU, batch {b}", results["single"][b])
    ok = {b: r for b, r in results["single"].items() if r.get("rc") == 0}
    best = max(ok, key=lambda b: ok[b]["tokens_per_s_per_gpu"])
    if n > 1:
        results["all"] = gpt2.run(batch=best, nproc_per_node=n, steps=30, warmup=10)
        row(f"{n} GPUs DDP, batch {best}", results["all"])
        if results["all"].get("rc") == 0:
            eff = results["all"]["tokens_per_s_per_gpu"] / ok[best]["tokens_per_s_per_gpu"]
            print(f"scaling efficiency on {n} GPUs: {eff:.3f}")
    (out / "train-gate.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
