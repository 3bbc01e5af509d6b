#!/usr/bin/env python3
"""Where a fine-tune micro-batch's time goes, on one GPU: host dispatch against GPU work, and the top kernels.

    python3 tools/finetune_profile.py OUT_DIR [--config CONFIG] [--micro-batches N] [--mode NAME]...

Builds the model, LoRA and batches as the fine-tune worker does (one rank), runs a few warm-up micro-batches
(forward and backward; compilation happens there), then for each --mode times N micro-batches:
  host_s  until backward() returns, before any synchronisation: the time the host needs to queue the work
  wall_s  after torch.cuda.synchronize(): when the GPU is done
When host_s is close to wall_s the GPU waits for the host (launch- or sync-bound); when host_s is much
smaller, the GPU is the limit. Modes (the batch as the model receives it):
  as-built   input_ids, labels, attention_mask, position_ids, as the worker passes them
  no-mask    no attention_mask: transformers finds the packed samples from position_ids and masks each
             sample off from the others (an explicit mask, so not the flash kernel)
  ids-only   input_ids and labels: no mask to inspect, positions 0..n-1 across the packed row
The first mode is then run once more under torch.profiler; OUT_DIR gets profile.txt (GPU busy and idle
time over the profiled micro-batches, the longest idle gaps with what the host was doing then, top kernels by
GPU time, top operators by host time), trace.json.gz and profile.json with every figure.

    python3 tools/finetune_profile.py --timeline TRACE.json.gz   prints the busy/idle part of a saved trace
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def timeline(events: list[dict], gap_us: float = 2000) -> dict:
    """GPU busy time (the union of kernel, copy and memset intervals) against the span from the first to the
    last, and the idle gaps longer than gap_us with the longest host operator running through each."""
    gpu = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )
    if not gpu:
        return {"gpu_events": 0}
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    busy_us, gaps, run_start, run_end = 0.0, [], gpu[0]["ts"], gpu[0]["ts"] + gpu[0]["dur"]
    for e in gpu[1:]:
        if e["ts"] > run_end:
            busy_us += run_end - run_start
            if e["ts"] - run_end > gap_us:
                gaps.append((run_end, e["ts"]))
            run_start = e["ts"]
        run_end = max(run_end, e["ts"] + e["dur"])
    busy_us += run_end - run_start
    span_us = run_end - gpu[0]["ts"]
    listed = []
    for g0, g1 in sorted(gaps, key=lambda g: g[0] - g[1])[:5]:
        # the innermost host operator running through at least 80% of the gap
        inside = [e for e in host if min(g1, e["ts"] + e["dur"]) - max(g0, e["ts"]) >= 0.8 * (g1 - g0)]
        op = min(inside, key=lambda e: e["dur"])["name"] if inside else None
        listed.append(
            {"at_ms": round((g0 - gpu[0]["ts"]) / 1e3, 1), "idle_ms": round((g1 - g0) / 1e3, 1), "host_op": op}
        )
    return {
        "gpu_events": len(gpu),
        "span_ms": span_us / 1e3,
        "busy_ms": busy_us / 1e3,
        "busy_fraction": busy_us / span_us,
        "idle_gaps_over_ms": gap_us / 1e3,
        "idle_in_gaps_ms": sum(g1 - g0 for g0, g1 in gaps) / 1e3,
        "longest_gaps": listed,
    }


def timeline_lines(tl: dict) -> list[str]:
    if not tl.get("gpu_events"):
        return ["no GPU events in the trace"]
    lines = [
        f"GPU busy {tl['busy_ms']:.1f} ms of {tl['span_ms']:.1f} ms ({100 * tl['busy_fraction']:.1f}%); "
        f"idle in gaps over {tl['idle_gaps_over_ms']:g} ms: {tl['idle_in_gaps_ms']:.1f} ms"
    ]
    lines += [
        f"  idle {g['idle_ms']:6.1f} ms at {g['at_ms']:7.1f} ms while the host ran {g['host_op']}"
        for g in tl["longest_gaps"]
    ]
    return lines


MODES = {"as-built": None, "no-mask": ("input_ids", "labels", "position_ids"), "ids-only": ("input_ids", "labels")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--timeline", metavar="TRACE", help="summarise a saved trace.json.gz and stop")
    p.add_argument("--config", default=str(REPO / "files/configs/qwen2-7b-lora-fast.yml"))
    p.add_argument("--micro-batches", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--mode", action="append", choices=sorted(MODES))
    a = p.parse_args()
    if a.timeline:
        print("\n".join(timeline_lines(timeline(json.load(gzip.open(a.timeline))["traceEvents"]))))
        return 0
    if not a.out:
        p.error("OUT_DIR is required (or --timeline TRACE)")
    modes = a.mode or list(MODES)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpufleet.finetune import config as fconfig, data, model as fmodel

    cfg = fconfig.load(a.config)
    t, d, m = cfg["training"], cfg["data"], cfg["model"]
    fconfig.require_runtime(cfg)
    cuda = torch.cuda.is_available()  # the CPU runs only check this script; the figures mean something on a GPU
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    torch.backends.cuda.matmul.allow_tf32 = t["tf32"]
    if cuda:
        fmodel.select_sdpa_backends(t["sdpa_backends"])
    torch.manual_seed(t["seed"])
    records = data.load_records(
        d["dataset_name"], hub=d["dataset_name_source"] == "hub", config_name=d["dataset_config"], split=d["split"]
    )
    train_idx, _ = data.split_indices(
        len(records), d["eval_samples"], t["seed"], d["max_samples"], source=d["dataset_name"]
    )
    tok = data.tokenizer(cfg, records, train_idx, 0, 1)
    dtype = getattr(torch, m["torch_dtype"]) if cuda else torch.float32
    model = fmodel.build_trainable(cfg, vocab_size=len(tok), dtype=dtype, device=device, device_map={"": str(device)})
    model.to(device).train()
    samples = data.Samples(records, tok, d["max_seq_length"])
    batches = data.prefetch(
        data.batches(
            samples.forever(train_idx, t["seed"]),
            t["per_device_train_batch_size"],
            d["max_seq_length"],
            d["packing"],
            tok.pad_token_id,
        ),
        pin=cuda,
    )

    def micro(keep):
        batch = next(batches)
        inputs = {
            k: v.to(device, non_blocking=True)
            for k, v in batch.items()
            if k != "real_tokens" and (keep is None or k in keep)
        }
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda and t["bf16"]):
            loss = model(**inputs).loss
        loss.backward()
        return batch["real_tokens"]

    t0 = time.perf_counter()
    for mode in modes:  # every mode compiles its own graphs here, outside the timing
        for _ in range(a.warmup):
            micro(MODES[mode])
    sync()
    warmup_s = time.perf_counter() - t0

    rows = []
    for mode in modes:
        host, wall, tokens = [], [], 0
        for _ in range(a.micro_batches):
            sync()
            t0 = time.perf_counter()
            tokens += micro(MODES[mode])
            host.append(time.perf_counter() - t0)
            sync()
            wall.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        rows.append(
            {
                "mode": mode,
                "host_s_median": sorted(host)[len(host) // 2],
                "wall_s_median": sorted(wall)[len(wall) // 2],
                "tokens_per_s": tokens / sum(wall),
                "host_s": host,
                "wall_s": wall,
            }
        )

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            micro(MODES[modes[0]])
        sync()
    avg = prof.key_averages()
    kernels = [e for e in avg if e.device_type.name == "CUDA"]  # operators' entries repeat their kernels' time
    top_gpu = sorted(kernels, key=lambda e: -e.self_device_time_total)[:30]
    top_cpu = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:20]
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    tl = timeline(json.loads(trace.read_text())["traceEvents"])
    with trace.open("rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()

    lines = [f"config {a.config}; 2 micro-batches profiled", *timeline_lines(tl), "", "top kernels by GPU time:"]
    lines += [f"  {e.self_device_time_total / 1e3:10.1f} ms {e.count:6d}x  {e.key[:110]}" for e in top_gpu]
    lines += ["", "top by host time (self):"]
    lines += [f"  {e.self_cpu_time_total / 1e3:10.1f} ms {e.count:6d}x  {e.key[:110]}" for e in top_cpu]
    (out / "profile.txt").write_text("\n".join(lines) + "\n")
    doc = {
        "config": a.config,
        "warmup_s": warmup_s,
        "modes": rows,
        "timeline": tl,
        "profile": {
            "micro_batches": 2,
            "kernels_launched": sum(e.count for e in kernels),
            "top_gpu": [{"name": e.key, "ms": e.self_device_time_total / 1e3, "count": e.count} for e in top_gpu],
            "top_host": [{"name": e.key, "ms": e.self_cpu_time_total / 1e3, "count": e.count} for e in top_cpu],
        },
    }
    (out / "profile.json").write_text(json.dumps(doc, indent=1))
    print("\n".join(lines[:2]))
    print(f"\n{'mode':10} {'host s':>8} {'wall s':>8} {'tokens/s':>10}")
    for r in rows:
        print(f"{r['mode']:10} {r['host_s_median']:8.3f} {r['wall_s_median']:8.3f} {r['tokens_per_s']:10,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
