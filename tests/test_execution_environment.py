"""The collection declares what an execution environment (AWX, Automation Platform) needs to run its playbooks:
meta/execution-environment.yml names requirements.txt (Python) and bindep.txt (system), as ansible-builder reads
them from every collection it installs.

The built tarball is installed, `ansible-builder introspect` reads its dependencies as a build does, and
docs/installed-collection.md's definition makes the build context of an execution environment holding the collection,
whose Galaxy steps then install it as the image's build would (no container runtime here: the context, not the
image).
"""

from __future__ import annotations

import json
import os
import re
import shutil
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


def documented_definition() -> str:
    """The definition docs/installed-collection.md gives, as it is written there."""
    text = (REPO / "docs" / "installed-collection.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "execution-environment.yml" in b]
    return block


def test_the_documented_definition_builds_a_context_whose_galaxy_step_installs_the_collection(installed, tmp_path):
    """docs/installed-collection.md's definition beside the built tarball, `ansible-builder create` as documented, then
    the context's own Galaxy steps (its Containerfile's `ansible-galaxy` lines) run from _build, as the image's build
    runs them in /build, into a folder of the test's own: the collection installs from the context alone."""
    collections, built = installed
    root = collections / "ansible_collections" / "gpufleet" / "cluster"
    definition = yaml.safe_load(documented_definition())
    assert definition["images"]["base_image"]["name"] == "<your base image>"
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["controller"]
    assert definition["dependencies"]["ansible_core"]["package_pip"] in extra, "the claimed ansible-core range"
    shutil.copy(built, tmp_path / built.name)
    (tmp_path / "execution-environment.yml").write_text(
        documented_definition().replace("<your base image>", "registry.example/ee-base:latest")
    )
    done = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    context = tmp_path / "context"
    build = context / "_build"
    # Containerfile where podman is the runtime, else Dockerfile
    (containerfile,) = [p.read_text() for p in (context / "Containerfile", context / "Dockerfile") if p.is_file()]
    # The image's Galaxy stage: the context's _build copied to /build, the steps run there.
    assert "COPY _build /build\nWORKDIR /build\n" in containerfile, containerfile
    steps = [line.removeprefix("RUN ") for line in containerfile.splitlines() if "ansible-galaxy" in line]
    assert [" role install " in s for s in steps] == [True, False] and " collection install " in steps[1], steps
    into = tmp_path / "image"
    for step in steps:
        command = re.sub(r"\$ANSIBLE_GALAXY_CLI_\w+_OPTS", "", step)
        command = command.replace('"/usr/share/ansible/', f'"{into}/').replace(
            "ansible-galaxy", str(BIN / "ansible-galaxy")
        )
        ran = subprocess.run(
            ["bash", "-c", command], cwd=build, env=dict(os.environ), capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, (command, ran.stdout + ran.stderr)
    installed_here = into / "collections" / "ansible_collections" / "gpufleet" / "cluster"
    version = json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"]
    assert json.loads((installed_here / "MANIFEST.json").read_text())["collection_info"]["version"] == version
    # The builder stage then reads the installed collection's dependencies with the context's own script.
    assert (
        "introspect.py introspect --write-bindep=/tmp/src/bindep.txt --write-pip=/tmp/src/requirements.txt"
        in containerfile
    )
    read = subprocess.run(
        [
            sys.executable,
            str(build / "scripts" / "introspect.py"),
            "introspect",
            str(into / "collections"),
            f"--write-bindep={tmp_path / 'bindep.txt'}",
            f"--write-pip={tmp_path / 'requirements.txt'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert read.returncode == 0, read.stdout + read.stderr
    assert "prometheus-client" in _names((tmp_path / "requirements.txt").read_text().splitlines())
    assert "openssh-client [platform:dpkg]" in (tmp_path / "bindep.txt").read_text()
