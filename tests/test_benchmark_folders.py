"""A benchmark is one folder (docs/architecture.md): every module that registers a benchmark's behaviour lies in
that benchmark's folder, src/gpufleet/benchmarks/<name>/, each declared benchmark has its folder, its own tests there
(test_<name>*.py) and its line in the declarations index, and the node's shared modules (node/measure.py,
checks/benchmarks.py) import no benchmark's module nor register anything of one. The tests in the folders ship
nowhere: not in the engine packed for the nodes, the sanity ignore lines, the node index, the wheel (here) or the
collection's tarball (tests/test_collection_conventions.py), and nothing imports them."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tool_modules
from gpufleet.base import registry

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "src" / "gpufleet"
BENCHMARKS = ENGINE / "benchmarks"
REGISTERS = re.compile(r"@registers\(\s*\"([\w.]+)\"")
# Every benchmark's own tests, in its folder.
FOLDER_TESTS = sorted(BENCHMARKS.glob("*/test_*.py"))


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
        own = [p.stem.removeprefix("test_") for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert all(stem.startswith(b.name) for stem in own), b.name


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


def test_every_declared_benchmark_has_its_own_tests_in_its_folder():
    for b in registry.BENCHMARKS:
        assert sorted((BENCHMARKS / b.name).glob(f"test_{b.name}*.py")), f"benchmarks/{b.name}/ has no test_{b.name}.py"
    assert {p.parent.name for p in FOLDER_TESTS} == {b.name for b in registry.BENCHMARKS}


def _shipped(paths) -> list[str]:
    return [p for p in paths if Path(p).name.startswith("test_") or Path(p).name == "conftest.py"]


def test_the_engine_packed_for_the_nodes_its_sanity_lines_and_its_node_index_hold_no_test():
    spec = importlib.util.spec_from_file_location("pack_engine", REPO / "roles/python_env/files/pack_engine.py")
    pack_engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack_engine)
    packed = pack_engine.engine_files(str(REPO))
    assert "src/gpufleet/benchmarks/sdc/sdc_measure.py" in packed and _shipped(packed) == []
    lines = tool_modules.load("sanity_ignores").ignore_lines(REPO)
    assert any(" src/gpufleet/benchmarks/" in f" {line}" for line in lines)
    assert _shipped(line.split()[0] for line in lines) == []
    assert "test_" not in (BENCHMARKS / "node_index.py").read_text()


def test_nothing_imports_a_benchmarks_tests():
    """They are leaves: what other tests share lives in tests/ (soak_runs.py, sdc_runs.py), so leaving the folders'
    tests out of what ships loses nothing that runs."""
    stems = {p.stem for p in FOLDER_TESTS}
    modules = {f"gpufleet.benchmarks.{p.parent.name}.{p.stem}" for p in FOLDER_TESTS}
    found = []
    for folder in ("src", "tests", "tools", "plugins"):
        for path in (REPO / folder).rglob("*.py"):
            for name in _imports(path):
                if name in modules or name.split(".")[0] in stems or name.rsplit(".", 1)[0] in modules:
                    found.append(f"{path.relative_to(REPO)}: {name}")
    assert found == []


@pytest.mark.slow
def test_the_wheel_holds_the_benchmarks_and_none_of_their_tests(tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "galaxy.yml"):
        shutil.copy(REPO / name, checkout / name)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    done = subprocess.run([*argv, str(checkout)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("gpufleet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpufleet/benchmarks/sdc/sdc_measure.py" in names and "gpufleet/benchmarks/node_index.py" in names
    assert _shipped(names) == []
