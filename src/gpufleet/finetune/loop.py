"""The fine-tune's training loop on one rank: optimizer steps with gradient accumulation, the held-out
evaluation, TensorBoard's scalars, and the LoRA adapter saved at the end."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpufleet.finetune import data
from gpufleet.finetune.rank import Rank, dist_sum


@dataclass
class Steps:
    """What the loop measured, one entry per optimizer step; evals: {"step", "loss"}."""

    losses: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    lrs: list = field(default_factory=list)
    evals: list = field(default_factory=list)


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
    loss_sum, tokens = dist_sum([loss_sum, tokens], r.world, r.device)
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
    (loss_sum,) = dist_sum([loss_val], r.world, r.device)
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
