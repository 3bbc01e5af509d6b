# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The note every internal module carries: its short description starts with C(Internal:) and this fragment says
what that means (docs/modules.md lists the public modules and the internal ones)."""

from __future__ import annotations


class ModuleDocFragment:
    # ansible-doc wants options or attributes in every fragment: none here.
    DOCUMENTATION = r"""
options: {}
notes:
  - Internal to gpufleet.cluster. The collection's roles and playbooks call it; it is not a public interface, and its
    options and results may change in any release. Use the playbooks (validate.yml, finetune.yml, locate.yml,
    release.yml, bringup.yml) or the public modules instead.
"""
