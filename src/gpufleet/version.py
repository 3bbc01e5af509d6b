"""The one version of gpufleet: galaxy.yml's `version`, from which ansible-galaxy builds the collection.

pyproject.toml takes the engine's version from here (`[tool.setuptools.dynamic]`), so the package and the collection
never differ. Found, in this order: galaxy.yml at the root above src/ (a checkout, or the engine's sources packed for
a node), the MANIFEST.json of an installed collection (whose src/ the controller runs), the installed package's
metadata (a wheel). No third-party import: setuptools reads it in a build environment that has no PyYAML.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "0+unknown"


def read(root: Path = ROOT) -> str:
    galaxy = root / "galaxy.yml"
    if galaxy.is_file():
        version_match = re.search(r"""^version:\s*["']?([^"'\s#]+)""", galaxy.read_text(), flags=re.M)
        if version_match:
            return version_match.group(1)
    manifest = root / "MANIFEST.json"
    if manifest.is_file():
        try:
            return str(json.loads(manifest.read_text())["collection_info"]["version"])
        except (ValueError, KeyError, TypeError):
            pass
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        return UNKNOWN


VERSION = read()
