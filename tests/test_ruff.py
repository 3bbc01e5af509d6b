"""ruff's lint rules of pyproject.toml ([tool.ruff]) hold over the engine, the collection's plugins, the scripts
and the tests: an unused import, an undefined name or an import below the code fails make test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "src", "plugins", "scripts",
                           "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
