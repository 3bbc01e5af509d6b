"""The collection declares what an execution environment (AWX, Automation Platform) needs to run its playbooks:
meta/execution-environment.yml names requirements.txt (Python) and bindep.txt (system), as ansible-builder reads
them from every collection it installs.

The built tarball is installed, `ansible-builder introspect` reads its dependencies as a build does, and
`ansible-builder create` makes the build context of an execution environment holding the collection (no container
runtime here: the context, not the image).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from test_collection_conventions import tarball  # noqa: F401 (the fixture: the tarball built once)

pytest.importorskip("ansible_builder")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _names(lines: list[str]) -> set[str]:
    """Package names of requirement lines, comments and versions left out."""
    out = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(line.split()[0].split(">")[0].split("=")[0].split("<")[0].lower())
    return out


@pytest.fixture(scope="module")
def installed(tarball, tmp_path_factory) -> tuple[Path, Path]:  # noqa: F811 (the imported fixture)
    """(the collections folder the built tarball is installed in, the tarball)."""
    tmp = tmp_path_factory.mktemp("ee")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(tmp / "collections")],
        cwd=tmp,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp / "collections")),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return tmp / "collections", tarball


def test_the_collection_declares_its_dependencies_as_ansible_builder_reads_them(installed):
    collections, _ = installed
    root = collections / "ansible_collections" / "gpufleet" / "cluster"
    meta = yaml.safe_load((root / "meta" / "execution-environment.yml").read_text())
    assert meta["dependencies"] == {"python": "requirements.txt", "system": "bindep.txt"}
    # The Python side is the controller extra's, less what runs the playbooks themselves.
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["controller"]
    declared = _names((root / "requirements.txt").read_text().splitlines())
    assert declared == _names(extra) - {"ansible-core", "ansible-runner", "rich"} | {"pyyaml"}, declared

    done = subprocess.run(
        [str(BIN / "ansible-builder"), "introspect", "--sanitize", str(collections)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = yaml.safe_load(done.stdout.split("\n", 1)[1])  # after its comment line
    assert any(line.startswith("prometheus-client>=0.20") and "gpufleet.cluster" in line for line in found["python"])
    assert {"openssh-client [platform:dpkg]", "openssh-clients [platform:rpm]"} <= {
        line.split("  #")[0] for line in found["system"]
    }, found


def test_ansible_builder_creates_the_build_context_of_an_environment_with_the_collection(installed, tmp_path):
    collections, built = installed
    root = collections / "ansible_collections" / "gpufleet" / "cluster"
    definition = tmp_path / "execution-environment.yml"
    definition.write_text(
        yaml.safe_dump(
            {
                "version": 3,
                "images": {"base_image": {"name": "registry.example/ee-base:latest"}},
                "dependencies": {
                    "ansible_core": {"package_pip": "ansible-core>=2.16,<2.21"},
                    "ansible_runner": {"package_pip": "ansible-runner"},
                    "galaxy": {"collections": [{"name": str(built), "type": "file"}]},
                    "python": str(root / "requirements.txt"),
                    "system": str(root / "bindep.txt"),
                },
            }
        )
    )
    done = subprocess.run(
        [
            str(BIN / "ansible-builder"),
            "create",
            "-f",
            str(definition),
            "-c",
            str(tmp_path / "context"),
            "--output-filename",
            "Containerfile",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    build = tmp_path / "context" / "_build"
    assert {"prometheus-client", "pyyaml"} <= _names((build / "requirements.txt").read_text().splitlines())
    assert "openssh-client [platform:dpkg]" in (build / "bindep.txt").read_text()
    assert yaml.safe_load((build / "requirements.yml").read_text())["collections"][0]["name"] == str(built)
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    assert "requirements.txt" in containerfile and "bindep.txt" in containerfile and "introspect" in containerfile
