# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Options and notes shared by the check modules (gpu_inventory, gpu_health, host_hygiene, gpu_counters); with
gpufleet.cluster.host_document, which they extend too."""

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
  timeout_s:
    description:
      - Seconds the engine may run; past it the engine's whole process group is killed and the module fails.
    type: int
    default: 120
notes:
  - The module only reads the node; it never changes it, so check mode runs it as usual.
  - A check that fails is a result with status C(fail) in RV(gpufleet), not a module failure. The module fails only
    when the engine could not answer (missing interpreter, engine not installed, bad input, timeout), with a
    C(msg) that says why and a C(remedy).
requirements:
  - The gpufleet engine (Python >= 3.10) installed under O(python) on the node.
"""
