#!/usr/bin/env python3
"""Throughput of fine-tune settings, each a named variant of one base config, on one GPU or a group of GPUs.

    python3 tools/finetune_sweep.py OUT_DIR [--base CONFIG] [--gpus 0,1] [--gpus-per-variant N] [--repeat N]
                                      [--budget-s S] [--run-timeout-s S] VARIANT...

--gpus is cut into groups of --gpus-per-variant (default 1). Variants run one after another on each group,
in parallel across groups (round robin), each as `python3 -m gpufleet finetune --config <variant config>
--nproc-per-node N --json` with CUDA_VISIBLE_DEVICES set to its group and a compile cache of its own (each run
compiles from scratch). --repeat N runs each variant N times; runs after the first are named VARIANT-2,
VARIANT-3, ... OUT_DIR gets every run's config, host document and log, and sweep.json; the last thing printed
is a table. A run that would start past --budget-s is left out and said so.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "files/configs/qwen2-7b-lora-throughput.yml"
NO_GC = {
    "training.gradient_checkpointing": False,
    "training.per_device_train_batch_size": 1,
    "training.gradient_accumulation_steps": 8,
}
NOT_CUDNN = ["flash", "efficient", "math"]
ALL_LIGER = ["rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"]
# name -> dotted overrides of the base config
VARIANTS = {
    "seeds": {},
    "nogc": NO_GC,
    "nogc-liger": {**NO_GC, "training.liger_kernels": ALL_LIGER},
    "nogc-compile": {**NO_GC, "training.torch_compile": "layers"},
    "nogc-compile-flce": {
        **NO_GC,
        "training.torch_compile": "layers",
        "training.liger_kernels": ["fused_linear_cross_entropy"],
    },
    "nogc-compile-liger": {**NO_GC, "training.torch_compile": "layers", "training.liger_kernels": ALL_LIGER},
    "nogc-compile-flce-drop0": {
        **NO_GC,
        "training.torch_compile": "layers",
        "training.liger_kernels": ["fused_linear_cross_entropy"],
        "lora.dropout": 0.0,
    },
    "nogc-liger-drop0": {**NO_GC, "training.liger_kernels": ALL_LIGER, "lora.dropout": 0.0},
    "nogc-compile-drop0": {**NO_GC, "training.torch_compile": "layers", "lora.dropout": 0.0},
    "nogc-compile-seq2048": {
        **NO_GC,
        "training.torch_compile": "layers",
        "data.max_seq_length": 2048,
        "training.gradient_accumulation_steps": 16,
    },
    # ... and attention by flash (or the memory-efficient kernel where a mask is needed), not cuDNN.
    "nogc-compile-drop0-flash": {
        **NO_GC,
        "training.torch_compile": "layers",
        "lora.dropout": 0.0,
        "training.sdpa_backends": NOT_CUDNN,
    },
    "nogc-compile-drop0-flash-seq2048": {
        **NO_GC,
        "training.torch_compile": "layers",
        "lora.dropout": 0.0,
        "training.sdpa_backends": NOT_CUDNN,
        "data.max_seq_length": 2048,
        "training.gradient_accumulation_steps": 16,
    },
    # The seeds' optimized variant: batch 4, accumulation 2, gradient checkpointing, their ZeRO-3 JSON.
    "zero3": {
        "training.per_device_train_batch_size": 4,
        "training.gradient_accumulation_steps": 2,
        "distributed.deepspeed": str(REPO / "files/configs/ds_config_zero3_optimized.json"),
    },
}


def variant_config(base: Path, overrides: dict) -> dict:
    doc = copy.deepcopy(yaml.safe_load(base.read_text()))
    data_path = Path(doc["data"]["dataset_name"])
    if not data_path.is_absolute() and (base.parent / data_path).exists():
        doc["data"]["dataset_name"] = str((base.parent / data_path).resolve())
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        doc.setdefault(section, {})[key] = value
    return doc


def run_variant(name: str, gpu: str, base: Path, out: Path, run_timeout_s: int, master_port: int) -> dict:
    """One run (a variant, or VARIANT-N for its Nth run) on the GPUs listed in `gpu`, one rank per GPU."""
    variant = name if name in VARIANTS else name.rsplit("-", 1)[0]
    cfg_path = out / f"{name}.yml"
    overrides = {**VARIANTS[variant], "distributed.timeout_s": run_timeout_s}
    cfg_path.write_text(yaml.safe_dump(variant_config(base, overrides), sort_keys=False))
    env = dict(
        os.environ, CUDA_VISIBLE_DEVICES=gpu, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix=f"inductor-{name}-")
    )
    cmd = [
        sys.executable,
        "-m",
        "gpufleet",
        "finetune",
        "--config",
        str(cfg_path),
        "--nproc-per-node",
        str(len(gpu.split(","))),
        "--master-port",
        str(master_port),
        "--output-dir",
        f"/tmp/finetune-sweep/{name}",
        "--json",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    (out / f"{name}.log").write_text(proc.stderr)
    row = {
        "variant": name,
        "gpu": gpu,
        "overrides": VARIANTS[variant],
        "wall_s": round(time.monotonic() - t0, 1),
        "command": " ".join(cmd[1:]),
    }
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {**row, "status": "error", "reason": f"no host document (rc {proc.returncode}); see {name}.log"}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    res = next(r for r in doc["results"] if r["group"] == "finetune")
    d = res["detail"]
    return {
        **row,
        "status": res["status"],
        "reason": res["reason"],
        "tokens_per_s_per_gpu": res.get("value"),
        "mfu": d.get("mfu"),
        "step_s_median": d.get("step_s_median"),
        "peak_gpu_memory_gib": d.get("peak_gpu_memory_gib"),
        "loss_first": d.get("loss_first"),
        "loss_last": d.get("loss_last"),
        "tokens_per_row": d.get("tokens_per_row"),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("variants", nargs="+", choices=sorted(VARIANTS))
    p.add_argument("--base", type=Path, default=BASE)
    p.add_argument("--gpus", default="0")
    p.add_argument("--gpus-per-variant", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=400, help="start no variant after this many seconds")
    p.add_argument("--run-timeout-s", type=int, default=300, help="distributed.timeout_s of each variant")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = a.gpus.split(",")
    k = a.gpus_per_variant
    if k < 1 or len(ids) % k:
        p.error(f"--gpus-per-variant {k} must divide the {len(ids)} GPUs of --gpus {a.gpus}")
    gpus = [",".join(ids[i : i + k]) for i in range(0, len(ids), k)]
    runs = [v if n == 1 else f"{v}-{n}" for n in range(1, a.repeat + 1) for v in a.variants]
    queues = {g: runs[i :: len(gpus)] for i, g in enumerate(gpus)}
    rows: list[dict] = []
    t_start = time.monotonic()

    def drain(gpu):
        for name in queues[gpu]:
            if time.monotonic() - t_start > a.budget_s:
                rows.append(
                    {"variant": name, "gpu": gpu, "status": "not run", "reason": f"past --budget-s {a.budget_s}"}
                )
                continue
            rows.append(run_variant(name, gpu, a.base, out, a.run_timeout_s, 29600 + gpus.index(gpu)))
            print(json.dumps(rows[-1]), flush=True)

    threads = [threading.Thread(target=drain, args=(g,)) for g in gpus]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows.sort(key=lambda r: runs.index(r["variant"]))
    (out / "sweep.json").write_text(json.dumps({"base": str(a.base), "rows": rows}, indent=1))
    print(
        f"\n{'variant':26} {'gpu':>5} {'status':6} {'tok/s/GPU':>10} {'MFU':>6} {'step s':>7} {'mem GiB':>8} {'loss':>15} {'wall s':>7}"
    )
    for r in rows:
        tps = r.get("tokens_per_s_per_gpu")
        mfu = r.get("mfu")
        loss = f"{r['loss_first']:.2f}->{r['loss_last']:.2f}" if r.get("loss_first") is not None else ""
        print(
            f"{r['variant']:26} {r['gpu']:>5} {r['status']:6} {tps or 0:>10,.0f} {100 * (mfu or 0):>5.1f}% "
            f"{r.get('step_s_median') or 0:>7.2f} {r.get('peak_gpu_memory_gib') or 0:>8.1f} {loss:>15} {r.get('wall_s', 0):>7}"
        )
        if r["status"] not in ("pass", "warn"):
            print(f"    {r['reason'][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
