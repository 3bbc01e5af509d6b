"""The engine's layers (pyproject.toml's [tool.importlinter], docs/architecture.md): `lint-imports` over
src/gpufleet as it ships, so an import that runs back up a layer, or a circle between two, fails the tests. A
benchmark's own tests (benchmarks/<name>/test_*.py) are left out: they ship nowhere, and a test may drive its
benchmark from above (the node's stage, the report)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(src: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _shipped_engine(tmp_path: Path) -> Path:
    """A copy of src/gpufleet as it ships: without the benchmarks' own tests."""
    shutil.copytree(
        ROOT / "src" / "gpufleet", tmp_path / "gpufleet", ignore=shutil.ignore_patterns("__pycache__", "test_*.py")
    )
    return tmp_path


def test_import_contracts_kept(tmp_path):
    proc = _lint(_shipped_engine(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


def test_an_import_up_a_layer_breaks_the_contract(tmp_path):
    # A copy of the engine whose document model imports the command line: the contract must name it.
    _shipped_engine(tmp_path)
    with open(tmp_path / "gpufleet" / "base" / "schema.py", "a") as f:
        f.write("\nfrom gpufleet.commands import main  # noqa: E402\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout, proc.stdout + proc.stderr
    assert "gpufleet.base.schema -> gpufleet.commands.main" in proc.stdout, proc.stdout


def test_no_import_is_let_off_the_contracts():
    """Every import keeps the layers: the contracts list no exception (ignore_imports)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert "[tool.importlinter]" in text and "ignore_imports" not in text.split("[tool.importlinter]", 1)[1]


def test_the_root_keeps_the_entry_point_and_each_module_has_a_name_of_its_own():
    """The package root holds the entry point and little else (every other module lives in the folder of its layer),
    and no two modules of the engine share a file name, so a name says which module it is."""
    engine = ROOT / "src" / "gpufleet"
    loose = sorted(p.name for p in engine.glob("*.py"))
    assert len(loose) <= 6, loose
    names = [p.name for p in engine.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_architecture_map_shows_the_layers_as_the_contract_orders_them():
    """docs/architecture.md shows the layers as folders: each folder of the engine in the order of the layers
    contract, top to bottom, and no folder that is not there."""
    contract = next(
        c
        for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
        if c.get("containers") == ["gpufleet"]
    )
    layers = [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]
    folders = [
        layer for layer in layers if all((ROOT / "src" / "gpufleet" / m / "__init__.py").is_file() for m in layer)
    ]
    text = (ROOT / "docs" / "architecture.md").read_text()
    diagram = text.split("## The engine by folder", 1)[1].split("```")[1]
    shown = [
        re.findall(r"([a-z_]+)/", line[3:].split("  ")[0]) for line in diagram.splitlines() if line.startswith("   ")
    ]
    shown = [names for names in shown if names]
    assert shown == folders, (shown, folders)
    every = {p.name for p in (ROOT / "src" / "gpufleet").iterdir() if (p / "__init__.py").is_file()}
    assert {m for layer in folders for m in layer} == every


def _upper_folders() -> list[str]:
    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    names = [n.strip() for layer in layers for n in layer.split("|")]
    return names[: names.index("base")]


def test_the_declarations_name_no_module_above_them():
    """base/ (the ground floor) holds no string naming a module above it, as "gpufleet.<folder>..." or a
    "module:function": what gives an entry its behaviour is registered by the module that holds it."""
    import ast

    upper = re.compile(rf"^gpufleet\.({'|'.join(_upper_folders())})\b|^\.?[a-z_][\w.]*:[a-z_]\w*$")
    named = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for path in sorted((ROOT / "src" / "gpufleet" / "base").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and upper.search(node.value)
    ]
    assert named == []


def test_every_entry_has_what_gives_it_its_behaviour_registered_by_its_index():
    """Each reader's index imports the modules that register what it reads: every benchmark's measurement and
    judgement, every output of the report, every comparison (and its rows on the node) is there once they are
    imported; an entry nobody registered is a KeyError naming it and its role."""
    import pytest

    from gpufleet import checks
    from gpufleet.base import registry
    from gpufleet.comparisons import node  # noqa: F401
    from gpufleet.fleet import compare  # noqa: F401
    from gpufleet.node import measure  # noqa: F401
    from gpufleet.report import pipeline  # noqa: F401

    assert [len(checks.GROUPS[g.name]) for g in registry.CHECK_GROUPS] == [len(g.checks) for g in registry.CHECK_GROUPS]
    for b in registry.BENCHMARKS:
        assert registry.registered(b.name, "judge")
        assert registry.registered(b.name, "run", needed=False) or registry.registered(b.name, "measure"), b.name
    for o in registry.report_outputs():
        name = f"output.{o.name}"
        assert registry.registered(name, "render", needed=False) or registry.registered(name, "write"), o.name
    for c in registry.comparison_checks():
        assert registry.registered(f"fleet.{c.name}", "check")
    for c in registry.comparison_checks(registry.NODE):
        assert registry.registered(f"fleet.{c.name}", "rows")
    with pytest.raises(KeyError, match="'nope' has no 'judge' registered: `<benchmark>`"):
        registry.registered("nope", "judge")
