# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The steps every module that launches an engine run shares (benchmark, finetune): input and check mode first,
then one engine run whose failure becomes an `error` result.
"""

from __future__ import annotations

import json
import socket
import time

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    REMEDY_INPUT,
    REMEDY_RERUN,
    RESULT_RCS,
    TAIL_CHARS,
    EngineError,
    run_json,
)
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_schema import (
    failure_class_of,
    host_document,
    result,
    utc_now,
)


def start_engine_run(module, name, problem, checks, group, check_mode_msg):
    """What every module that launches an engine run does first: (host, started, t0).

    Bad input fails the module with `problem` (from the module's own checks of its arguments). In check mode
    nothing runs: each of `checks` is a `skip` result saying why, and the module exits.
    """
    host = module.params["host_name"] or socket.gethostname()
    if problem:
        module.fail_json(msg="gpufleet.cluster.%s on %s: %s" % (name, host, problem), remedy=REMEDY_INPUT)
    started, t0 = utc_now(), time.monotonic()
    if module.check_mode:
        results = [result(check, "skip", check_mode_msg, group=group, started=started, seconds=0.0) for check in checks]
        module.exit_json(
            changed=False, skipped=True, msg=check_mode_msg, gpufleet=host_document(host, started, 0.0, results)
        )
    return host, started, t0


def run_engine_results(module, p, args, host, check, group, what, detail, timeout_remedy):
    """One engine run for `check`: (its document or None, its results).

    The module fails when the engine cannot run at all (no interpreter, no engine, input it refuses). A run
    killed at p["timeout_s"], crashed, or whose document has no results list is one `error` result carrying
    `detail` and what the run left (command, exit code, output tails), so the node still reaches the report.
    """
    when, t0 = utc_now(), time.monotonic()
    try:
        dummy, doc = run_json(p["python"], args, p["timeout_s"], host, ok_rcs=RESULT_RCS)
    except EngineError as exc:
        if exc.kind in ("python", "engine", "input"):
            module.fail_json(**exc.fail_kwargs())
        remedy = timeout_remedy if exc.kind == "timeout" else exc.remedy
        detail = dict(detail, rc=exc.rc, cmd=exc.cmd, stderr=exc.stderr, stdout=exc.stdout, timeout_s=p["timeout_s"])
        return None, [
            result(
                check,
                "error",
                exc.msg,
                group=group,
                remedy=remedy,
                detail=detail,
                failure_class=failure_class_of(exc),
                started=when,
                seconds=round(time.monotonic() - t0, 2),
            )
        ]
    if not isinstance(doc.get("results"), list):
        detail = dict(detail, cmd=[p["python"], "-m", "gpufleet"] + list(args), stdout=json.dumps(doc)[:TAIL_CHARS])
        return None, [
            result(
                check,
                "error",
                "%s on %s printed a document without a results list" % (what, host),
                group=group,
                remedy=REMEDY_RERUN,
                detail=detail,
                started=when,
                seconds=round(time.monotonic() - t0, 2),
            )
        ]
    return doc, doc["results"]


def torchrun_input_problem(p):
    """What is wrong with the arguments every torchrun module takes (timeout_s, nnodes, node_rank), or None."""
    if p["timeout_s"] < 1:
        return "timeout_s = %s; expected a positive number of seconds" % p["timeout_s"]
    if p["nnodes"] < 1:
        return "nnodes = %s; expected 1 or more hosts" % p["nnodes"]
    if not 0 <= p["node_rank"] < p["nnodes"]:
        return "node_rank = %s; expected 0 to nnodes - 1 (%s)" % (p["node_rank"], p["nnodes"] - 1)
    return None


def torchrun_engine_timeout_s(timeout_s):
    """The engine's own limit for torchrun (NCCL, training, the fine-tune), inside timeout_s.

    The engine kills torchrun first and still reports the log tail; the
    margin covers its start-up and the kill, before this module's own kill.
    """
    return max(1, timeout_s - torchrun_margin_s(timeout_s))


def torchrun_margin_s(timeout_s):
    """How long before timeout_s the engine stops torchrun: 10 to 60 seconds, a quarter of timeout_s between."""
    return min(60, max(10, timeout_s // 4))
