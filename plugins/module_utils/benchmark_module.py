# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Body of the benchmark module: one engine run per benchmark, one host document for all."""

from __future__ import annotations

import json
import socket
import time

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    add_node_env,
    node_args,
    node_env_argument_spec,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_results import (
    run_engine_results,
    start_engine_run,
    torchrun_engine_timeout_s,
    torchrun_input_problem,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import (
    BENCHMARK_GROUP,
    BENCHMARK_TIERS,
    BENCHMARKS,
    MULTINODE_BENCHMARKS,
    host_document,
)


REMEDY_TIMEOUT = (
    "the benchmark hung or needs longer than timeout_s: read the stderr tail and the node's gpu_health "
    "results, then re-run, with a longer timeout_s if the tier needs it"
)


def benchmark_argument_spec():
    return dict(
        python=dict(type="path", required=True),
        benchmarks=dict(type="list", elements="str", required=True, choices=list(BENCHMARKS)),
        tier=dict(type="str", default="quick", choices=list(BENCHMARK_TIERS)),
        thresholds=dict(type="dict"),
        profile=dict(type="str"),
        timeout_s=dict(type="int", default=900),
        host_name=dict(type="str"),
        nnodes=dict(type="int", default=1),
        node_rank=dict(type="int", default=0),
        master_addr=dict(type="str", default="127.0.0.1"),
        master_port=dict(type="int"),
        train_reference=dict(type="dict"),
        references=dict(type="dict"),
        soak_duration_s=dict(type="int"),
        **node_env_argument_spec(),
    )


def benchmark_input_problem(p):
    """What is wrong with the benchmark module's arguments, or None."""
    if not p["benchmarks"]:
        return "benchmarks is empty; expected one or more of %s" % ", ".join(BENCHMARKS)
    problem = torchrun_input_problem(p)
    if problem:
        return problem
    if p["nnodes"] > 1 and [b for b in p["benchmarks"] if b not in MULTINODE_BENCHMARKS]:
        return "nnodes = %s runs across hosts, which only %s do; got benchmarks %s" % (
            p["nnodes"],
            " and ".join(MULTINODE_BENCHMARKS),
            p["benchmarks"],
        )
    if p["master_port"] is not None and not 0 < p["master_port"] < 65536:
        return "master_port = %s; expected a TCP port, 1 to 65535" % p["master_port"]
    return None


def free_port(addr="127.0.0.1"):
    """A TCP port nobody listens on now: single-node NCCL runs on one machine must not share one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def engine_runs(names):
    """The benchmarks of each engine run: one each, but sdc in matmul's run when both are asked for (the engine then
    computes it in the matmul workers, sparing a second start of torch and CUDA on every GPU)."""
    if "matmul" in names and "sdc" in names:
        return [["matmul", "sdc"] if name == "matmul" else [name] for name in names if name != "sdc"]
    return [[name] for name in names]


def bench_command(names, p, master_port=None):
    name = names[0]
    args = (
        ["bench"]
        + list(names)
        + ["--tier", p["tier"], "--json"]
        + node_args(p["host_name"], p["profile"], p["thresholds"])
    )
    if name in ("nccl", "train_gpt2"):  # both run under torchrun
        args += [
            "--nnodes",
            str(p["nnodes"]),
            "--node-rank",
            str(p["node_rank"]),
            "--master-addr",
            p["master_addr"],
            "--master-port",
            str(master_port),
            "--timeout-s",
            str(torchrun_engine_timeout_s(p["timeout_s"])),
        ]
    if name == "soak" and p["soak_duration_s"]:
        args += ["--duration-s", str(p["soak_duration_s"])]
    if p["references"] and p["nnodes"] == 1:  # across nodes no node measures again alone
        args += ["--references", json.dumps(p["references"], sort_keys=True)]
    if name == "train_gpt2" and p["nnodes"] > 1 and p["train_reference"]:
        args += ["--train-reference", json.dumps(train_reference(p["train_reference"]), sort_keys=True)]
    return args


def train_reference(res):
    """What the engine needs of the node's single-node benchmark.train_gpt2 result: its figure and why not."""
    ref = dict((k, res.get(k)) for k in ("check", "group", "status", "value", "unit", "reason"))
    detail = res.get("detail")
    ref["world_size"] = detail.get("world_size") if isinstance(detail, dict) else None
    return ref


def run_benchmark_module(module):
    """Body of the benchmark module: one engine run per benchmark, one host document for all.

    Each benchmark runs in its own engine process with its own timeout, so a
    benchmark that hangs or crashes becomes an `error` result and the others
    keep what they measured. The module fails only when the engine cannot run
    at all (no interpreter, no engine, input it refuses).
    """
    p = module.params
    add_node_env(p)
    # Nothing on the node changes, but benchmarks load its GPUs for minutes: not in a dry run.
    host, started, t0 = start_engine_run(
        module,
        "benchmark",
        benchmark_input_problem(p),
        p["benchmarks"],
        BENCHMARK_GROUP,
        "benchmarks not run in check mode: they load the GPUs; run without --check to measure",
    )
    docs, results = [], []
    for names in engine_runs(p["benchmarks"]):
        # Inside one node the port only has to be free; across nodes every node dials the master's.
        port = p["master_port"] if p["nnodes"] > 1 or p["master_port"] else free_port()
        what = "gpufleet bench %s" % " ".join(names)
        run_p = dict(p, timeout_s=p["timeout_s"] * len(names))  # each benchmark of the run has its own timeout_s
        doc, name_results = run_engine_results(
            module,
            run_p,
            bench_command(names, p, port),
            host,
            names[0],
            BENCHMARK_GROUP,
            what,
            dict(benchmark=names[0]),
            REMEDY_TIMEOUT,
        )
        if doc is None:  # the run's error stands for each of its benchmarks
            name_results += [
                dict(name_results[0], check=name, detail=dict(name_results[0]["detail"], benchmark=name))
                for name in names[1:]
            ]
        else:
            docs.append(doc)
        results.extend(name_results)
    doc = host_document(host, started, round(time.monotonic() - t0, 4), results, docs[0] if docs else None)
    module.exit_json(changed=False, gpufleet=doc)
