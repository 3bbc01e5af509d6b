# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Body of host_record: the engine's `gpufleet record` on the controller, the document on its standard input.

The action plugin of the same name runs it in the task's own worker (no module process started per node); the
module runs it where a module is asked for.
"""

from __future__ import annotations

import json
import sys

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import run_json


def record_argument_spec():
    return dict(
        run_dir=dict(type="path", required=True),
        host=dict(type="str", required=True),
        document=dict(type="dict", required=True),
        replace_groups=dict(type="list", elements="str", default=[]),
        folder=dict(type="str", default="hosts", choices=["hosts", "peers"]),
        python=dict(type="path"),
        engine_src=dict(type="path"),
        db=dict(type="path"),
        controller=dict(type="dict"),
    )


def run_record(p):
    """Write (and index) p["document"] as the host document of p["host"]; what `gpufleet record` printed.

    EngineError when the engine could not do it.
    """
    args = ["record", p["run_dir"], p["host"], "--folder", p["folder"]]
    for group in p["replace_groups"]:
        args += ["--replace-group", group]
    if p.get("no_store"):
        args += ["--no-store"]  # the report indexes the whole run
    elif p["db"]:
        args += ["--db", p["db"]]
    if p.get("controller"):
        args += ["--controller", json.dumps(p["controller"], sort_keys=True)]
    dummy, record = run_json(
        p["python"] or sys.executable,
        args,
        120,
        "the controller",
        input_text=json.dumps(p["document"], sort_keys=True),
        engine_src=p["engine_src"],
    )
    return record
