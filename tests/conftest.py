"""Shared test set-up."""

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
