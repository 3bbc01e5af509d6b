"""The checkout's tools (tools/: measurement harnesses, calibration, generators), loaded as modules for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load(name: str) -> ModuleType:
    """tools/<name>.py as a module of that name (registered, so dataclasses and pickling find it)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
