"""LoRA fine-tune of a causal LM on function-calling data, one process per GPU under torchrun.

run() launches this module under torchrun on this host (one call per node in a multi-node run, each with
its own node rank); worker() is what each rank runs, in four pieces: setup() (process group, data, tokenizer,
model, AdamW and transformers' schedule with warm-up, DDP or DeepSpeed when the config names a DeepSpeed JSON),
train() (the loop: gradient accumulation, TensorBoard scalars, evaluate() on a held-out split before and after
training and every training.eval_steps), save_adapter() (save_pretrained) and figures(). Local rank 0 of every
node writes the run's figures as JSON.

Throughput counts real tokens only (padding excluded), over the optimizer steps after
training.timing_warmup_steps, all ranks summed over the slowest rank's time: tokens/s per GPU is that
total over the world size. MFU: see gpufleet.finetune.model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from gpufleet.bench.launch import torchrun
from gpufleet.errors import InputError
from gpufleet.finetune import config as fconfig
from gpufleet.finetune import data, failures, model as fmodel

FINETUNE_VERSION = 1


def _dist_sum(values: list[float], world: int, device) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return t.tolist()


def _dist_max(value: float, world: int, device) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# training.lr_scheduler_type -> transformers' schedule of that shape; each warms up over the warm-up steps.
SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def _tensorboard(log_dir: Path):
    """(writer or None, what happened): TensorBoard is optional; its absence is said, not hidden."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        return None, f"not written: tensorboard is not installed ({exc}); pip install tensorboard"
    return SummaryWriter(log_dir=str(log_dir)), f"written to {log_dir}"


@dataclass
class Rank:
    """What one rank set up and trains with."""

    cfg: dict
    out_dir: Path
    rank: int
    world: int
    local_rank: int
    local_world: int
    cuda: bool
    device: torch.device
    backend: str  # nccl or gloo; "deepspeed" in the figures when DeepSpeed trains
    deepspeed: object | None = None  # the module, when the config names a DeepSpeed JSON
    ds_config: dict | None = None
    hf_ds_config: object = None  # ZeRO-3: transformers' view of ds_config, alive while the model is built
    dtype: torch.dtype = torch.float32
    autocast: bool = False
    tokenizer: object = None
    model: object = None  # the peft model: what evaluates (without DeepSpeed) and what is saved
    net: object = None  # what trains: DeepSpeed's engine, DDP around the model, or the model
    ddp: object = None
    params: list = field(default_factory=list)
    opt: object = None
    sched: object = None
    counts: dict = field(default_factory=dict)
    eval_idx: list = field(default_factory=list)
    samples: object = None
    train_batches: object = None
    eval_batches: list = field(default_factory=list)
    n_eval: int = 0  # eval batches every rank runs: the most any rank has
    setup_s: float = 0.0

    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items() if k != "real_tokens"}

    def amp(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()

    def evaluator(self):
        return self.net if self.deepspeed else self.model


@dataclass
class Steps:
    """What the loop measured, one entry per optimizer step; evals: {"step", "loss"}."""

    losses: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    lrs: list = field(default_factory=list)
    evals: list = field(default_factory=list)


def _process_group(cfg: dict) -> tuple:
    """(rank, world, local rank, local world, cuda, device, backend, deepspeed module or None), the process group
    started when there is more than one rank."""
    t = cfg["training"]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    backend = cfg["distributed"]["ddp_backend"]
    backend = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not cuda:
        raise InputError(
            f"fine-tune config {cfg['path']}: distributed.ddp_backend nccl needs CUDA; this host has none "
            "(use auto or gloo)"
        )
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = t["tf32"]
        torch.backends.cudnn.allow_tf32 = t["tf32"]
        fmodel.select_sdpa_backends(t["sdpa_backends"])
    fconfig.require_runtime(cfg)
    deepspeed = None
    if cfg["distributed"]["deepspeed"]:
        import deepspeed  # only where the config asks for it: not every environment has it
    if world > 1:
        timeout = timedelta(seconds=cfg["distributed"]["collective_timeout_s"])
        if deepspeed:
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout, **({"device_id": device} if cuda else {}))
    return rank, world, local_rank, local_world, cuda, device, backend, deepspeed


