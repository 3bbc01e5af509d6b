# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Bodies of the check modules (gpu_inventory, gpu_health, host_hygiene: one engine check group, its host document)
and of gpu_counters (the error counters before or after the benchmarks).
"""

from __future__ import annotations

import json
import socket

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import (
    RESULT_RCS,
    TAIL_CHARS,
    EngineError,
    add_node_env,
    node_args,
    node_env_argument_spec,
    run_json,
)


def check_argument_spec():
    """Arguments shared by gpu_inventory, gpu_health and host_hygiene."""
    return dict(
        python=dict(type="path", required=True),
        profile=dict(type="str"),
        thresholds=dict(type="dict"),
        timeout_s=dict(type="int", default=120),
        host_name=dict(type="str"),
        **node_env_argument_spec(),
    )


COUNTER_PHASES = ("before", "after")


def counters_argument_spec():
    return dict(check_argument_spec(), phase=dict(type="str", required=True, choices=list(COUNTER_PHASES)))


def check_command(group, host_name=None, profile=None, thresholds=None):
    return ["check", "--group", group, "--json"] + node_args(host_name, profile, thresholds)


def _engine_document(module, args, what):
    """The host document an engine command printed; the module fails when the engine could not answer.

    A failed check is data (status fail in the document), never a module failure.
    """
    p = module.params
    host = p["host_name"] or socket.gethostname()
    add_node_env(p)
    try:
        dummy, doc = run_json(p["python"], args, p["timeout_s"], host, ok_rcs=RESULT_RCS)
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    if not isinstance(doc.get("results"), list):
        module.fail_json(
            msg="gpufleet %s on %s printed a document without a results list" % (what, host),
            stdout=json.dumps(doc)[:TAIL_CHARS],
        )
    return doc


def run_counters_module(module):
    """Body of gpu_counters: the counters snapshot of its phase, as a host document."""
    p = module.params
    args = ["counters", "--phase", p["phase"], "--json"] + node_args(p["host_name"], p["profile"], p["thresholds"])
    module.exit_json(changed=False, gpufleet=_engine_document(module, args, "counters"))


def run_check_module(module, group):
    """Body of a check module: run one check group, return its host document."""
    p = module.params
    doc = _engine_document(module, check_command(group, p["host_name"], p["profile"], p["thresholds"]), "check")
    # Also as a fact, so later plays (and `ansible -m setup`-style ad hoc use) can read the node's verdicts.
    module.exit_json(changed=False, gpufleet=doc, ansible_facts={"gpufleet_%s" % group: doc})
