# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The attributes every module of the collection shares (with ansible.builtin.action_common_attributes, which
describes them): no diff mode, POSIX hosts. READ_ONLY (`gpufleet.cluster.attributes.read_only`) is the same with
full check mode, for a module that only reads; a module whose check mode is another says so in its own
`attributes.check_mode`."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
