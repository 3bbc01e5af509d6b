"""Training throughput gate: a GPT-2-small-shaped model on synthetic tokens.
Batch 64 per GPU (65,536 tokens a step, 29 GiB): the fastest of 16, 32 and 64 on H200
(docs/results/2026-11-21-h200-x2-train-gate).

12 layers, 12 heads, 768 hidden, sequence 1024, vocabulary 50304 (50257 padded to a multiple of 64
so the output projection tiles evenly), bf16 autocast, fused AdamW, causal flash attention through
scaled_dot_product_attention, torch.compile on CUDA. One process per GPU under torchrun; DDP when
more than one. Tokens are random: this measures the GPUs and the gradient all-reduce, not a data
pipeline.
Across nodes (nnodes > 1) every node runs the same torchrun with its own node rank; DDP spans all of
their GPUs, and each node's local rank 0 reports the whole run.

MFU (model FLOPs utilisation), as in the PaLM paper, appendix B:
    flops_per_token = 6 * N + 12 * L * H * Q * T
        N: parameters without the position embedding (6 = 2 forward + 4 backward per weight per token)
        L layers, H heads, Q head size, T sequence: the attention score and value products
    MFU = flops_per_token * tokens_per_s_per_gpu / peak dense bf16 FLOP/s of one GPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from dataclasses import asdict, dataclass

from gpufleet.bench.launch import torchrun

TRAIN_VERSION = 1


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50304


# Tiny shape for CPU runs: logic only, never a performance claim.
SHAPES = {"gpt2-small": GPTConfig(), "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=512)}


def build_model(cfg: GPTConfig):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
            self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
            self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
            self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
            self.mlp_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

        def forward(self, x):  # x: (B, T, C)
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
            # (B, T, C) -> (B, heads, T, head size)
            q, k, v = (z.view(b, t, cfg.n_head, c // cfg.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, idx, targets):  # idx, targets: (B, T) token ids
            pos = torch.arange(idx.size(1), device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    return GPT()


def flops_per_token(model, cfg: GPTConfig) -> float:
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * cfg.block_size


def worker(shape: str, batch: int, steps: int, warmup: int, compile_model: bool, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": device} if cuda else {}))
    cfg = SHAPES[shape]
    torch.manual_seed(1234)  # the same initial weights on every rank
    model = build_model(cfg).to(device)
    fpt = flops_per_token(model, cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    if compile_model:
        model = torch.compile(model)
    if world > 1:
        # gradient_as_bucket_view: gradients live in the all-reduce buckets, one copy fewer per step.
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if cuda else None, gradient_as_bucket_view=True
        )
    gen = torch.Generator(device=device).manual_seed(rank)
    data = torch.randint(0, cfg.vocab_size, (4, batch, cfg.block_size + 1), device=device, generator=gen)
    losses, step_s = [], []

    def step(i):
        chunk = data[i % data.size(0)]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup):  # compilation and allocator warm-up stay out of the numbers
        losses.append(float(step(i)))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    if world > 1:
        dist.barrier()
    t_all = time.perf_counter()
    for i in range(steps):
        t0 = time.perf_counter()
        loss = step(i)
        if cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        losses.append(float(loss))
    total_s = time.perf_counter() - t_all
    tokens_per_step_per_gpu = batch * cfg.block_size
    tokens_per_s_per_gpu = tokens_per_step_per_gpu * steps / total_s
    doc = {
        "rank": rank,
        "world_size": world,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "step_s_median": sorted(step_s)[len(step_s) // 2],
        "flops_per_token": fpt,
        "achieved_tflops_per_gpu": fpt * tokens_per_s_per_gpu / 1e12,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "params": n_params,
    }
    if world > 1:
        docs = [None] * world
        dist.all_gather_object(docs, doc)
        # DDP holds the process group: let it go first, so that gloo's threads end here and not while the
        # interpreter shuts down, where ending them can abort the process ("terminate called without an active
        # exception", SIGABRT, seen once in a two-rank CPU run).
        model = opt = loss = None
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    else:
        docs = [doc]
    if local_rank == 0:  # every node reports the run; the slowest rank sets everyone's pace
        per_rank = [d["tokens_per_s_per_gpu"] for d in docs]
        with open(out_path, "w") as f:
            json.dump(
                {
                    "world_size": world,
                    "device": "cuda" if cuda else "cpu",
                    "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
                    # The slowest rank sets the pace of a synchronous step.
                    "tokens_per_s_per_gpu": min(per_rank),
                    "tokens_per_s_total": min(per_rank) * world,
                    "ranks": docs,
                    "config": asdict(cfg),
                    "batch_per_gpu": batch,
                    "steps": steps,
                    "warmup_steps": warmup,
                    "compiled": compile_model,
                },
                f,
            )


def run(
    shape: str = "gpt2-small",
    *,
    batch: int = 64,
    steps: int = 20,
    warmup: int = 10,
    nproc_per_node: int | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29512,
    timeout_s: float = 900,
    rdzv_timeout_s: int = 120,
    compile_model: bool | None = None,
) -> dict:
    import torch

    n_gpus = torch.cuda.device_count()
    if n_gpus == 0:
        shape, batch, steps, warmup = "tiny", 2, 3, 1
    compile_model = bool(n_gpus) if compile_model is None else compile_model
    nproc = nproc_per_node or n_gpus or 1
    args = ["--worker", "--shape", shape, "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup)]
    if compile_model:
        args.append("--compile")
    res = torchrun(
        "gpufleet.train.gpt2",
        args,
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        timeout_s=timeout_s,
        rdzv_timeout_s=rdzv_timeout_s,
        prefix="gpufleet-gpt2-",
    )
    return {
        "benchmark": "train_gpt2",
        "device": "cuda" if n_gpus else "cpu",
        "nnodes": nnodes,
        "node_rank": node_rank,
        "method": {
            "train_version": TRAIN_VERSION,
            "shape": shape,
            "batch_per_gpu": batch,
            "steps": steps,
            "warmup_steps": warmup,
            "compiled": compile_model,
            "precision": "bf16 autocast",
            "timer": "perf_counter around synchronized steps",
            "mfu": "PaLM appendix B, 6N + 12LHQT",
        },
        **{k: res[k] for k in ("command", "rc", "timed_out", "seconds", "log_tail")},
        **res["out"],
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="gpufleet.train.gpt2")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--shape", default="gpt2-small", choices=list(SHAPES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    worker(a.shape, a.batch, a.steps, a.warmup, a.compile, a.out)


if __name__ == "__main__":
    main()
