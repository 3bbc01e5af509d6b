# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""What the modules copy from the engine's result schema (gpufleet/base/schema.py): the engine may not be importable where
they run (a module runs under the node's Ansible Python, the engine under gpufleet_python). Nothing of the
registry: what a node runs is the engine's decision (gpufleet node-stage), and the action plugins, on the controller,
read gpufleet/base/registry.py itself. tests/test_module_constants.py holds each copy here to the engine's.
"""

from __future__ import annotations

import time


# The group of the benchmarks' results (gpufleet.base.registry.BENCHMARK_GROUP).
BENCHMARK_GROUP = "benchmark"
SCHEMA_VERSION = 1  # gpufleet.base.schema.SCHEMA_VERSION: the host documents this module builds itself


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
    """gpufleet.base.schema.result for what a module says itself (skipped, passed, or could not run: the judging of
    figures is the engine's); an `error` is software unless `failure_class` says what the cause is."""
    if status not in ("pass", "skip", "error"):
        raise ValueError("a module's own result is pass, skip or error, not %r" % (status,))
    if not reason:
        raise ValueError("check %r: every result needs a plain reason" % (check,))
    derived = None
    if status == "error":
        derived = failure_class or "software"
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
    """A host document with the engine's keys; `first` (an engine document) gives engine version, profile, versions,
    the platform and the machine."""
    first = first or {}
    return dict(
        schema_version=first.get("schema_version", SCHEMA_VERSION),
        host=host,
        engine_version=first.get("engine_version"),
        profile=first.get("profile"),
        versions=first.get("versions") or {},
        platform=first.get("platform") or {},
        machine=first.get("machine") or {},
        started=started,
        seconds=seconds,
        results=results,
    )
