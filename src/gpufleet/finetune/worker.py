"""LoRA fine-tune of a causal LM on function-calling data, one process per GPU under torchrun.

run() launches this module under torchrun on this host (one call per node in a multi-node run, each with
its own node rank); worker() is what each rank runs, in four pieces: rank.setup() (process group, data,
tokenizer, model, AdamW and transformers' schedule with warm-up, DDP or DeepSpeed when the config names a
DeepSpeed JSON), loop.train() (gradient accumulation, TensorBoard scalars, loop.evaluate() on a held-out split
before and after training and every training.eval_steps), loop.save_adapter() (save_pretrained) and figures().
Local rank 0 of every node writes the run's figures as JSON.

Throughput counts real tokens only (padding excluded), over the optimizer steps after
training.timing_warmup_steps, all ranks summed over the slowest rank's time: tokens/s per GPU is that
total over the world size. MFU: see gpufleet.finetune.model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from gpufleet.bench.launch import torchrun
from gpufleet.finetune import config as fconfig
from gpufleet.finetune import failures, model as fmodel
from gpufleet.finetune.loop import Steps, save_adapter, train
from gpufleet.finetune.rank import Rank, setup

FINETUNE_VERSION = 1


def _tensorboard(log_dir: Path):
    """(writer or None, what happened): TensorBoard is optional; its absence is said, not hidden."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        return None, f"not written: tensorboard is not installed ({exc}); pip install tensorboard"
    return SummaryWriter(log_dir=str(log_dir)), f"written to {log_dir}"


