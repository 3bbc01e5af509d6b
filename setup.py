"""pyproject.toml declares the package; this adds one thing its tables cannot say: a benchmark's own tests
(src/gpufleet/benchmarks/<name>/test_<name>*.py, beside what they test) stay out of the wheel, as they stay out of
the collection (galaxy.yml's build_ignore) and of the engine bringup.yml packs for the nodes
(roles/python_env/files/pack_engine.py). tests/test_benchmark_folders.py holds all three to it."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if not m[1].startswith("test_")]


setup(cmdclass={"build_py": BuildPy})
