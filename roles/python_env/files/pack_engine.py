# Copyright: gpufleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""Pack the gpufleet engine's sources from a checkout into one tar.gz, the same bytes every time
for the same sources (sorted names, no times or owners), so copying it to a node is idempotent.

    python pack_engine.py CHECKOUT OUT.tar.gz

Takes pyproject.toml, README.md and src/gpufleet/**/*.py and *.yml, following the profiles link, but not the tests
a benchmark's folder keeps beside it (test_*.py), and the file the engine's version comes from
(src/gpufleet/version.py): galaxy.yml in a checkout, MANIFEST.json in an installed collection. Prints the number of
files packed.
"""

import gzip
import io
import os
import sys
import tarfile

PATTERNS = (".py", ".yml")
TESTS = "test_"  # a benchmark's own tests, in its folder: the checkout's, not the node's
VERSION_FILES = ("galaxy.yml", "MANIFEST.json")


def engine_files(checkout):
    names = ["pyproject.toml", "README.md"]
    names += [f for f in VERSION_FILES if os.path.isfile(os.path.join(checkout, f))][:1]
    for top, dirs, files in os.walk(os.path.join(checkout, "src", "gpufleet"), followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        names.extend(
            os.path.relpath(os.path.join(top, f), checkout)
            for f in files
            if f.endswith(PATTERNS) and not f.startswith(TESTS)
        )
    return sorted(names)


def pack(checkout, out):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in engine_files(checkout):
            with open(os.path.join(checkout, name), "rb") as handle:
                data = handle.read()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        count = len(tar.getmembers())
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(buf.getvalue())
    os.replace(tmp, out)
    return count


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: pack_engine.py CHECKOUT OUT.tar.gz")
    print(pack(sys.argv[1], sys.argv[2]))