def figures(r: Rank, steps: Steps, adapter_dir: Path | None, tb_status: str) -> dict | None:
    """The run's figures, every rank's gathered (a collective: every rank calls it); None on a rank other than its
    node's local rank 0, which writes them."""
    t, d, m = r.cfg["training"], r.cfg["data"], r.cfg["model"]
    timed = slice(min(t["timing_warmup_steps"], max(0, len(steps.seconds) - 1)), None)  # keep at least one step
    local_tokens, local_s = sum(steps.tokens[timed]), sum(steps.seconds[timed])
    doc = {
        "rank": r.rank,
        "host": socket.gethostname(),
        "tokens_timed": local_tokens,
        "seconds_timed": local_s,
        "tokens_per_s": local_tokens / local_s if local_s else None,
        "step_s_median": sorted(steps.seconds[timed])[len(steps.seconds[timed]) // 2],
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(r.device) / 2**30 if r.cuda else None,
        "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # ru_maxrss is KiB on Linux
        "skipped_records": r.samples.skipped,
    }
    docs = [doc]
    if r.world > 1:
        docs = [None] * r.world
        dist.all_gather_object(docs, doc)
    if r.local_rank != 0:
        return None
    total_tokens = sum(x["tokens_timed"] for x in docs)
    slowest_s = max(x["seconds_timed"] for x in docs)
    steps_timed = len(steps.seconds[timed])
    accum, bs = t["gradient_accumulation_steps"], t["per_device_train_batch_size"]
    tokens_per_row = total_tokens / (steps_timed * accum * bs * r.world) if steps_timed else float("nan")
    return {
        "finetune_version": FINETUNE_VERSION,
        "world_size": r.world,
        "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", r.world // max(r.local_world, 1))),
        "node_rank": int(os.environ.get("GROUP_RANK", 0)),
        "host": socket.gethostname(),
        "device": "cuda" if r.cuda else "cpu",
        "device_name": torch.cuda.get_device_name(r.device) if r.cuda else "cpu",
        "backend": "deepspeed" if r.deepspeed else r.backend,
        "deepspeed_config": r.ds_config,
        "model": {
            "name": m["name"],
            "random_init": m["random_init"],
            "architecture": m["architecture"],
            "dtype": str(r.dtype).replace("torch.", ""),
            "attn_implementation": m["attn_implementation"],
            "vocab_size": len(r.tokenizer),
            "gradient_checkpointing": t["gradient_checkpointing"],
            "torch_compile": t["torch_compile"],
            "liger_kernels": t["liger_kernels"],
            "sdpa_backends": t["sdpa_backends"],
        },
        "lora": r.cfg["lora"],
        **r.counts,
        "steps": t["max_steps"],
        "timing_warmup_steps": timed.start,
        "per_device_train_batch_size": bs,
        "gradient_accumulation_steps": accum,
        "max_seq_length": d["max_seq_length"],
        "packing": d["packing"],
        "losses": steps.losses,
        "loss_first": steps.losses[0],
        "loss_last": steps.losses[-1],
        "lrs": steps.lrs,
        "grad_norms": steps.grad_norms,
        "evals": steps.evals,
        "eval_loss_first": steps.evals[0]["loss"],
        "eval_loss": steps.evals[-1]["loss"],
        "eval_samples": len(r.eval_idx),
        "tokens_per_s_total": total_tokens / slowest_s if slowest_s else None,
        "tokens_per_s_per_gpu": total_tokens / slowest_s / r.world if slowest_s else None,
        "tokens_per_row": tokens_per_row,
        "step_s_median": max(x["step_s_median"] for x in docs),
        "flops": fmodel.flops_per_token(r.model, tokens_per_row),
        "peak_gpu_memory_gib": max((x["peak_gpu_memory_gib"] or 0) for x in docs) if r.cuda else None,
        "peak_host_rss_gib": max(x["peak_host_rss_gib"] for x in docs),
        "setup_s": r.setup_s,
        "train_s": sum(steps.seconds),
        "adapter_dir": str(adapter_dir) if adapter_dir else None,
        "output_dir": str(r.out_dir),
        "tensorboard": tb_status if r.rank == 0 else "written by rank 0 only",
        "ranks": docs,
    }


def worker(config_path: str, out_path: str, max_steps: int | None = None, output_dir: str | None = None) -> None:
    """What each rank runs: set up, train, save the adapter; its node's local rank 0 writes the figures."""
    r = setup(config_path, max_steps, output_dir)
    tb, tb_status = (None, "not written: training.tensorboard is false")
    if r.rank == 0 and r.cfg["training"]["tensorboard"]:
        tb, tb_status = _tensorboard(r.out_dir / "tensorboard")
    steps = train(r, tb)
    adapter_dir = save_adapter(r)
    result = figures(r, steps, adapter_dir, tb_status)
    if result is not None:
        Path(out_path).write_text(json.dumps(result))
    if r.deepspeed:  # its hooks and buffers released while the process group still stands, not at interpreter exit
        r.net.destroy()
    if r.world > 1:
        dist.barrier()
        dist.destroy_process_group()


def run(
    config_path: str,
    *,
    nproc_per_node: int | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29513,
    timeout_s: float | None = None,
    rdzv_timeout_s: int | None = None,
    max_steps: int | None = None,
    output_dir: str | None = None,
    env_extra: dict | None = None,
) -> dict:
    """Launch the fine-tune on this host under torchrun; the run's figures as this node's local rank 0 saw them.

    Bad configs raise InputError here, before anything starts. Timeouts default to the config's
    distributed.timeout_s and distributed.rdzv_timeout_s.
    """
    cfg = fconfig.load(config_path)
    fconfig.require_runtime(cfg)
    timeout_s = timeout_s or cfg["distributed"]["timeout_s"]
    rdzv_timeout_s = rdzv_timeout_s or cfg["distributed"]["rdzv_timeout_s"]
    n_gpus = torch.cuda.device_count()
    nproc = nproc_per_node or n_gpus or 1
    out_dir = str(Path(output_dir or cfg["training"]["output_dir"]).resolve())
    args = ["--config", str(Path(config_path).resolve()), "--output-dir", out_dir]
    if max_steps:
        args += ["--max-steps", str(max_steps)]
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
    res = torchrun(
        "gpufleet.finetune.worker",
        args,
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        timeout_s=timeout_s,
        rdzv_timeout_s=rdzv_timeout_s,
        env_extra=env,
        prefix="gpufleet-finetune-",
    )
    log = res["log_tail"]
    if res["workdir"] and Path(res["workdir"], "torchrun.log").is_file():
        log = Path(res["workdir"], "torchrun.log").read_text(errors="replace")
    failure = failures.describe(
        log,
        rc=res["rc"],
        timed_out=res["timed_out"],
        timeout_s=timeout_s,
        rdzv_timeout_s=rdzv_timeout_s,
        master=f"{master_addr}:{master_port}",
        node_rank=node_rank,
    )
    return {
        "benchmark": "finetune",
        "config_path": str(config_path),
        "device": "cuda" if n_gpus else "cpu",
        "method": {
            "finetune_version": FINETUNE_VERSION,
            "loop": "plain PyTorch; DDP, or DeepSpeed when configured",
            "timer": "perf_counter around each optimizer step, after the loss is read back",
            "tokens": "real tokens (padding excluded), all ranks, over the slowest rank's time",
            "mfu": "4N + 6N_lora + 12LHQT per token (gpufleet.finetune.model)",
        },
        "launch": {
            "nproc_per_node": nproc,
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
            "timeout_s": timeout_s,
            "rdzv_timeout_s": rdzv_timeout_s,
        },
        **{k: res[k] for k in ("command", "rc", "timed_out", "seconds", "log_tail", "workdir")},
        "failure": failure,
        **res["out"],
    }


@record  # writes the exception to torchrun's error file: the root cause names this rank and what it raised
def main(argv=None):
    p = argparse.ArgumentParser(prog="gpufleet.finetune.worker")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--output-dir")
    a = p.parse_args(argv)
    worker(a.config, a.out, a.max_steps, a.output_dir)


if __name__ == "__main__":
    main()
