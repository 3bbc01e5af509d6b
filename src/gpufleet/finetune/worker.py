"""LoRA fine-tune of a causal LM on function-calling data, one process per GPU under torchrun.

run() launches this module under torchrun on this host (one call per node in a multi-node run, each with
its own node rank); worker() is what each rank runs: a plain PyTorch loop with DDP (or DeepSpeed when the
config names a DeepSpeed JSON), AdamW, a cosine schedule with warm-up, gradient accumulation, eval loss on
a held-out split before and after training (and every training.eval_steps), TensorBoard scalars, and the
adapter saved with save_pretrained. Local rank 0 of every node writes the run's figures as JSON.

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
import socket
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from gpufleet.bench.launch import torchrun
from gpufleet.errors import InputError
from gpufleet.finetune import config as fconfig
from gpufleet.finetune import data, failures, model as fmodel

FINETUNE_VERSION = 1


def _dist_sum(values: list[float], world: int, device) -> list[float]:
    import torch
    import torch.distributed as dist

    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return t.tolist()


def _dist_max(value: float, world: int, device) -> float:
    import torch
    import torch.distributed as dist

    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _tokenizer(cfg, records, train_idx, rank, world):
    """model.build_tokenizer: rank 0 trains a BPE and sends it to every rank; else AutoTokenizer."""
    build = cfg["model"]["build_tokenizer"]
    if build is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg["model"]["tokenizer"] or cfg["model"]["name"])
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    import torch.distributed as dist

    payload = [None]
    if rank == 0:
        texts = []
        for i in train_idx:
            try:
                texts.append(data.conversation_text(records[i]))
            except data.GlaiveFormatError:
                continue
        payload = [data.build_bpe_tokenizer(texts, build.get("vocab_size", 1024)).backend_tokenizer.to_str()]
    if world > 1:
        dist.broadcast_object_list(payload, src=0)  # BPE training is not bit-reproducible across processes
    return data.wrap_tokenizer(payload[0])


def _lr_lambda(kind: str, warmup: int, total: int):
    def f(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1 + math.cos(math.pi * progress))) if kind == "cosine" else max(0.0, 1 - progress)
    return f


def _tensorboard(log_dir: Path):
    """(writer or None, what happened): TensorBoard is optional; its absence is said, not hidden."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        return None, f"not written: tensorboard is not installed ({exc}); pip install tensorboard"
    return SummaryWriter(log_dir=str(log_dir)), f"written to {log_dir}"


def _deepspeed_config(cfg, world: int, bf16: bool) -> dict:
    """The DeepSpeed JSON with its "auto" values filled from the training section."""
    t = cfg["training"]
    ds = json.loads(json.dumps(cfg["distributed"]["deepspeed_config"]))
    fill = {"train_micro_batch_size_per_gpu": t["per_device_train_batch_size"],
            "gradient_accumulation_steps": t["gradient_accumulation_steps"],
            "train_batch_size": t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] * world,
            "gradient_clipping": t["max_grad_norm"]}
    for key, val in fill.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = val
    if isinstance(ds.get("bf16"), dict) and ds["bf16"].get("enabled") == "auto":
        ds["bf16"]["enabled"] = bf16
    return ds


