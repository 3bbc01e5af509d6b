"""Run a gpufleet.cluster module's main() in this process, as Ansible would, and read what it returns.

Importing this puts the checkout's collections/ folder on sys.path, so
`ansible_collections.gpufleet.cluster` resolves to the repository itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# collections/ansible_collections/gpufleet/cluster links back to the repository root.
sys.path.insert(0, str(REPO / "collections"))

from ansible.module_utils import basic  # noqa: E402


def run_module(mod, args: dict, capsys) -> dict:
    """Run mod.main() with these module arguments; return its JSON output with `_exit_code` added."""
    try:
        from ansible.module_utils.testing import patch_module_args  # ansible-core >= 2.19
    except ImportError:  # older cores read the arguments from basic._ANSIBLE_ARGS
        from unittest import mock

        def patch_module_args(a):
            return mock.patch.object(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": a}).encode())

    capsys.readouterr()
    # A module runs in a process of its own on the node. Once any test of this process imported Ansible's controller
    # (a Templar), ansible-core >= 2.19 sends a module's warnings to the controller's display instead of its result.
    internal = sys.modules.get("ansible.module_utils._internal")  # not in cores before 2.19
    was = getattr(internal, "is_controller", None)
    if was:
        internal.is_controller = False
    try:
        with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
            mod.main()
    finally:
        if was:
            internal.is_controller = was
    out = json.loads(capsys.readouterr().out)
    out["_exit_code"] = exit_info.value.code
    return out


def documented_options(mod) -> dict:
    """A module's options as ansible-doc shows them: its DOCUMENTATION's own, then those of each of the collection's
    doc fragments it extends (`gpufleet.cluster.NAME`, or `.VAR` for another variable than DOCUMENTATION)."""
    import importlib

    import yaml

    doc = yaml.safe_load(mod.DOCUMENTATION)
    options = dict(doc.get("options") or {})
    for name in doc.get("extends_documentation_fragment") or []:
        if not name.startswith("gpufleet.cluster."):
            continue
        fragment, _, var = name.removeprefix("gpufleet.cluster.").partition(".")
        cls = importlib.import_module(f"ansible_collections.gpufleet.cluster.plugins.doc_fragments.{fragment}")
        text = getattr(cls.ModuleDocFragment, var.upper() or "DOCUMENTATION")
        for key, value in (yaml.safe_load(text).get("options") or {}).items():
            options.setdefault(key, value)
    return options
