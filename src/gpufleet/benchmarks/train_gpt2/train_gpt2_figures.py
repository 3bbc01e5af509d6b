"""The training gate's figure for the fleet: tokens/s/GPU inside the node and across nodes, compared only with one
of the same batch and world size."""

from __future__ import annotations

from gpufleet.base.registry import BENCHMARK_GROUP, registers


@registers("train_gpt2", "figures")
def figures(res: dict, fig) -> None:
    detail = res.get("detail") or {}
    if res["check"] != "train_gpt2" or not fig.finite(res.get("value")) or res.get("status") == "error":
        return
    scope = "node" if res["group"] == BENCHMARK_GROUP else "multinode"
    context = f"batch={detail.get('batch_per_gpu')},world={detail.get('world_size')}"
    fig.node_figure(f"train_gpt2_{scope}_tokens_per_s_per_gpu", res, context)
