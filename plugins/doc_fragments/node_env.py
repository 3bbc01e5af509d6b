# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The node's environment, an option of every module that runs the engine on a node."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  node_env:
    description:
      - Environment variables for the engine and everything it starts on the node (C(gpufleet_node_env), for example
        C(CUDA_VISIBLE_DEVICES), a token, proxies), added to the module's own environment.
      - They reach the node as the module's input, never on a command line (Ansible's C(environment) keyword would
        write each value into the module's command line, which every user of the node can read); the module's
        result names the variables only. The playbooks set it for the group C(gpufleet.cluster.node) with
        C(module_defaults).
      - The module's input is in the copy of the module Ansible leaves on the node unless the connection pipelines
        (C(AnsiballZ_<module>.py) under C(remote_tmp)); the module removes it as soon as it has read its input, and
        the copies of gpufleet modules a killed run left there (10 minutes old or more, run by no process).
    type: dict
    default: {}
"""
