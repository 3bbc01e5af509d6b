#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_report
short_description: Aggregate the host documents of a validation run into the fleet report
version_added: 0.1.0
description:
  - Runs C(python -m gpufleet report RUN_DIR --json) on the controller. It reads C(RUN_DIR/hosts/*.json) and writes
    C(report.json), C(report.md), C(report.html) and C(junit.xml) into O(run_dir).
  - A node that failed acceptance is reported as RV(accepted=false) and listed in RV(failed_hosts), not as a module
    failure, so the play decides what to do with it.
  - The module fails only when the report could not be made (missing run directory, engine not installed, timeout).
options:
  run_dir:
    description:
      - The run directory, holding C(hosts/<host>.json) for each host that reported.
    type: path
    required: true
  expect_hosts:
    description:
      - Hosts that must appear in the report; one that never wrote its document is reported as an error.
    type: list
    elements: str
    default: []
  db:
    description:
      - The run history (SQLite store) the run is indexed in and compared with (C(gpufleet_history_db)).
      - Left out, C(gpufleet.db) beside the run folder.
      - A store that is damaged or not a gpufleet store is moved aside (C(gpufleet.db.damaged-<UTC time>)) and, like a
        missing one, rebuilt from the run folders first; the report lists that in C(store_problems).
    type: path
  baseline:
    description:
      - The run to compare with (C(gpufleet_baseline)); left out, the store's baseline.
    type: str
  set_baseline:
    description:
      - Make this run the fleet's baseline once reported (C(gpufleet_baseline_set)).
    type: bool
    default: false
  slurm_names:
    description:
      - Inventory host to Slurm node name, for the drain lines (C(gpufleet_slurm_node_name)); a host not named here
        goes by its inventory name.
    type: dict
    default: {}
  prometheus_textfile_dir:
    description:
      - A node_exporter textfile-collector folder on the controller (C(gpufleet_prometheus_textfile_dir)); each node's
        Prometheus file is also written there as C(gpufleet_<node>.prom), replaced whole through a rename.
    type: path
  fleet_hosts:
    description:
      - With O(prometheus_textfile_dir), the inventory's nodes; a C(gpufleet_*.prom) there of a node not among them
        is removed, so a node taken out of the inventory leaves no stale file.
    type: list
    elements: str
  certify_key:
    description:
      - After the report, C(gpufleet certify RUN_DIR --key KEY) signs a certificate for each accepted node in
        C(RUN_DIR/certificates) (C(gpufleet_certify_key)). The key file must be mode 0600 and outside the reports
        folder; it is read on the controller and never copied.
    type: path
  certify_command:
    description:
      - Instead of O(certify_key), the site's signing command (C(gpufleet_certify_command)), with O(certify_pubkey).
    type: str
  certify_pubkey:
    description:
      - With O(certify_command), the public key (PEM) it signs for (C(gpufleet_certify_pubkey)).
    type: path
  timeout_s:
    description:
      - Seconds the report may take before its process group is killed and the module fails.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.controller_engine
attributes:
  check_mode:
    support: none
    details: It writes report files on the controller; a task that must run under C(--check) sets C(check_mode=false).
seealso:
  - module: gpufleet.cluster.gpu_inventory
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Make the fleet report
  gpufleet.cluster.fleet_report:
    run_dir: "{{ playbook_dir }}/reports/20261121T210000Z"
    expect_hosts: "{{ groups['gpu_nodes'] }}"
  register: report

- name: Stop when a node failed acceptance
  ansible.builtin.fail:
    msg: "nodes that failed acceptance: {{ report.failed_hosts | join(', ') }}; see {{ report.report_html }}"
  when: not report.accepted
"""

RETURN = r"""
accepted:
  description: Whether every node passed acceptance (C(gpufleet report) exited 0).
  returned: success
  type: bool
  sample: false
verdict:
  description: The fleet verdict, the worst node verdict (pass, warn or fail).
  returned: success
  type: str
  sample: fail
failed_hosts:
  description: Hosts whose verdict is fail, sorted.
  returned: success
  type: list
  elements: str
  sample: [node1]
drain:
  description: One C(scontrol update ... State=DRAIN) line per node not accepted (also in the run's drain.txt).
  returned: success
  type: list
  elements: str
baseline:
  description: The baseline run the report compared with, or null.
  returned: success
  type: raw
summary:
  description: The summary C(gpufleet report --json) prints, with a verdict, counts and failing checks per node.
  returned: success
  type: dict
certificates:
  description:
    - With O(certify_key) or O(certify_command), what C(gpufleet certify --json) printed, C(certified) (each node's
      valid_until) and C(not_certified) (each node with why); else null.
  returned: success
  type: dict
report_json:
  description: Path of report.json, every result of every host.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/20261121T210000Z/report.json
report_md:
  description: Path of report.md.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/20261121T210000Z/report.md
report_html:
  description: Path of report.html.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/20261121T210000Z/report.html
junit_xml:
  description: Path of junit.xml, one test case per check for CI systems.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/20261121T210000Z/junit.xml
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.report_module import (
    report_argument_spec,
    run_report_module,
)


def build_module():
    return AnsibleModule(argument_spec=report_argument_spec(), supports_check_mode=False)


def main():
    module = build_module()
    run_report_module(module, module.params["python"] or sys.executable)


if __name__ == "__main__":
    main()
