"""The Python a venv of the Makefile needs (an ansible-core that runs on some Pythons only): the first of the names
given (on PATH, or paths) of --from's version or newer, then pyenv's (oldest first). Standard library only.

    python3 scripts/find_python.py --from 3.12 [NAME ...]

Prints its path; exits 3, saying what it looked for, when none is.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

NONE_FOUND = 3  # the Makefile's targets pass it on; tests/test_ansible_versions.py skips on it, saying why


def version(python: str) -> tuple[int, int] | None:
    """(major, minor) of that Python, or None when it does not run (a pyenv shim of a version not selected)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=60
        )
    except OSError:
        return None
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def pyenv_pythons() -> list[str]:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        asked = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=60)
        root = asked.stdout.strip() or root
    return sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="low", type=_minor, required=True, help="the lowest version, e.g. 3.12")
    parser.add_argument("names", nargs="*", help="Pythons to try first, in order")
    args = parser.parse_args(argv)
    for name in [*args.names, *pyenv_pythons()]:
        found = shutil.which(name)
        got = version(found) if found else None
        if got and got >= args.low:
            print(found)
            return 0
    wanted = "%d.%d" % args.low
    print(f"no Python {wanted} or newer among {' '.join(args.names) or 'none named'} or pyenv's", file=sys.stderr)
    return NONE_FOUND


if __name__ == "__main__":
    sys.exit(main())