def setup(config_path: str, max_steps: int | None = None, output_dir: str | None = None) -> Rank:
    """Everything a rank needs before its first step: config, process group, data, tokenizer, model, optimizer,
    schedule, batches."""
    t_start = time.perf_counter()
    cfg = fconfig.load(config_path)
    t, d, m = cfg["training"], cfg["data"], cfg["model"]
    if max_steps:
        t["max_steps"] = max_steps
    r = Rank(cfg, Path(output_dir or t["output_dir"]).resolve(), *_process_group(cfg))
    # bf16 weights on the GPU; on the CPU float32, where bf16 matmuls are slow and this run is a logic check.
    r.dtype = getattr(torch, m["torch_dtype"]) if r.cuda else torch.float32  # torch_dtype: bfloat16, float16, float32
    r.autocast = r.cuda and t["bf16"] and not r.deepspeed  # DeepSpeed casts by its own bf16 section
    torch.manual_seed(t["seed"])  # the same LoRA initialisation on every rank

    # Local rank 0 of each node loads first (a hub download lands in the cache once), then the others read the cache.
    if r.world > 1 and r.local_rank != 0:
        dist.barrier()
    records = data.load_records(
        d["dataset_name"], hub=d["dataset_name_source"] == "hub", config_name=d["dataset_config"], split=d["split"]
    )
    if r.world > 1 and r.local_rank == 0:
        dist.barrier()
    train_idx, r.eval_idx = data.split_indices(
        len(records), d["eval_samples"], t["seed"], d["max_samples"], source=d["dataset_name"]
    )
    if len(r.eval_idx) < r.world:
        raise InputError(
            f"fine-tune config {cfg['path']}: data.eval_samples {len(r.eval_idx)} is under the world size "
            f"{r.world}; every rank needs a held-out record to evaluate"
        )
    if r.deepspeed:
        r.ds_config = fconfig.deepspeed_config(cfg, r.world, r.cuda and t["bf16"])
        if r.ds_config["zero_optimization"].get("stage") == 3:
            # Must exist before the model is built, so transformers builds it sharded (zero.Init).
            from transformers.integrations import HfDeepSpeedConfig

            r.hf_ds_config = HfDeepSpeedConfig(r.ds_config)  # kept: transformers holds a weak reference
    r.tokenizer = data.tokenizer(cfg, records, train_idx, r.rank, r.world)
    device_map = {"": str(r.device)} if (r.cuda and not r.deepspeed) else None
    # Compiled layers compile at the first forward: inside timing_warmup_steps.
    r.model = fmodel.build_trainable(
        cfg,
        vocab_size=len(r.tokenizer),
        dtype=r.dtype,
        device=r.device if not r.deepspeed else None,
        device_map=device_map,
    )
    r.counts = fmodel.parameter_counts(r.model)
    if r.rank == 0:
        print(
            f"trainable params: {r.counts['params_trainable']:,} of {r.counts['params_total']:,} "
            f"({r.counts['trainable_pct']}%)",
            flush=True,
        )
    if not r.deepspeed:
        r.model.to(r.device)
    r.params = [p for p in r.model.parameters() if p.requires_grad]
    warmup = t["warmup_steps"] if t["warmup_steps"] is not None else math.ceil(t["warmup_ratio"] * t["max_steps"])
    r.opt = torch.optim.AdamW(
        r.params,
        lr=t["learning_rate"],
        weight_decay=t["weight_decay"],
        fused=r.cuda and t["optim"] == "adamw_torch_fused",
    )
    from transformers import get_scheduler  # transformers loads in the ranks, not in run()'s launcher

    r.sched = get_scheduler(
        SCHEDULES[t["lr_scheduler_type"]], r.opt, num_warmup_steps=warmup, num_training_steps=t["max_steps"]
    )
    if r.deepspeed:
        r.net, r.opt, _, r.sched = r.deepspeed.initialize(
            model=r.model, optimizer=r.opt, lr_scheduler=r.sched, config=r.ds_config
        )
    elif r.world > 1:
        r.ddp = r.net = torch.nn.parallel.DistributedDataParallel(
            r.model, device_ids=[r.local_rank] if r.cuda else None
        )
    else:
        r.net = r.model

    bs, pad_id = t["per_device_train_batch_size"], r.tokenizer.pad_token_id
    r.samples = data.Samples(records, r.tokenizer, d["max_seq_length"])
    r.train_batches = data.prefetch(
        data.batches(
            r.samples.forever(train_idx[r.rank :: r.world], t["seed"] + r.rank),
            bs,
            d["max_seq_length"],
            d["packing"],
            pad_id,
        ),
        pin=r.cuda,
    )
    r.eval_batches = list(
        data.batches(
            r.samples(r.eval_idx[r.rank :: r.world]),
            t["per_device_eval_batch_size"],
            d["max_seq_length"],
            d["packing"],
            pad_id,
        )
    )
    if not r.eval_batches:
        raise InputError(
            f"rank {r.rank}: none of its held-out records is usable ({r.samples.skipped}); raise data.eval_samples"
        )
    r.n_eval = int(_dist_max(len(r.eval_batches), r.world, r.device))
    r.setup_s = time.perf_counter() - t_start
    return r


