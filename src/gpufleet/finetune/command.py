"""`gpufleet finetune` and `python -m gpufleet.finetune`: run the fine-tune on this node, print a host document.

    gpufleet finetune --config files/configs/qwen2-7b-lora.yml [--nnodes 2 --node-rank R
        --master-addr ADDR --master-port PORT] [--max-steps N] [--output-dir DIR] --json

In a multi-node run every node runs the same command with its own --node-rank, at the same time.
"""

from __future__ import annotations

import argparse
import sys
import time

from gpufleet import collect
from gpufleet.base import schema
from gpufleet.bench.monitor import sampled
from gpufleet.node.host_documents import node_profile
from gpufleet.node.measure import foreign_processes, watched
from gpufleet.base.command_line import Parser, add_document_arguments, json_arg, print_doc, results_exit
from gpufleet.base.errors import InputError
from gpufleet.finetune import config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="fine-tune config (files/configs/*.yml)")
    p.add_argument("--nproc-per-node", type=int, help="ranks on this node (default: one per GPU, 1 without)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes in the run")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 is the master)")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node rank 0")
    p.add_argument("--master-port", type=int, default=29513, help="rendezvous port on node rank 0")
    p.add_argument(
        "--timeout-s", type=float, help="kill the run after this many seconds (default: distributed.timeout_s)"
    )
    p.add_argument(
        "--rdzv-timeout-s", type=int, help="how long to wait for every node (default: distributed.rdzv_timeout_s)"
    )
    p.add_argument("--max-steps", type=int, help="override training.max_steps")
    p.add_argument("--output-dir", help="override training.output_dir (adapter, TensorBoard logs)")
    add_document_arguments(p)


def document(args) -> dict:
    # The config, its data and model paths and the thresholds are checked before torch and transformers load:
    # a bad input is named on a machine that has neither, never a traceback of their import.
    config.load(args.config)
    overrides = json_arg(args.thresholds, "--thresholds")
    readings = {"nvml": collect.nvml.read(), "host": collect.host.read()}
    profile = node_profile(readings, args.profile, overrides, args.profile_dir)
    try:  # torch, transformers and peft load only here, once the inputs are known to be good
        from gpufleet.finetune import results, worker
    except ImportError as exc:
        raise InputError(
            f"the fine-tune needs torch in {sys.executable}, which cannot import it ({exc}); install "
            "gpufleet[bench,finetune] in the Python that runs it (gpufleet_python)"
        ) from None
    started, t0 = schema.utc_now(), time.monotonic()

    def run():
        return sampled(
            lambda: worker.run(
                args.config,
                nproc_per_node=args.nproc_per_node,
                nnodes=args.nnodes,
                node_rank=args.node_rank,
                master_addr=args.master_addr,
                master_port=args.master_port,
                timeout_s=args.timeout_s,
                rdzv_timeout_s=args.rdzv_timeout_s,
                max_steps=args.max_steps,
                output_dir=args.output_dir,
            )
        )

    # Watched as the benchmarks are; a disturbed fine-tune is an error naming the process, never measured again.
    log: list = []
    res = watched(
        "finetune", run, results.to_results, profile, log=log, not_again="a fine-tune takes too long to run twice"
    )
    if any(e.get("device") == "cuda" for e in log):  # a CPU run has no GPU to watch
        res.append(
            foreign_processes("finetune", log).replace(group=results.GROUP, started=schema.utc_now(), seconds=0.0)
        )
    return schema.host_document(args.host, profile, readings, started, t0, res)


def add_parsers(sub) -> None:
    """finetune on the engine's subcommands."""
    f = sub.add_parser("finetune", help="LoRA fine-tune under torchrun (multi-node) and print a host document")
    add_arguments(f)
    f.set_defaults(func=command)


def command(args) -> int:
    doc = document(args)
    print_doc(doc, args.json)
    return results_exit(doc["results"], args.exit_zero)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m gpufleet.finetune", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return command(args)
    except InputError as exc:
        print(f"gpufleet finetune: {exc}", file=sys.stderr)
        return 2
