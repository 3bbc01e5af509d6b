# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Body of the benchmark module: one engine run, `gpufleet bench NAMES --each-timeout-s T`, in which the engine runs
each benchmark in a process of its own (gpufleet/node/supervised.py); one host document for all."""

from __future__ import annotations

import json
import time

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    add_node_env,
    node_args,
    node_env_argument_spec,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_results import (
    run_engine_results,
    start_engine_run,
    torchrun_input_problem,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import BENCHMARK_GROUP, host_document

REMEDY_TIMEOUT = (
    "the benchmarks hung or need longer than timeout_s: read the stderr tail and the node's gpu_health "
    "results, then re-run, with a longer timeout_s if the depth needs it"
)
# Beyond the benchmarks' own timeouts, for the engine to start and to stop what it started.
MARGIN_S = 60


def benchmark_argument_spec():
    return dict(
        python=dict(type="path", required=True),
        benchmarks=dict(type="list", elements="str", required=True),
        depth=dict(type="str"),
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
    """What is wrong with the benchmark module's arguments, or None (the benchmarks' names are the engine's to refuse)."""
    if not p["benchmarks"]:
        return "benchmarks is empty; expected one or more benchmarks (gpufleet bench --help lists them)"
    problem = torchrun_input_problem(p)
    if problem:
        return problem
    if p["master_port"] is not None and not 0 < p["master_port"] < 65536:
        return "master_port = %s; expected a TCP port, 1 to 65535" % p["master_port"]
    return None


def bench_command(p):
    """`gpufleet bench NAMES --each-timeout-s T ...`: the engine runs each benchmark with its own timeout."""
    args = ["bench"] + list(p["benchmarks"]) + ["--json", "--each-timeout-s", str(p["timeout_s"])]
    args += ["--depth", p["depth"]] if p["depth"] else []  # else the engine's default
    args += node_args(p["host_name"], p["profile"], p["thresholds"])
    args += ["--nnodes", str(p["nnodes"]), "--node-rank", str(p["node_rank"]), "--master-addr", p["master_addr"]]
    if p["master_port"]:  # inside one node the engine takes a free port
        args += ["--master-port", str(p["master_port"])]
    if p["soak_duration_s"]:
        args += ["--duration-s", str(p["soak_duration_s"])]
    if p["references"] and p["nnodes"] == 1:  # across nodes no node measures again alone
        args += ["--references", json.dumps(p["references"], sort_keys=True)]
    if p["nnodes"] > 1 and p["train_reference"]:
        args += ["--train-reference", json.dumps(train_reference(p["train_reference"]), sort_keys=True)]
    return args


def train_reference(res):
    """What the engine needs of the node's single-node benchmark.train_gpt2 result: its figure and why not."""
    ref = dict((k, res.get(k)) for k in ("check", "group", "status", "value", "unit", "reason"))
    detail = res.get("detail")
    ref["world_size"] = detail.get("world_size") if isinstance(detail, dict) else None
    return ref


def run_benchmark_module(module):
    """Body of the benchmark module: one engine run for all the benchmarks, one host document.

    The engine runs each benchmark in a process of its own with its own timeout_s, so a benchmark that hangs or
    crashes becomes an `error` result and the others keep what they measured. The module fails only when the
    engine cannot run at all (no interpreter, no engine, input it refuses); an engine run that itself could not
    finish is an `error` result for each benchmark.
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
    budget_s = p["timeout_s"] * len(p["benchmarks"]) + (p["soak_duration_s"] or 0) + MARGIN_S
    what = "gpufleet bench %s" % " ".join(p["benchmarks"])
    doc, results = run_engine_results(
        module, dict(p, timeout_s=budget_s), bench_command(p), host, p["benchmarks"][0], BENCHMARK_GROUP, what,
        dict(benchmark=p["benchmarks"][0]), REMEDY_TIMEOUT,
    )  # fmt: skip
    if doc is None:  # the run's error stands for each of its benchmarks
        results += [
            dict(results[0], check=name, detail=dict(results[0]["detail"], benchmark=name))
            for name in p["benchmarks"][1:]
        ]
    doc = host_document(host, started, round(time.monotonic() - t0, 4), results, doc)
    module.exit_json(changed=False, gpufleet=doc)