def evaluate(r: Rank) -> float | None:
    """The mean loss per label token over every rank's held-out batches."""
    net = r.evaluator()
    net.eval()
    loss_sum, tokens = 0.0, 0.0
    with torch.no_grad():
        for i in range(r.n_eval):
            # A rank with fewer batches repeats its last, unweighted: ZeRO-3 needs every rank in every forward.
            batch = r.eval_batches[min(i, len(r.eval_batches) - 1)]
            with r.amp():
                out = net(**r.to_device(batch))
            n = int((batch["labels"][:, 1:] != data.IGNORE).sum())
            if i < len(r.eval_batches) and n:
                loss_sum, tokens = loss_sum + float(out.loss) * n, tokens + n
    net.train()
    loss_sum, tokens = _dist_sum([loss_sum, tokens], r.world, r.device)
    return loss_sum / tokens if tokens else None


def _step(r: Rank, steps: Steps) -> None:
    """One optimizer step over gradient_accumulation_steps micro-batches, timed up to its loss read back."""
    t = r.cfg["training"]
    accum = t["gradient_accumulation_steps"]
    t0 = time.perf_counter()
    loss_acc = torch.zeros((), device=r.device)
    tokens = 0
    for micro in range(accum):
        batch = next(r.train_batches)
        tokens += batch["real_tokens"]
        last = micro == accum - 1
        with r.ddp.no_sync() if (r.ddp is not None and not last) else contextlib.nullcontext():
            with r.amp():
                loss = r.net(**r.to_device(batch)).loss
            if r.deepspeed:
                r.net.backward(loss)
                r.net.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
            else:
                (loss / accum).backward()
        loss_acc += loss.detach() / accum
    if not r.deepspeed:
        steps.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(r.params, t["max_grad_norm"])))
        r.opt.step()
        r.sched.step()
        r.opt.zero_grad(set_to_none=True)
    steps.lrs.append(r.sched.get_last_lr()[0])
    loss_val = loss_acc.item()  # waits for the step: the timer below covers the GPU work
    if r.cuda:
        torch.cuda.synchronize(r.device)
    steps.seconds.append(time.perf_counter() - t0)
    steps.tokens.append(tokens)
    (loss_sum,) = _dist_sum([loss_val], r.world, r.device)
    steps.losses.append(loss_sum / r.world)


def train(r: Rank, tb) -> Steps:
    """training.max_steps optimizer steps, evaluated before, every training.eval_steps and after; the batch thread
    stopped at the end, however the loop ends."""
    t = r.cfg["training"]
    steps = Steps(evals=[{"step": 0, "loss": evaluate(r)}])
    if r.cuda:
        torch.cuda.reset_peak_memory_stats(r.device)
    r.net.train()
    try:
        for step in range(1, t["max_steps"] + 1):
            _step(r, steps)
            if r.rank == 0 and (step % t["logging_steps"] == 0 or step in (1, t["max_steps"])):
                print(
                    f"step {step}/{t['max_steps']} loss {steps.losses[-1]:.4f} lr {steps.lrs[-1]:.3g} "
                    f"step {steps.seconds[-1]:.3f}s tokens/s/rank {steps.tokens[-1] / steps.seconds[-1]:.0f}",
                    flush=True,
                )
            if tb is not None:
                tb.add_scalar("train/loss", steps.losses[-1], step)
                tb.add_scalar("train/lr", steps.lrs[-1], step)
                tb.add_scalar("train/tokens_per_s_rank0", steps.tokens[-1] / steps.seconds[-1], step)
                if steps.grad_norms:
                    tb.add_scalar("train/grad_norm", steps.grad_norms[-1], step)
            if t["eval_steps"] and step % t["eval_steps"] == 0 and step < t["max_steps"]:
                steps.evals.append({"step": step, "loss": evaluate(r)})
                if tb is not None and steps.evals[-1]["loss"] is not None:
                    tb.add_scalar("eval/loss", steps.evals[-1]["loss"], step)
    finally:
        # Stops and joins the batch thread: one still running while the interpreter exits can abort the
        # process (SIGABRT) after the run's results were written.
        r.train_batches.close()
    steps.evals.append({"step": t["max_steps"], "loss": evaluate(r)})
    if tb is not None:
        for e in (steps.evals[0], steps.evals[-1]):
            if e["loss"] is not None:
                tb.add_scalar("eval/loss", e["loss"], e["step"])
        tb.close()
    return steps


def save_adapter(r: Rank) -> Path | None:
    """The LoRA adapter and tokenizer, saved by rank 0 (under ZeRO-3 the weights gathered on every rank first)."""
    if not r.cfg["training"]["save_adapter"]:
        return None
    adapter_dir = r.out_dir / "adapter"
    gathered = contextlib.nullcontext()
    if r.deepspeed and r.ds_config["zero_optimization"].get("stage") == 3:
        r.net.empty_partition_cache()  # waits for the gathers the last eval prefetched, or the gather below fails
        gathered = r.deepspeed.zero.GatheredParameters(r.params, modifier_rank=None)  # on every rank, or it hangs
    with gathered:
        if r.rank == 0:
            r.model.save_pretrained(str(adapter_dir))
            r.tokenizer.save_pretrained(str(adapter_dir))
    return adapter_dir if r.rank == 0 else None


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
