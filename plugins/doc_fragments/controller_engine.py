# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Options of the modules that run the engine on the controller: which Python, and which engine
(fleet_report, run_start, host_record, locate_step)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  engine_src:
    description:
      - Folder on the controller holding the gpufleet package (the collection's C(src/)); it goes first on
        C(PYTHONPATH), so the engine that ships with the collection answers, installed or checked out.
    type: path
  python:
    description:
      - Python interpreter on the controller that has the gpufleet engine installed.
      - Left out, the interpreter the task runs under on the controller is used.
    type: path
"""
