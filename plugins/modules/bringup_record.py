#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bringup_record
short_description: "Internal: record what a bring-up role applied, so validation can tell when it drifted"
version_added: 0.1.0
description:
  - Writes one role's section of the bring-up record, C(/etc/gpufleet/bringup.json) by default, leaving the other
    roles' sections as they are.
  - A section holds the settings the role applied, for people to read, and a list of expectations, for the
    C(host_hygiene.bringup_drift) check to hold against the node later. An expectation names a file (C(path))
    or a set of files (C(glob)) and what bring-up left there.
  - The file is rewritten only when the section's settings or expectations change, so a second run reports no change;
    C(applied_at) then keeps the time they were first applied.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.cluster.attributes.read_only
  - gpufleet.cluster.internal
options:
  path:
    description: Where the record lives on the node.
    type: path
    default: /etc/gpufleet/bringup.json
  role:
    description: Name of the role whose section this is, for example C(nccl).
    type: str
    required: true
  settings:
    description: What the role applied, as it should read to a person (variable names and values).
    type: dict
    default: {}
  expect:
    description:
      - What must still hold on the node for the role's work to count as in place.
      - Each entry has C(what) (a short name used in reports), C(path) or C(glob), and one of C(sha256), C(value) or
        C(exists). An entry with a C(path) and none of the three records the SHA-256 of that file as it is now.
    type: list
    elements: dict
    default: []
  state:
    description: C(present) writes the role's section; C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: gpufleet.cluster.bringup_facts
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record the NCCL configuration this role wrote
  gpufleet.cluster.bringup_record:
    role: nccl
    settings:
      NCCL_IB_HCA: "=mlx5_0,mlx5_1"
    expect:
      - what: nccl.conf content
        path: /etc/nccl.conf
      - what: kernel.numa_balancing
        path: /proc/sys/kernel/numa_balancing
        value: "0"
      - what: CPU governor
        glob: /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor
        value: performance
"""

RETURN = r"""
record:
  description: The whole record as it is on the node after this task (as it would be, in check mode).
  returned: always
  type: dict
  sample:
    schema_version: 1
    written_by: bringup.yml
    roles:
      nccl:
        applied_at: "2026-11-21T21:00:00Z"
        settings: {NCCL_IB_HCA: "=mlx5_0,mlx5_1"}
        expect:
          - {what: nccl.conf content, path: /etc/nccl.conf, sha256: 0c1b...}
section:
  description: This role's section of the record (null after C(state=absent)).
  returned: always
  type: dict
path:
  description: Path of the record.
  returned: always
  type: str
  sample: /etc/gpufleet/bringup.json
"""

import datetime
import hashlib
import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

SCHEMA_VERSION = 1
KINDS = ("sha256", "value", "exists")


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/gpufleet/bringup.json"),
            role=dict(type="str", required=True),
            settings=dict(type="dict", default={}),
            expect=dict(type="list", elements="dict", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def normalise(expect, fail, check_mode):
    """Expectations as they go into the record; a bare path gets the SHA-256 of the file now.

    In check mode a file the role would have written may not exist yet; its hash is then null.
    """
    out = []
    for num, item in enumerate(expect):
        where = item.get("path") or item.get("glob")
        label = "expect[%d]" % num
        if not isinstance(where, str) or not where.startswith("/"):
            fail("%s needs an absolute 'path' or 'glob', got %r" % (label, where))
        if item.get("path") and item.get("glob"):
            fail("%s has both 'path' and 'glob'; give one" % label)
        kinds = [k for k in KINDS if k in item]
        if len(kinds) > 1:
            fail("%s has %s; give one of %s" % (label, " and ".join(kinds), ", ".join(KINDS)))
        entry = {"what": str(item.get("what") or where)}
        entry["glob" if item.get("glob") else "path"] = where
        if not kinds:
            if item.get("glob"):
                fail("%s: a 'glob' needs a 'value' every matching file must hold" % label)
            try:
                entry["sha256"] = file_sha256(where)
            except OSError as exc:
                if not check_mode:
                    fail("%s: cannot read %s to record its SHA-256: %s" % (label, where, exc.strerror or exc))
                entry["sha256"] = None
        elif kinds[0] == "exists":
            entry["exists"] = bool(item["exists"])
        else:
            entry[kinds[0]] = str(item[kinds[0]]).strip() if kinds[0] == "value" else str(item[kinds[0]])
        out.append(entry)
    return out


def load(path, fail):
    """The record on the node; an absent one is empty, a corrupt one is replaced (and said so)."""
    empty = {"schema_version": SCHEMA_VERSION, "written_by": "bringup.yml", "roles": {}}
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return empty, None
    except OSError as exc:
        fail("cannot read the bring-up record %s: %s" % (path, exc.strerror or exc))
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return empty, "%s was not valid JSON (%s); it is written anew" % (path, exc)
    if not isinstance(doc, dict) or not isinstance(doc.get("roles"), dict):
        return empty, "%s did not hold a 'roles' mapping; it is written anew" % path
    return doc, None


def write(module, path, doc):
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bringup-")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def main():
    module = build_module()
    p = module.params
    path = p["path"]

    def fail(msg):
        module.fail_json(msg=msg, path=path)

    doc, warning = load(path, fail)
    if warning:
        module.warn(warning)
    roles = dict(doc["roles"])
    old = roles.get(p["role"])
    if p["state"] == "absent":
        section = None
        changed = old is not None
        roles.pop(p["role"], None)
    else:
        section = {"settings": p["settings"], "expect": normalise(p["expect"], fail, module.check_mode)}
        same = isinstance(old, dict) and all(old.get(k) == section[k] for k in ("settings", "expect"))
        changed = not same or warning is not None
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        section["applied_at"] = old.get("applied_at") if same else now
        roles[p["role"]] = section
    new_doc = dict(doc, roles=roles, schema_version=SCHEMA_VERSION, written_by="bringup.yml")
    if changed and not module.check_mode:
        write(module, path, new_doc)
    module.exit_json(changed=changed, record=new_doc, section=section, path=path)


if __name__ == "__main__":
    main()
