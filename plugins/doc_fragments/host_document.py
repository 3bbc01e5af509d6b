# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Options of every module that judges a node into a host document: the profile it judges against, the overrides,
and the name the document carries (the check modules, gpu_counters, benchmark, finetune)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  profile:
    description:
      - Name of the threshold profile to use (C(files/profiles/<name>.yml)), for example V(h100-sxm).
      - Left out, the engine picks the profile from the detected GPU name.
    type: str
  thresholds:
    description:
      - Threshold overrides, key to value (C(gpufleet_thresholds)); keys are those of C(files/profiles/generic.yml)
        and of the benchmarks' declarations.
      - An unknown key or a value of the wrong type fails the module with the engine's message naming the key.
    type: dict
  host_name:
    description:
      - Host name recorded in the host document; use C(inventory_hostname) so reports match the inventory.
      - Left out, the node's own host name is used.
    type: str
"""
