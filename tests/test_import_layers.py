"""The engine's layers (pyproject.toml's [tool.importlinter], docs/architecture.md): `lint-imports` over
src/gpufleet, so an import that runs back up a layer, or a circle between two, fails the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout
