#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_start
short_description: "Internal: start or resume a validation run on the controller"
version_added: 0.2.0
description:
  - Runs C(python -m gpufleet run start) on the controller. It checks that the run id and every host name of the
    run are plain names (letters, digits, C(.), C(_), C(-), no leading dot), creates C(REPORTS_DIR/RUN_ID/hosts/)
    with modes that keep other users out, and records the attempt in C(run.json).
  - A run id that an earlier run used is refused with a message naming it, unless O(resume) adds an attempt to
    that run.
  - Returns the runs of this controller that were killed (their ansible-playbook process is gone without a report),
    whose node locks are stale.
options:
  reports_dir:
    description: Absolute folder the run folders go in (C(gpufleet_reports_dir)).
    type: path
    required: true
  run_id:
    description:
      - The run's name (C(gpufleet_run_id)).
      - Left out, the engine mints one (the UTC time, C(%Y%m%dT%H%M%SZ)) and returns it as C(run_id).
    type: str
  hosts:
    description: The nodes the attempt covers, in inventory order.
    type: list
    elements: str
    default: []
  playbook:
    description: The playbook the attempt runs (validate, finetune, locate).
    type: str
    default: validate
  tier:
    description: The attempt's tier (C(gpufleet_tier)).
    type: str
  limit:
    description: The attempt's C(--limit), as given, for the record.
    type: str
  stages:
    description: The stages the attempt runs (C(gpufleet_stages)); empty means all.
    type: list
    elements: str
    default: []
  resume:
    description: Add an attempt to an existing run instead of refusing its id.
    type: bool
    default: false
  dry_run:
    description:
      - Check the run id, the host names and a reused id as for a run, and create and record nothing; C(run_dir) is
        the folder a real run would use. What C(validate.yml --check) runs.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.controller_engine
  - gpufleet.cluster.internal
attributes:
  check_mode:
    support: none
    details: It creates the run folder; a task that must run under C(--check) sets C(check_mode=false).
seealso:
  - module: gpufleet.cluster.host_record
  - module: gpufleet.cluster.fleet_report
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the run
  gpufleet.cluster.run_start:
    reports_dir: /srv/gpufleet/reports
    run_id: after-reimage
    hosts: "{{ groups['gpu_nodes'] }}"
  register: run
"""

RETURN = r"""
run_id:
  description: The run's id, as given or minted; run.json records it, and every report and store row uses it.
  returned: success
  type: str
  sample: after-reimage
run_dir:
  description: The run's folder.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/after-reimage
attempt:
  description: The number of this attempt, 1 for a new run; null with O(dry_run).
  returned: success
  type: int
  sample: 1
dry_run:
  description: True when O(dry_run) was set and nothing was created.
  returned: with O(dry_run)
  type: bool
resumed:
  description: Whether the run existed before (a resumed run).
  returned: success
  type: bool
controller:
  description: This controller and its ansible-playbook process (host, pid, started_ticks, boot_id).
  returned: success
  type: dict
dead_runs:
  description: Runs of this controller whose ansible-playbook process is gone without a report.
  returned: success
  type: list
  elements: str
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError, run_json


def main():
    module = AnsibleModule(
        argument_spec=dict(
            reports_dir=dict(type="path", required=True),
            run_id=dict(type="str"),
            hosts=dict(type="list", elements="str", default=[]),
            playbook=dict(type="str", default="validate"),
            tier=dict(type="str"),
            limit=dict(type="str"),
            stages=dict(type="list", elements="str", default=[]),
            resume=dict(type="bool", default=False),
            python=dict(type="path"),
            engine_src=dict(type="path"),
            dry_run=dict(type="bool", default=False),
        ),
        supports_check_mode=False,
    )
    p = module.params
    args = ["run", "start", p["reports_dir"]] + ([p["run_id"]] if p["run_id"] else []) + ["--playbook", p["playbook"]]
    for host in p["hosts"]:
        args += ["--host", host]
    for stage in p["stages"]:
        args += ["--stage", stage]
    for key in ("tier", "limit"):
        if p[key]:
            args += ["--" + key, p[key]]
    if p["resume"]:
        args.append("--resume")
    if p["dry_run"]:
        args.append("--dry-run")
    try:
        dummy, started = run_json(
            p["python"] or sys.executable, args, 120, "the controller", engine_src=p["engine_src"]
        )
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(changed=not p["dry_run"], **started)


if __name__ == "__main__":
    main()