def worker(config_path: str, out_path: str, max_steps: int | None = None, output_dir: str | None = None) -> None:
    import resource

    import torch
    import torch.distributed as dist

    t_start = time.perf_counter()
    cfg = fconfig.load(config_path)
    t, d, m = cfg["training"], cfg["data"], cfg["model"]
    if max_steps:
        t["max_steps"] = max_steps
    out_dir = Path(output_dir or t["output_dir"]).resolve()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    backend = {"auto": "nccl" if cuda else "gloo"}.get(cfg["distributed"]["ddp_backend"], cfg["distributed"]["ddp_backend"])
    if backend == "nccl" and not cuda:
        raise InputError(f"fine-tune config {cfg['path']}: distributed.ddp_backend nccl needs CUDA; this host has none (use auto or gloo)")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = t["tf32"]
        torch.backends.cudnn.allow_tf32 = t["tf32"]
        fmodel.select_sdpa_backends(t["sdpa_backends"])
    use_ds = bool(cfg["distributed"]["deepspeed"])
    fconfig.require_runtime(cfg)
    if use_ds:
        import deepspeed
    if world > 1:
        from datetime import timedelta

        timeout = timedelta(seconds=cfg["distributed"]["collective_timeout_s"])
        if use_ds:
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout, **({"device_id": device} if cuda else {}))
    # bf16 weights on the GPU; on the CPU float32, where bf16 matmuls are slow and this run is a logic check.
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[m["torch_dtype"]] if cuda else torch.float32
    autocast = cuda and t["bf16"] and not use_ds  # DeepSpeed casts by its own bf16 section
    torch.manual_seed(t["seed"])  # the same LoRA initialisation on every rank

    # Local rank 0 of each node loads first (a hub download lands in the cache once), then the others read the cache.
    if world > 1 and local_rank != 0:
        dist.barrier()
    records = data.load_records(d["dataset_name"], hub=d["dataset_name_source"] == "hub", config_name=d["dataset_config"],
                                split=d["split"])
    if world > 1 and local_rank == 0:
        dist.barrier()
    train_idx, eval_idx = data.split_indices(len(records), d["eval_samples"], t["seed"], d["max_samples"], source=d["dataset_name"])
    if len(eval_idx) < world:
        raise InputError(f"fine-tune config {cfg['path']}: data.eval_samples {len(eval_idx)} is under the world size {world}; "
                         "every rank needs a held-out record to evaluate")
    if use_ds:
        ds_config = _deepspeed_config(cfg, world, cuda and t["bf16"])
        if ds_config["zero_optimization"].get("stage") == 3:
            # Must exist before the model is built, so transformers builds it sharded (zero.Init).
            from transformers.integrations import HfDeepSpeedConfig

            _keep = HfDeepSpeedConfig(ds_config)  # noqa: F841  (transformers holds a weak reference)
    tokenizer = _tokenizer(cfg, records, train_idx, rank, world)
    vocab = len(tokenizer)
    device_map = {"": str(device)} if (cuda and not use_ds) else None
    # Compiled layers compile at the first forward: inside timing_warmup_steps.
    model = fmodel.build_trainable(cfg, vocab_size=vocab, dtype=dtype, device=device if not use_ds else None,
                                   device_map=device_map)
    counts = fmodel.parameter_counts(model)
    if rank == 0:
        print(f"trainable params: {counts['params_trainable']:,} of {counts['params_total']:,} ({counts['trainable_pct']}%)", flush=True)
    if not use_ds:
        model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    warmup = t["warmup_steps"] if t["warmup_steps"] is not None else math.ceil(t["warmup_ratio"] * t["max_steps"])
    opt = torch.optim.AdamW(params, lr=t["learning_rate"], weight_decay=t["weight_decay"],
                            fused=cuda and t["optim"] == "adamw_torch_fused")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(t["lr_scheduler_type"], warmup, t["max_steps"]))
    ddp = None
    if use_ds:
        engine, opt, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_config)
        net = engine
    elif world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
        net = ddp
    else:
        net = model
    plain = model  # the peft model: eval, save

    accum, bs = t["gradient_accumulation_steps"], t["per_device_train_batch_size"]
    pad_id = tokenizer.pad_token_id
    samples = data.Samples(records, tokenizer, d["max_seq_length"])
    train_batches = data.prefetch(data.batches(samples.forever(train_idx[rank::world], t["seed"] + rank), bs,
                                               d["max_seq_length"], d["packing"], pad_id), pin=cuda)
    eval_batches = list(data.batches(samples(eval_idx[rank::world]), t["per_device_eval_batch_size"], d["max_seq_length"],
                                     d["packing"], pad_id))
    if not eval_batches:
        raise InputError(f"rank {rank}: none of its held-out records is usable ({samples.skipped}); raise data.eval_samples")
    n_eval = int(_dist_max(len(eval_batches), world, device))

    def to_dev(batch):
        return {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "real_tokens"}

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

    def evaluate() -> float | None:
        (engine if use_ds else plain).eval()
        loss_sum, tokens = 0.0, 0.0
        with torch.no_grad():
            for i in range(n_eval):
                # A rank with fewer batches repeats its last, unweighted: ZeRO-3 needs every rank in every forward.
                batch = eval_batches[min(i, len(eval_batches) - 1)]
                with amp():
                    out = (engine if use_ds else plain)(**to_dev(batch))
                n = int((batch["labels"][:, 1:] != data.IGNORE).sum())
                if i < len(eval_batches) and n:
                    loss_sum, tokens = loss_sum + float(out.loss) * n, tokens + n
        (engine if use_ds else plain).train()
        loss_sum, tokens = _dist_sum([loss_sum, tokens], world, device)
        return loss_sum / tokens if tokens else None

    tb, tb_status = (None, "not written: training.tensorboard is false")
    if rank == 0 and t["tensorboard"]:
        tb, tb_status = _tensorboard(out_dir / "tensorboard")
    setup_s = time.perf_counter() - t_start
    eval_first = evaluate()
    evals = [{"step": 0, "loss": eval_first}]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses, step_s, step_tokens, grad_norms, lrs = [], [], [], [], []
    net.train()
    try:
        for step in range(t["max_steps"]):
            t0 = time.perf_counter()
            loss_acc = torch.zeros((), device=device)
            tokens = 0
            for micro in range(accum):
                batch = next(train_batches)
                tokens += batch["real_tokens"]
                last = micro == accum - 1
                sync = ddp.no_sync() if (ddp is not None and not last) else contextlib.nullcontext()
                with sync:
                    with amp():
                        loss = net(**to_dev(batch)).loss
                    if use_ds:
                        engine.backward(loss)
                        engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
                    else:
                        (loss / accum).backward()
                loss_acc += loss.detach() / accum
            if not use_ds:
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, t["max_grad_norm"])))
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            lrs.append(sched.get_last_lr()[0])
            loss_val = loss_acc.item()  # waits for the step: the timer below covers the GPU work
            if cuda:
                torch.cuda.synchronize(device)
            step_s.append(time.perf_counter() - t0)
            step_tokens.append(tokens)
            (loss_mean,) = _dist_sum([loss_val], world, device)
            losses.append(loss_mean / world)
            if rank == 0 and ((step + 1) % t["logging_steps"] == 0 or step == 0 or step + 1 == t["max_steps"]):
                print(f"step {step + 1}/{t['max_steps']} loss {losses[-1]:.4f} lr {lrs[-1]:.3g} "
                      f"step {step_s[-1]:.3f}s tokens/s/rank {tokens / step_s[-1]:.0f}", flush=True)
            if tb is not None:
                tb.add_scalar("train/loss", losses[-1], step + 1)
                tb.add_scalar("train/lr", lrs[-1], step + 1)
                tb.add_scalar("train/tokens_per_s_rank0", tokens / step_s[-1], step + 1)
                if grad_norms:
                    tb.add_scalar("train/grad_norm", grad_norms[-1], step + 1)
            if t["eval_steps"] and (step + 1) % t["eval_steps"] == 0 and step + 1 < t["max_steps"]:
                evals.append({"step": step + 1, "loss": evaluate()})
                if tb is not None and evals[-1]["loss"] is not None:
                    tb.add_scalar("eval/loss", evals[-1]["loss"], step + 1)
    finally:
        # Stops and joins the batch thread: one still running while the interpreter exits can abort the
        # process (SIGABRT) after the run's results were written.
        train_batches.close()
    evals.append({"step": t["max_steps"], "loss": evaluate()})
    if tb is not None:
        for e in (evals[0], evals[-1]):
            if e["loss"] is not None:
                tb.add_scalar("eval/loss", e["loss"], e["step"])
        tb.close()

    adapter_dir = None
    if t["save_adapter"]:
        adapter_dir = out_dir / "adapter"
        gathered = contextlib.nullcontext()
        if use_ds and ds_config["zero_optimization"].get("stage") == 3:
            engine.empty_partition_cache()  # waits for the gathers the last eval prefetched, or the gather below fails
            gathered = deepspeed.zero.GatheredParameters(params, modifier_rank=None)  # on every rank, or it hangs
        with gathered:
            if rank == 0:
                plain.save_pretrained(str(adapter_dir))
                tokenizer.save_pretrained(str(adapter_dir))

    timed = slice(min(t["timing_warmup_steps"], max(0, len(step_s) - 1)), None)  # keep at least one step
    local_tokens, local_s = sum(step_tokens[timed]), sum(step_s[timed])
    doc = {
        "rank": rank,
        "host": socket.gethostname(),
        "tokens_timed": local_tokens,
        "seconds_timed": local_s,
        "tokens_per_s": local_tokens / local_s if local_s else None,
        "step_s_median": sorted(step_s[timed])[len(step_s[timed]) // 2],
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # ru_maxrss is KiB on Linux
        "skipped_records": samples.skipped,
    }
    if world > 1:
        docs = [None] * world
        dist.all_gather_object(docs, doc)
    else:
        docs = [doc]
    total_tokens = sum(x["tokens_timed"] for x in docs)
    slowest_s = max(x["seconds_timed"] for x in docs)
    steps_timed = len(step_s[timed])
    rows_per_step = accum * bs * world
    tokens_per_row = total_tokens / (steps_timed * rows_per_step) if steps_timed else float("nan")
    flops = fmodel.flops_per_token(plain, tokens_per_row)
    if local_rank == 0:
        result = {
            "finetune_version": FINETUNE_VERSION,
            "world_size": world,
            "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", world // max(local_world, 1))),
            "node_rank": int(os.environ.get("GROUP_RANK", 0)),
            "host": socket.gethostname(),
            "device": "cuda" if cuda else "cpu",
            "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "backend": "deepspeed" if use_ds else backend,
            "deepspeed_config": ds_config if use_ds else None,
            "model": {"name": m["name"], "random_init": m["random_init"], "architecture": m["architecture"],
                      "dtype": str(dtype).replace("torch.", ""), "attn_implementation": m["attn_implementation"],
                      "vocab_size": vocab, "gradient_checkpointing": t["gradient_checkpointing"],
                      "torch_compile": t["torch_compile"], "liger_kernels": t["liger_kernels"],
                      "sdpa_backends": t["sdpa_backends"]},
            "lora": cfg["lora"],
            **counts,
            "steps": t["max_steps"],
            "timing_warmup_steps": timed.start,
            "per_device_train_batch_size": bs,
            "gradient_accumulation_steps": accum,
            "max_seq_length": d["max_seq_length"],
            "packing": d["packing"],
            "losses": losses,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "lrs": lrs,
            "grad_norms": grad_norms,
            "evals": evals,
            "eval_loss_first": evals[0]["loss"],
            "eval_loss": evals[-1]["loss"],
            "eval_samples": len(eval_idx),
            "tokens_per_s_total": total_tokens / slowest_s if slowest_s else None,
            "tokens_per_s_per_gpu": total_tokens / slowest_s / world if slowest_s else None,
            "tokens_per_row": tokens_per_row,
            "step_s_median": max(x["step_s_median"] for x in docs),
            "flops": flops,
            "peak_gpu_memory_gib": max((x["peak_gpu_memory_gib"] or 0) for x in docs) if cuda else None,
            "peak_host_rss_gib": max(x["peak_host_rss_gib"] for x in docs),
            "setup_s": setup_s,
            "train_s": sum(step_s),
            "adapter_dir": str(adapter_dir) if adapter_dir and rank == 0 else None,
            "output_dir": str(out_dir),
            "tensorboard": tb_status if rank == 0 else "written by rank 0 only",
            "ranks": docs,
        }
        Path(out_path).write_text(json.dumps(result))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def run(config_path: str, *, nproc_per_node: int | None = None, nnodes: int = 1, node_rank: int = 0,
        master_addr: str = "127.0.0.1", master_port: int = 29513, timeout_s: float | None = None,
        rdzv_timeout_s: int | None = None, max_steps: int | None = None, output_dir: str | None = None,
        env_extra: dict | None = None) -> dict:
    """Launch the fine-tune on this host under torchrun; the run's figures as this node's local rank 0 saw them.

    Bad configs raise InputError here, before anything starts. Timeouts default to the config's
    distributed.timeout_s and distributed.rdzv_timeout_s.
    """
    import torch

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
    res = torchrun("gpufleet.finetune.worker", args, nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
                   master_addr=master_addr, master_port=master_port, timeout_s=timeout_s,
                   rdzv_timeout_s=rdzv_timeout_s, env_extra=env, prefix="gpufleet-finetune-")
    log = res["log_tail"]
    if res["workdir"] and Path(res["workdir"], "torchrun.log").is_file():
        log = Path(res["workdir"], "torchrun.log").read_text(errors="replace")
    failure = failures.describe(log, rc=res["rc"], timed_out=res["timed_out"], timeout_s=timeout_s,
                                rdzv_timeout_s=rdzv_timeout_s, master=f"{master_addr}:{master_port}", node_rank=node_rank)
    return {
        "benchmark": "finetune",
        "config_path": str(config_path),
        "device": "cuda" if n_gpus else "cpu",
        "method": {"finetune_version": FINETUNE_VERSION, "loop": "plain PyTorch; DDP, or DeepSpeed when configured",
                   "timer": "perf_counter around each optimizer step, after the loss is read back",
                   "tokens": "real tokens (padding excluded), all ranks, over the slowest rank's time",
                   "mfu": "4N + 6N_lora + 12LHQT per token (gpufleet.finetune.model)"},
        "launch": {"nproc_per_node": nproc, "nnodes": nnodes, "node_rank": node_rank, "master_addr": master_addr,
                   "master_port": master_port, "timeout_s": timeout_s, "rdzv_timeout_s": rdzv_timeout_s},
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
