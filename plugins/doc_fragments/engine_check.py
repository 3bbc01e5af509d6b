# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Options and notes shared by the check modules (gpu_inventory, gpu_health, host_hygiene)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  python:
    description:
      - Path on the node of the Python interpreter that has the gpufleet engine installed (C(gpufleet_python)).
      - The engine runs as C(<python> -m gpufleet check ...); it may differ from the interpreter Ansible uses.
    type: path
    required: true
  profile:
    description:
      - Name of the threshold profile to use (C(files/profiles/<name>.yml)), for example V(h100-sxm).
      - Left out, the engine picks the profile from the detected GPU name.
    type: str
  thresholds:
    description:
      - Threshold overrides, key to value (C(gpufleet_thresholds)); keys are those of C(files/profiles/generic.yml).
      - An unknown key or a value of the wrong type fails the module with the engine's message naming the key.
    type: dict
  timeout_s:
    description:
      - Seconds the engine may run; past it the engine's whole process group is killed and the module fails.
    type: int
    default: 120
  host_name:
    description:
      - Host name recorded in the host document; use C(inventory_hostname) so reports match the inventory.
      - Left out, the node's own host name is used.
    type: str
notes:
  - The module only reads the node; it never changes it, so check mode runs it as usual.
  - A check that fails is a result with status C(fail) in RV(gpufleet), not a module failure. The module fails only
    when the engine could not answer (missing interpreter, engine not installed, bad input, timeout), with a
    C(msg) that says why and a C(remedy).
requirements:
  - The gpufleet engine (Python >= 3.10) installed under O(python) on the node.
"""
