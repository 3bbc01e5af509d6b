"""The fine-tune's output (gpufleet.finetune.worker.run()) as results of the one schema.

`finetune` passes when the run ended, the training loss went down and the held-out eval ran; its value
is real tokens/s per GPU, with MFU, losses, memory and step time in detail. A run that failed is `fail`
with the cause (which rank, which node, the rendezvous) and the log tail. On a CPU the run is a logic
check: `skip` with the CPU note, never a performance figure.
"""

from __future__ import annotations

import math

from gpufleet.base import numbers, profiles
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.base.schema import FAIL, PASS, SKIP, WARN, result, utc_now

GROUP = "finetune"
# Read when a profile declares it (files/profiles/generic.yml); until then the figure is reported, not judged.
MIN_KEY = "finetune_tokens_per_s_per_gpu_min"

_REMEDY = {
    "rendezvous": "start the fine-tune on every node at once, with the same --nnodes, --master-addr and --master-port; "
    "check that every node reaches the master's port (firewall, address) and that no node was left out",
    "run": "a hang: look for a node that died or a collective that stalled in the log tail; raise distributed.timeout_s "
    "only if the steps simply need longer",
    "workers": "read the failing rank's error in detail.failure; an out-of-memory needs a smaller batch or "
    "max_seq_length, a NCCL error points at the fabric (run benchmark nccl across the nodes)",
    "peer": "another node of the run died or lost its network: its own finetune result names the cause; fix that node "
    "(or the network between the nodes) and run the fine-tune again",
    "killed": "torchrun was killed from outside on this node: look at its kernel log (the OOM killer), its uptime (a "
    "reboot) or who stopped it, then run the fine-tune again",
    "launch": "read the log tail: torchrun itself could not start the workers",
}


def _loss_went_down(losses: list[float]) -> tuple[bool, float, float]:
    """Mean of the first quarter of the steps against the last quarter (one step each at least): noise-tolerant."""
    q = max(1, len(losses) // 4)
    first, last = sum(losses[:q]) / q, sum(losses[-q:]) / q
    return last < first, first, last


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def mfu(out: dict, peak_tflops: float | None) -> float | None:
    return numbers.mfu(out.get("tokens_per_s_per_gpu"), (out.get("flops") or {}).get("flops_per_token"), peak_tflops)


def to_results(out: dict, profile: dict) -> list[dict]:
    started = utc_now()
    cpu = out.get("device") == "cpu"
    keep = (
        "config_path",
        "method",
        "launch",
        "rc",
        "seconds",
        "command",
        "world_size",
        "nnodes",
        "node_rank",
        "host",
        "device_name",
        "backend",
        "model",
        "lora",
        "params_trainable",
        "params_total",
        "trainable_pct",
        "steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_seq_length",
        "packing",
        "loss_first",
        "loss_last",
        "losses",
        "evals",
        "eval_loss_first",
        "eval_loss",
        "eval_samples",
        "tokens_per_s_total",
        "step_s_median",
        "tokens_per_row",
        "flops",
        "peak_gpu_memory_gib",
        "peak_host_rss_gib",
        "setup_s",
        "train_s",
        "adapter_dir",
        "output_dir",
        "tensorboard",
        "deepspeed_config",
    )
    detail = {k: out.get(k) for k in keep if k in out}
    return [_judge(out, profile, detail, cpu).replace(group=GROUP, started=started, seconds=out.get("seconds"))]


def _judge(out: dict, profile: dict, detail: dict, cpu: bool) -> dict:
    failure = out.get("failure")
    if failure or out.get("rc") != 0 or "losses" not in out:
        failure = failure or {"phase": "launch", "cause": f"no results came back (torchrun exited {out.get('rc')})"}
        return result(
            "finetune",
            FAIL,
            f"LoRA fine-tune failed: {failure['cause']}",
            detail={**detail, "failure": failure, "log_tail": out.get("log_tail"), "workdir": out.get("workdir")},
            remedy=_REMEDY.get(failure.get("phase"), _REMEDY["launch"]),
        )
    down, first, last = _loss_went_down(out["losses"])
    peak = profiles.value(profile, "bf16_dense_peak_tflops")
    detail.update(mfu=mfu(out, peak), mfu_peak_tflops=peak, loss_first_quarter_mean=first, loss_last_quarter_mean=last)
    tps = out.get("tokens_per_s_per_gpu")
    value = round(tps) if _finite(tps) else None
    what = (
        f"LoRA fine-tune of {out['model']['name']} on {out['world_size']} {'CPU rank' if cpu else 'GPU'}(s), "
        f"{out['steps']} steps"
    )
    if not all(_finite(x) for x in out["losses"]):
        return result(
            "finetune",
            FAIL,
            f"{what}: the training loss is not finite ({out['losses'][-1]})",
            detail=detail,
            remedy="a NaN or inf loss: lower training.learning_rate, check bf16 and the data; on one node only, suspect its GPUs",
        )
    if not down:
        return result(
            "finetune",
            FAIL,
            f"{what}: the training loss did not go down (first quarter {first:.4f}, last quarter {last:.4f})",
            value=value,
            unit="tokens/s/GPU",
            detail=detail,
            remedy="check training.learning_rate, the warm-up and the data; a loss that stays flat means nothing was learnt",
        )
    if not _finite(out.get("eval_loss")):
        return result(
            "finetune",
            FAIL,
            f"{what}: the held-out eval did not produce a loss",
            value=value,
            unit="tokens/s/GPU",
            detail=detail,
            remedy="check data.eval_samples and that the held-out records have assistant turns",
        )
    limit = profiles.value(profile, MIN_KEY) if MIN_KEY in profile["thresholds"] else None
    threshold = profiles.threshold(profile, MIN_KEY, min=limit) if MIN_KEY in profile["thresholds"] else None
    mfu_text = f", MFU {detail['mfu']:.1%}" if detail["mfu"] is not None and not cpu else ""
    summary = (
        f"{what}: loss {out['loss_first']:.4f} -> {out['loss_last']:.4f}, eval loss {out['eval_loss_first']:.4f} -> "
        f"{out['eval_loss']:.4f}; {value} tokens/s/GPU{mfu_text}"
    )
    if cpu:
        return result(
            "finetune",
            SKIP,
            f"{summary}; {CPU_NOTE}",
            value=value,
            unit="tokens/s/GPU",
            threshold=threshold,
            detail=detail,
        )
    if limit is not None and value is not None and value < limit:
        return result(
            "finetune",
            FAIL,
            f"{summary}: under the minimum {limit} tokens/s/GPU",
            value=value,
            unit="tokens/s/GPU",
            threshold=threshold,
            detail=detail,
            remedy="compare benchmark.matmul_bf16 and benchmark_multinode.nccl_all_reduce: the slower one is the layer to fix first",
        )
    if _finite(out.get("eval_loss_first")) and out["eval_loss"] > out["eval_loss_first"]:
        return result(
            "finetune",
            WARN,
            f"{summary}: the eval loss rose",
            value=value,
            unit="tokens/s/GPU",
            threshold=threshold,
            detail=detail,
            remedy="the adapter got worse on held-out data: lower training.learning_rate or train on more data",
        )
    return result("finetune", PASS, summary, value=value, unit="tokens/s/GPU", threshold=threshold, detail=detail)
