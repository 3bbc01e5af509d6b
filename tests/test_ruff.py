"""ruff's lint rules of pyproject.toml ([tool.ruff]) and its formatter hold over the engine, the collection's
plugins, the scripts, the tools and the tests (tests/, each benchmark's own in src/, the root's conftest.py and
setup.py): an unused import, an undefined name, an import below the code or a file
`ruff format` would change fails make test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "plugins", "scripts", "tools", "tests", "conftest.py", "setup.py"]


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run(
        [str(ruff), "check", "--no-cache", "--output-format", "concise", *PATHS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format_leaves_nothing_to_change():
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run(
        [str(ruff), "format", "--check", "--no-cache", *PATHS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"run `ruff format {' '.join(PATHS)}`:\n" + proc.stdout[-4000:] + proc.stderr[-2000:]
