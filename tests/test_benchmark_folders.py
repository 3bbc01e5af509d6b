"""A benchmark is one folder (docs/architecture.md): every module that registers a benchmark's behaviour lies in
that benchmark's folder, src/gpufleet/benchmarks/<name>/, each declared benchmark has its folder and its line in the
declarations index, and the node's shared modules (node/measure.py, checks/benchmarks.py) import no benchmark's
module nor register anything of one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpufleet.base import registry

ENGINE = Path(__file__).resolve().parents[1] / "src" / "gpufleet"
BENCHMARKS = ENGINE / "benchmarks"
REGISTERS = re.compile(r"@registers\(\s*\"([\w.]+)\"")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_every_benchmark_is_registered_from_its_own_folder_alone():
    names = {b.name for b in registry.BENCHMARKS}
    where: dict[str, set[str]] = {}
    for path in ENGINE.rglob("*.py"):
        for entry in REGISTERS.findall(path.read_text()):
            if entry in names:
                where.setdefault(entry, set()).add(str(path.parent.relative_to(ENGINE)))
    assert where == {name: {f"benchmarks/{name}"} for name in names}, where


def test_every_declared_benchmark_has_its_folder_and_its_index_line_in_the_stage_order():
    index = (BENCHMARKS / "__init__.py").read_text()
    lines = re.findall(r"^from gpufleet\.benchmarks\.(\w+) import (\w+)_declared  # noqa: F401$", index, re.M)
    assert [a for a, b in lines] == [b for a, b in lines] == [b.name for b in registry.BENCHMARKS]
    for b in registry.BENCHMARKS:
        folder = BENCHMARKS / b.name
        assert (folder / "__init__.py").is_file() and (folder / f"{b.name}_declared.py").is_file(), b.name
        assert all(p.stem.startswith(b.name) for p in folder.glob("*.py") if p.name != "__init__.py"), b.name


@pytest.mark.parametrize("module", ["node/measure.py", "checks/benchmarks.py"])
def test_the_shared_modules_name_no_benchmark(module):
    path = ENGINE / module
    imported = {m for m in _imports(path) if m.startswith("gpufleet.benchmarks.")}
    assert imported <= {"gpufleet.benchmarks.node_index"}, imported
    assert not REGISTERS.findall(path.read_text())


def test_a_benchmark_declared_twice_is_refused_naming_it():
    with pytest.raises(ValueError, match="'matmul' is declared twice"):
        registry.declare(registry.benchmark("matmul"))
    assert [b.name for b in registry.BENCHMARKS].count("matmul") == 1
