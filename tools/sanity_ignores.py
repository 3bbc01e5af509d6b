"""The ansible-test sanity ignore files, tests/sanity/ignore-<core>.txt, written from what the collection ships.

ansible-test sanity checks every Python file of the installed collection, the engine under src/ among them
(bringup.yml installs it on the nodes from there). The engine follows the project's own rules (ruff, [tool.ruff] in
pyproject.toml, held by tests/test_ruff.py), not ansible-test's pylint and pycodestyle settings (which refuse `_` as a
name, a lambda given a name and lines over 160 columns), so each engine file skips those two. The modules carry the
Apache-2.0 header, not the GPLv3 one validate-modules looks for. An ignore file holds no comment lines, so these
lines are written here rather than by hand, one file for each ansible-core minor the collection claims;
tests/test_collection_conventions.py holds the files to this.

    python3 tools/sanity_ignores.py           write the files (make generate)
    python3 tools/sanity_ignores.py --check   say which files are not current, exit 1
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def claimed_minors(root: Path = ROOT) -> list[str]:
    """Every ansible-core minor the collection claims, from meta/runtime.yml's requires_ansible (>=2.16.0) to below the
    upper bound of pyproject.toml's ansible-core (<2.21): each one's ansible-test reads an ignore file of its own."""
    low = re.search(r"^requires_ansible:\s*[\"']?>=\s*(\d+)\.(\d+)", (root / "meta" / "runtime.yml").read_text(), re.M)
    high = re.search(r"\"ansible-core>=[0-9.]+,<(\d+)\.(\d+)\"", (root / "pyproject.toml").read_text())
    if not low or not high or low.group(1) != high.group(1):
        raise SystemExit("meta/runtime.yml or pyproject.toml no longer says the ansible-core range as >=X.Y and <X.Z")
    return [f"{low.group(1)}.{minor}" for minor in range(int(low.group(2)), int(high.group(2)))]


CORE_VERSIONS = claimed_minors()
LICENSE = "validate-modules:missing-gplv3-license # the collection is Apache-2.0"
ENGINE_SKIPS = ("pep8!skip", "pylint!skip")
ENGINE_WHY = "# the engine follows the project's ruff rules, held by pytest"


def ignore_lines(root: Path) -> list[str]:
    """The lines for the collection at root (a checkout or an installed copy): its modules, its engine's files."""
    modules = sorted(p.relative_to(root).as_posix() for p in (root / "plugins" / "modules").glob("*.py"))
    engine = sorted(
        p.relative_to(root).as_posix()
        for p in (root / "src").rglob("*.py")
        if "__pycache__" not in p.parts
        and not any(part.endswith(".egg-info") for part in p.parts)
        and not p.name.startswith("test_")  # a benchmark's own tests: in its folder, not in the collection
    )
    return [f"{m} {LICENSE}" for m in modules] + [f"{f} {skip} {ENGINE_WHY}" for f in engine for skip in ENGINE_SKIPS]


def ignore_files(root: Path) -> dict[Path, str]:
    text = "".join(f"{line}\n" for line in ignore_lines(root))
    return {root / "tests" / "sanity" / f"ignore-{v}.txt": text for v in CORE_VERSIONS}


def stale(root: Path) -> list[Path]:
    """The ignore files at root that are missing or differ from what ignore_files writes."""
    return [p for p, text in ignore_files(root).items() if not p.is_file() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the files not current")
    args = parser.parse_args(argv)
    if args.check:
        old = stale(ROOT)
        for p in old:
            print(f"{p.relative_to(ROOT)} is not current: run make generate", file=sys.stderr)
        return 1 if old else 0
    for path, text in ignore_files(ROOT).items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
