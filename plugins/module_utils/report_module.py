# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Body of fleet_report: the engine's `gpufleet report` over a run folder, on the controller."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError, run_json


def report_argument_spec():
    return dict(
        run_dir=dict(type="path", required=True),
        expect_hosts=dict(type="list", elements="str", default=[]),
        python=dict(type="path"),
        engine_src=dict(type="path"),
        timeout_s=dict(type="int", default=300),
        db=dict(type="path"),
        baseline=dict(type="str"),
        set_baseline=dict(type="bool", default=False),
        slurm_names=dict(type="dict", default={}),
        prometheus_textfile_dir=dict(type="path"),
        fleet_hosts=dict(type="list", elements="str"),
        certify_key=dict(type="path", no_log=False),
        certify_command=dict(type="str"),
        certify_pubkey=dict(type="path"),
    )


def failed_hosts(summary):
    """Hosts whose verdict is fail, from the report summary's `nodes` mapping."""
    nodes = summary.get("nodes") or {}
    return sorted(host for host, node in nodes.items() if isinstance(node, dict) and node.get("verdict") == "fail")


def _textfile_args(p):
    """node_exporter's folder and the inventory's nodes, which the report and certify write their series for."""
    args = []
    if p["prometheus_textfile_dir"]:
        args += ["--textfile-dir", p["prometheus_textfile_dir"]]
        for host in p["fleet_hosts"] or []:
            args += ["--fleet-host", host]
    return args


def _certify(module, python, summary):
    """`gpufleet certify RUN_DIR` after the report: what it certified, and each node not certified with why."""
    p = module.params
    args = ["certify", p["run_dir"], "--json"]
    args += ["--key", p["certify_key"]] if p["certify_key"] else ["--sign-command", p["certify_command"]]
    if p["certify_pubkey"]:
        args += ["--pubkey", p["certify_pubkey"]]
    args += _textfile_args(p)
    try:
        dummy, record = run_json(
            python, args, p["timeout_s"], "the controller", ok_rcs=(0, 1), engine_src=p["engine_src"]
        )
    except EngineError as exc:
        module.fail_json(summary=summary, **exc.fail_kwargs())
    return record


def run_report_module(module, python):
    """Body of fleet_report: aggregate RUN_DIR/hosts/*.json; a failed node is data, not a module failure."""
    p = module.params
    args = ["report", p["run_dir"], "--json"]
    for host in p["expect_hosts"]:
        args += ["--expect-host", host]
    if p["db"]:
        args += ["--db", p["db"]]
    if p["baseline"]:
        args += ["--baseline", p["baseline"]]
    if p["set_baseline"]:
        args.append("--set-baseline")
    for host, name in sorted(p["slurm_names"].items()):
        args += ["--slurm-name", "%s=%s" % (host, name)]
    args += _textfile_args(p)
    try:
        rc, summary = run_json(
            python, args, p["timeout_s"], "the controller", ok_rcs=(0, 1), engine_src=p["engine_src"]
        )
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    files = summary.get("files") or {}
    run_dir = p["run_dir"]
    certified = None
    if p["certify_key"] or p["certify_command"]:
        certified = _certify(module, python, summary)
    module.exit_json(
        certificates=certified,
        changed=True,
        accepted=rc == 0,
        drain=summary.get("drain") or [],
        baseline=summary.get("baseline"),
        verdict=summary.get("verdict"),
        failed_hosts=failed_hosts(summary),
        summary=summary,
        report_json=files.get("json", os.path.join(run_dir, "report.json")),
        report_md=files.get("md", os.path.join(run_dir, "report.md")),
        report_html=files.get("html", os.path.join(run_dir, "report.html")),
        junit_xml=files.get("junit", os.path.join(run_dir, "junit.xml")),
    )
