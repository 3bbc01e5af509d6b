"""The training gate's step on the node: GPT-2 small (train/gpt2.py) under torchrun, on one GPU and on all of them,
watched by the sampler."""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.bench.monitor import sampled
from gpufleet.train import gpt2


@registers("train_gpt2", "run")
def run_train(steps) -> dict:
    """In the node stage (steps: measure.NodeSteps, whose torchrun places it). Across nodes every node starts
    together, so no one-GPU run first: the scaling is against this node's single-node figure, which the run measured
    before (steps.earlier["train_gpt2"]). Inside a node, one GPU first, then every GPU of the node: their ratio is the scaling
    efficiency."""

    def both() -> dict:
        single = gpt2.run(nproc_per_node=1) if steps.gpus > 1 and steps.torchrun.get("nnodes", 1) == 1 else None
        full = gpt2.run(**steps.torchrun)
        return {
            "device": full.get("device"),
            "full": full,
            "single": single,
            "reference": steps.earlier.get("train_gpt2"),
        }

    return sampled(both)
