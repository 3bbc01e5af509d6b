#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_record
short_description: "Internal: write a node's host document into its run on the controller"
version_added: 0.2.0
description:
  - Runs C(python -m gpufleet record RUN_DIR HOST) on the controller with the document on its standard input, from the
    task's own worker (an action plugin), whatever host the task runs for.
  - The document is written to C(RUN_DIR/hosts/HOST.json) beside the target and renamed into place, readable by the
    owner and the group only, and indexed in the run history (the SQLite store beside the run folders).
  - With O(replace_groups), the results of those groups in the existing document are replaced by the new ones and
    the rest is kept. An existing document that cannot be read is kept aside as C(HOST.json.unreadable) and the
    new one says so in an C(error) result.
options:
  run_dir:
    description: The run's folder (from gpufleet.cluster.run_start).
    type: path
    required: true
  host:
    description: The node's inventory name; it names the file.
    type: str
    required: true
  document:
    description: The host document (or, with O(replace_groups), a document whose results are added).
    type: dict
    required: true
  replace_groups:
    description: Groups whose results in the existing document the new results replace; empty writes the whole document.
    type: list
    elements: str
    default: []
  folder:
    description: The run's sub-folder the document goes in (hosts, or peers for nodes that only joined a run across nodes).
    type: str
    default: hosts
    choices: [hosts, peers]
  db:
    description:
      - The run history (SQLite store) the document is indexed in (C(gpufleet_history_db)); left out, C(gpufleet.db)
        beside the run folder.
      - A store that is damaged or not a gpufleet store is moved aside (C(gpufleet.db.damaged-<UTC time>)) and, like a
        missing one, rebuilt from the run folders before the document is indexed.
    type: path
  controller:
    description:
      - The run's controller as C(gpufleet.cluster.run_start) returned it. When that ansible-playbook process is gone,
        the document comes from what a stopped run left behind and is refused (the task fails, nothing is written).
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes
  - gpufleet.cluster.controller_engine
  - gpufleet.cluster.internal
attributes:
  check_mode:
    support: none
    details: It writes the run's files on the controller; a task that must run under C(--check) sets C(check_mode=false).
seealso:
  - module: gpufleet.cluster.run_start
  - module: gpufleet.cluster.fleet_report
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the node's host document
  gpufleet.cluster.host_record:
    run_dir: "{{ gpufleet_run_dir }}"
    host: "{{ inventory_hostname }}"
    document: "{{ document }}"
  delegate_to: localhost
"""

RETURN = r"""
path:
  description: The host document written.
  returned: success
  type: str
  sample: /srv/gpufleet/reports/after-reimage/hosts/node1.json
record:
  description: What C(gpufleet record) printed (the path, whether the store indexed it, or why not).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.cluster.plugins.module_utils.engine_process import EngineError
from ansible_collections.gpufleet.cluster.plugins.module_utils.record_module import record_argument_spec, run_record


def main():
    module = AnsibleModule(argument_spec=record_argument_spec(), supports_check_mode=False)
    try:
        record = run_record(module.params)
    except EngineError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(changed=True, path=record.get("path"), record=record)


if __name__ == "__main__":
    main()
