"""Shared test set-up, for both places tests live: tests/ and each benchmark's folder
(src/gpufleet/benchmarks/<name>/test_<name>*.py). pyproject.toml's `pythonpath` puts tests/ on sys.path, so the
helpers there (waiting, testhosts, ...) import from either."""

import os
import shutil
import textwrap
from pathlib import Path

import pytest

import waiting  # noqa: F401  (marks the processes this test run starts, before any starts)

# The module tests import ansible.module_utils.basic in this process, which replaces sys.intern;
# torch._dynamo (imported later by transformers, peft and torch.compile) refuses to load after that.
# Importing it first keeps the test order from mattering.
try:
    import torch._dynamo  # noqa: F401
except ImportError:  # no torch: the tests that need it skip
    pass


@pytest.fixture(scope="session", autouse=True)
def generic_limits(tmp_path_factory):
    """The tests judge with the profiles' own limits: the shipped calibration files (files/profiles/calibration/)
    come from GPU runs and move as runs add up, so the engine here reads a copy of the profiles without them. A test
    that needs a calibration writes its own (test_calibration.py)."""
    copy = tmp_path_factory.mktemp("profiles")
    for f in (Path(__file__).resolve().parent / "files" / "profiles").glob("*.yml"):
        shutil.copy(f, copy)
    before = os.environ.get("GPUFLEET_PROFILE_DIR")
    os.environ["GPUFLEET_PROFILE_DIR"] = str(copy)
    yield copy
    if before is None:
        os.environ.pop("GPUFLEET_PROFILE_DIR", None)
    else:
        os.environ["GPUFLEET_PROFILE_DIR"] = before


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """Put a `gpufleet` package with the given __main__ first on PYTHONPATH: a stand-in engine process whose
    behaviour the test writes, for the tests of the modules that run the engine."""

    def make(main_source: str) -> Path:
        pkg = tmp_path / "fake" / "gpufleet"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "__main__.py").write_text(textwrap.dedent(main_source))
        monkeypatch.setenv("PYTHONPATH", str(pkg.parent))
        return tmp_path

    return make


@pytest.fixture(scope="module")
def every_file(tmp_path_factory) -> Path:
    """A folder holding a reports folder with every file gpufleet.base.layout declares, and the node's lock, as the
    real commands leave them (tests/file_faults.py)."""
    import file_faults  # loads every command's modules: only for the tests that ask for it

    return file_faults.healthy(tmp_path_factory.mktemp("every-file"))
