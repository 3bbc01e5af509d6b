# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""What the modules and action plugins copy from the engine's declarations (gpufleet/registry.py) and its result
schema (gpufleet/schema.py): the engine may not be importable where they run. tests/test_module_constants.py holds
every copy here, and every literal copy in the modules' DOCUMENTATION and the role's YAML, to the engine's.
"""

from __future__ import annotations

import time


# The check groups (`gpufleet check --group G`), each run by the gpufleet.cluster module of its name.
CHECK_GROUPS = ("gpu_inventory", "gpu_health", "host_hygiene")
# The group of the `error` result a node step's module gives when it could not answer.
STEP_GROUPS = dict(
    [(g, g) for g in CHECK_GROUPS] + [("gpu_counters", "counters"), ("benchmark", "benchmark"), ("node_lock", "lock")]
)
# Benchmarks `gpufleet bench` knows, their tiers, and the group of their results.
BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "host", "train_gpt2", "soak")
BENCHMARK_TIERS = ("smoke", "quick", "thorough")
BENCHMARK_GROUP = "benchmark"
# gpufleet_benchmarks: what it may name, what it names by default; the benchmarks that run across nodes.
SELECTABLE_BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "host", "train_gpt2")
DEFAULT_BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "host")
MULTINODE_BENCHMARKS = ("nccl", "train_gpt2")
# gpufleet_tier, and the benchmarks each tier's node stage runs (acceptance: those of gpufleet_benchmarks).
RUN_TIERS = ("smoke", "acceptance", "soak")
TIER_BENCHMARKS = {"smoke": ("matmul", "memory", "nccl"), "soak": ("sdc", "soak")}
SCHEMA_VERSION = 1  # gpufleet.schema.SCHEMA_VERSION: the host documents this module builds itself

STATUSES = ("pass", "warn", "fail", "skip", "error", "info")
# The checks whose `error` is of class environment (what stopped them is beside the node); any other is software.
ENVIRONMENT_CHECKS = (
    "processes",
    "matmul_processes",
    "memory_processes",
    "nccl_processes",
    "train_gpt2_processes",
    "soak_processes",
    "host_processes",
    "memory_available",
    "processes_after",
    "node_lock",
    "reachable",
    "finetune_processes",
    "sample_spread",
    "sweep_job",
)


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def result(
    check,
    status,
    reason,
    group=None,
    value=None,
    unit=None,
    threshold=None,
    remedy=None,
    detail=None,
    failure_class=None,
    started=None,
    seconds=None,
):
    """gpufleet.schema.result for what a module says itself (skipped, passed, or could not run: the judging of
    figures is the engine's); the class derived as the engine derives it, `failure_class` where the cause is known."""
    if status not in ("pass", "skip", "error"):
        raise ValueError("a module's own result is pass, skip or error, not %r" % (status,))
    if not reason:
        raise ValueError("check %r: every result needs a plain reason" % (check,))
    derived = None
    if status == "error":
        derived = failure_class or ("environment" if check in ENVIRONMENT_CHECKS else "software")
    res = dict(
        check=check,
        group=group,
        status=status,
        value=value,
        unit=unit,
        threshold=threshold,
        reason=reason,
        remedy=remedy,
        detail=detail or {},
        **{"class": derived},
    )
    if started is not None or seconds is not None:
        res.update(started=started, seconds=seconds)
    return res


def failure_class_of(exc):
    """environment when the node's disk is full (the engine could not write its work files), else software."""
    return "environment" if "No space left on device" in "%s %s" % (exc.msg, exc.stderr or "") else "software"


def host_document(host, started, seconds, results, first=None):
    """A host document; `first` (an engine document) gives engine version, profile and versions."""
    first = first or {}
    return dict(
        schema_version=first.get("schema_version", SCHEMA_VERSION),
        host=host,
        engine_version=first.get("engine_version"),
        profile=first.get("profile"),
        versions=first.get("versions") or {},
        started=started,
        seconds=seconds,
        results=results,
    )
