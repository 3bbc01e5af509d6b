"""One rank of the fine-tune set up: its process group, data, tokenizer, model, optimizer and schedule.

setup() gives a Rank: the process group (NCCL or gloo, or DeepSpeed's when the config names a DeepSpeed JSON),
the held-out and training batches, the LoRA model, AdamW and transformers' schedule with warm-up
(`get_scheduler`), wrapped in DDP or DeepSpeed's engine. dist_sum() and dist_max(): the sums and maxima over
every rank that the loss and the evaluation need, the value itself on a single rank.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gpufleet.base.errors import InputError
from gpufleet.finetune import config as fconfig
from gpufleet.finetune import data, model as fmodel


def dist_sum(values: list[float], world: int, device) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return t.tolist()


def dist_max(value: float, world: int, device) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# training.lr_scheduler_type -> transformers' schedule of that shape; each warms up over the warm-up steps.
SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


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
    r.n_eval = int(dist_max(len(r.eval_batches), r.world, r.device))
    r.setup_s = time.perf_counter() - t_start
    return r
