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


def test_no_import_is_let_off_the_contracts():
    """Every import keeps the layers: the contracts list no exception (ignore_imports)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert "[tool.importlinter]" in text and "ignore_imports" not in text.split("[tool.importlinter]", 1)[1]
