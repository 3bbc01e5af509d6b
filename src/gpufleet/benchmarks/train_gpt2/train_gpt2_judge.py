"""The training gate's judgement (gpufleet.train.gpt2's output, run through torchrun): tokens/s per GPU, its MFU,
and the scaling efficiency inside a node or across nodes."""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE, against_min
from gpufleet.base.numbers import mfu
from gpufleet.base.schema import ERROR, FAIL, PASS, result


@registers("train_gpt2", "judge")
def gate(out: dict, profile: dict) -> list[dict]:
    """The gate's results from its measurement (measure.run_train: the run on every GPU, the one-GPU run, the
    node's own figure it is held against across nodes)."""
    return train_gpt2(out["full"], profile, single=out.get("single"), reference=out.get("reference"))


def train_gpt2(full: dict, profile: dict, *, single: dict | None = None, reference: dict | None = None) -> list[dict]:
    """Tokens/s per GPU of the GPT-2-small gate, its MFU, and the scaling efficiency.

    Inside a node (`full["nnodes"]` 1) the scaling is against `single`, the same training on one GPU. Across
    nodes it is against `reference`: this node's own single-node `benchmark.train_gpt2` result from earlier in
    the run (its value is the per-GPU figure on all of this node's GPUs); when that is absent or has no figure,
    the scaling result is an `error` that names the missing figure.
    """
    cpu = full["device"] == "cpu"
    nnodes = full.get("nnodes") or 1
    keep = (
        "method",
        "world_size",
        "rc",
        "seconds",
        "command",
        "batch_per_gpu",
        "steps",
        "compiled",
        "config",
        "device_name",
    )
    detail = {k: full.get(k) for k in keep} | {"nnodes": nnodes}
    where = f"across {nnodes} nodes " if nnodes > 1 else ""
    if full.get("timed_out") or full.get("rc") != 0 or "tokens_per_s_per_gpu" not in full:
        why = "timed out and was killed" if full.get("timed_out") else f"exited {full.get('rc')}"
        remedy = "read the log tail: an out-of-memory, a NCCL error or a dead peer shows there"
        if nnodes > 1:
            remedy += "; across nodes a node that never came (down, a firewalled rendezvous port) stops every node"
        kept = {"kept_folders": [d for d in [full.get("workdir")] if d]}
        return [
            result(
                "train_gpt2",
                FAIL,
                f"GPT-2 training gate {where}{why}",
                detail={**detail, **kept, "log_tail": full.get("log_tail")},
                remedy=remedy,
            )
        ]
    rank0 = full["ranks"][0]
    peak = profiles.value(profile, "bf16_dense_peak_tflops")
    per_gpu = round(full["tokens_per_s_per_gpu"])
    detail.update(
        tokens_per_s_total=round(full["tokens_per_s_total"]),
        mfu=mfu(full["tokens_per_s_per_gpu"], rank0["flops_per_token"], peak),
        mfu_peak_tflops=peak,
        flops_per_token=rank0["flops_per_token"],
        step_s_median=rank0["step_s_median"],
        loss_first=rank0["loss_first"],
        loss_last=rank0["loss_last"],
        peak_memory_gib=rank0["peak_memory_gib"],
        per_rank_tokens_per_s=[round(r["tokens_per_s_per_gpu"]) for r in full["ranks"]],
    )
    if peak is None:
        detail["mfu_note"] = "no MFU: the profile sets no bf16_dense_peak_tflops"
    over = f" over {nnodes} nodes" if nnodes > 1 else ""
    res = [
        against_min(
            "train_gpt2",
            per_gpu,
            "tokens/s/GPU",
            profile,
            "train_gpt2_tokens_per_s_per_gpu_min",
            f"GPT-2-small training on {full['world_size']} GPU(s){over}",
            "compare matmul_bf16 and nccl_all_reduce: the slower of the two is the layer to fix first",
            detail,
            cpu,
        )
    ]
    if nnodes > 1:
        res.append(_scaling_across_nodes(full, per_gpu, reference, profile, cpu))
    elif full["world_size"] > 1 and single is not None and single.get("rc") == 0 and "tokens_per_s_per_gpu" in single:
        eff = round(full["tokens_per_s_per_gpu"] / single["tokens_per_s_per_gpu"], 3)
        sdetail = {
            "tokens_per_s_per_gpu_one": round(single["tokens_per_s_per_gpu"]),
            "tokens_per_s_per_gpu_all": per_gpu,
            "world_size": full["world_size"],
        }
        res.append(
            _scaling(
                eff,
                f"per-GPU throughput on {full['world_size']} GPUs is {eff:.1%} of one GPU's",
                profile,
                cpu,
                sdetail,
                "the gradient all-reduce does not overlap: check nccl_all_reduce, the transport, and DDP bucket sizes",
            )
        )
    return res


