# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""What the modules copy from the engine (which may not be importable where they run): its result schema, its
benchmarks and its host document. tests/test_module_constants.py holds each copy against the engine.
"""

from __future__ import annotations

import time


# Benchmarks `gpufleet bench` knows, and the group of their results (gpufleet.checks.benchmarks.GROUP).
BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "train_gpt2", "soak")
BENCHMARK_TIERS = ("smoke", "quick", "thorough")
BENCHMARK_GROUP = "benchmark"
SCHEMA_VERSION = 1  # gpufleet.schema.SCHEMA_VERSION: the host documents this module builds itself


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def result(check, status, reason, group, started, seconds, remedy=None, detail=None, failure_class=None):
    """A result with the keys of gpufleet.schema.result (the engine may not be importable here); the class of a
    result that is not pass or skip: software, the engine's own failure, unless the cause is known."""
    if status not in ("pass", "skip"):
        failure_class = failure_class or "software"
    return dict(check=check, group=group, status=status, value=None, unit=None, threshold=None, reason=reason,
                remedy=remedy, detail=detail or {}, started=started, seconds=seconds, **{"class": failure_class})


def failure_class_of(exc):
    """environment when the node's disk is full (the engine could not write its work files), else software."""
    return "environment" if "No space left on device" in "%s %s" % (exc.msg, exc.stderr or "") else "software"


def host_document(host, started, seconds, results, first=None):
    """A host document; `first` (an engine document) gives engine version, profile and versions."""
    first = first or {}
    return dict(schema_version=first.get("schema_version", SCHEMA_VERSION), host=host,
                engine_version=first.get("engine_version"), profile=first.get("profile"),
                versions=first.get("versions") or {}, started=started, seconds=seconds, results=results)