def _scaling(eff: float, what: str, profile: dict, cpu: bool, detail: dict, remedy: str) -> dict:
    limit = profiles.value(profile, "train_scaling_efficiency_min")
    threshold = profiles.threshold(profile, "train_scaling_efficiency_min", min=limit)
    if cpu:
        status, reason = schema.SKIP, f"{what}; {CPU_NOTE}"
    elif eff < limit:
        status, reason = FAIL, f"{what}, under the minimum {limit:.0%}"
    else:
        status, reason = PASS, what
    return result(
        "train_scaling",
        status,
        reason,
        value=eff,
        unit="ratio",
        threshold=threshold,
        detail=detail,
        remedy=remedy if status == FAIL else None,
    )


def _scaling_across_nodes(full: dict, per_gpu: int, reference: dict | None, profile: dict, cpu: bool) -> dict:
    """Per-GPU tokens/s across the nodes over this node's own single-node figure (benchmark.train_gpt2)."""
    nnodes, world = full["nnodes"], full["world_size"]
    ref = reference or {}
    ref_value = ref.get("value")
    detail = {
        "tokens_per_s_per_gpu_one_node": ref_value,
        "tokens_per_s_per_gpu_all": per_gpu,
        "world_size": world,
        "nnodes": nnodes,
        "world_size_one_node": ref.get("world_size"),
        "reference": {k: ref.get(k) for k in ("check", "group", "status", "reason")} if ref else None,
    }
    missing = None
    if not reference:
        missing = "no single-node benchmark.train_gpt2 result of this node was given for this run"
    elif isinstance(ref_value, bool) or not isinstance(ref_value, (int, float)) or ref_value <= 0:
        missing = (
            f"this node's single-node benchmark.train_gpt2 result has no figure "
            f"(status {ref.get('status')}: {ref.get('reason') or 'no reason given'})"
        )
    if missing:
        threshold = profiles.threshold(
            profile, "train_scaling_efficiency_min", min=profiles.value(profile, "train_scaling_efficiency_min")
        )
        return result(
            "train_scaling",
            ERROR,
            f"no scaling efficiency across {nnodes} nodes: the single-node per-GPU figure of this node is missing; {missing}",
            threshold=threshold,
            detail=detail,
            remedy="keep train_gpt2 in gpufleet_benchmarks and fix what benchmark.train_gpt2 of this node says, then re-run",
        )
    eff = round(per_gpu / ref_value, 3)
    on = f" on {ref['world_size']} GPU(s)" if ref.get("world_size") else ""
    what = f"per-GPU throughput on {world} GPUs over {nnodes} nodes is {eff:.1%} of this node's alone{on}"
    return _scaling(
        eff,
        what,
        profile,
        cpu,
        detail,
        "the gradient all-reduce between nodes does not keep up: check benchmark_multinode.nccl_all_reduce and "
        "nccl_transport (InfiniBand with GPUDirect RDMA), then DDP bucket sizes",
    )
