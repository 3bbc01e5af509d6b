"""The collection keeps Ansible's conventions: the version written once (galaxy.yml) and the same everywhere, the
Apache-2.0 licence in the repository and the built tarball, antsibull-changelog fragments under the sections of its
config, and the internal modules marked as such in `ansible-doc -l` with the public and internal lists of
docs/modules.md the same as the code's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

import tool_modules
from test_ansible_versions import claimed_minors
from test_readme import broken_links, links
from gpufleet import version

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
INTERNAL_NOTE = "Internal to gpufleet.cluster."


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(out)],
        cwd=out,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("gpufleet-cluster-*.tar.gz")
    return built


def galaxy() -> dict:
    return yaml.safe_load((REPO / "galaxy.yml").read_text())


@pytest.mark.slow
def test_the_version_is_written_once_and_is_the_same_everywhere(tarball, tmp_path):
    written = galaxy()["version"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert version.VERSION == written
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["version"] == written and tarball.name == f"gpufleet-cluster-{written}.tar.gz"
    # From MANIFEST.json where there is no galaxy.yml: the installed collection's src/.
    (tmp_path / "installed").mkdir()
    (tmp_path / "installed" / "MANIFEST.json").write_text(json.dumps(manifest))
    assert version.read(tmp_path / "installed") == written
    # Derived, not copied: the engine's package built from a galaxy.yml of another version takes that version.
    src = tmp_path / "checkout"
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    (src / "galaxy.yml").write_text((REPO / "galaxy.yml").read_text().replace(f"version: {written}", "version: 9.8.7"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheels"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [p.name.split("-")[1] for p in (tmp_path / "wheels").glob("gpufleet-*.whl")] == ["9.8.7"]


def test_the_engine_packed_for_the_nodes_carries_its_version(tmp_path):
    pack = REPO / "roles" / "python_env" / "files" / "pack_engine.py"
    subprocess.run(
        [sys.executable, str(pack), str(REPO), str(tmp_path / "engine.tar.gz")], check=True, capture_output=True
    )
    with tarfile.open(tmp_path / "engine.tar.gz") as tar:
        names = tar.getnames()
    assert "galaxy.yml" in names and "src/gpufleet/version.py" in names and "pyproject.toml" in names


@pytest.mark.slow
def test_the_licence_is_in_the_repository_and_the_tarball(tarball):
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert galaxy()["license"] == ["Apache-2.0"]
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    with tarfile.open(tarball) as tar:
        assert tar.extractfile("LICENSE").read().decode() == text
        names = set(tar.getnames())
    assert {"changelogs/config.yaml", "changelogs/changelog.yaml", "CHANGELOG.rst"} <= names


@pytest.mark.slow
def test_the_tarball_holds_the_collection_and_not_the_checkout(tarball):
    """build_ignore keeps the checkout's own files out: the sites' inventories (inventory/nebius's addresses), the
    tools (measurement harnesses, calibration) and the Makefile's scripts, the molecule scenarios, the Makefile, the
    venvs, the tests; what the collection runs is in."""
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    tops = {name.split("/", 1)[0] for name in names}
    for left_out in ("inventory", "scripts", "tools", "molecule", "Makefile", "ansible.cfg", "collections", "reports"):
        assert left_out not in tops, f"{left_out} is in the tarball"
    assert not [t for t in tops if t.startswith(".")], sorted(tops)  # no venv, no tool's folder
    assert not [n for n in names if "192.0.2." in n or n.startswith("docs/results")]
    # The tests stay in the checkout, each benchmark's own among them (src/gpufleet/benchmarks/<name>/test_*.py).
    assert not [n for n in names if n.rsplit("/", 1)[-1].startswith("test_") or n in ("conftest.py", "setup.py")]
    assert "src/gpufleet/benchmarks/sdc/sdc_measure.py" in names
    needed = {
        "MANIFEST.json",
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "meta/runtime.yml",
        "meta/execution-environment.yml",
        "requirements.txt",
        "bindep.txt",
        "validate.yml",
        "bringup.yml",
        "playbooks/validate.yml",
        "roles/validate_node/meta/argument_specs.yml",
        "plugins/action/run_inputs.py",
        "plugins/modules/node_stage.py",
        "src/gpufleet/commands/main.py",
        "files/profiles/generic.yml",
        "files/profiles/calibration/h100-sxm.yml",
        "roles/python_env/files/pack_engine.py",
        "tests/sanity/ignore-2.19.txt",
        "docs/sites.md",
    }
    assert needed <= names, sorted(needed - names)
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    # The project has no public address yet: none is made up (galaxy.yml says where they go).
    assert all(manifest[field] is None for field in ("repository", "issues", "homepage", "documentation")), manifest


@pytest.mark.slow
def test_the_docs_quote_the_tarballs_size_and_version(tarball):
    """docs/installed-collection.md gives the size, within 20%, and every tarball named carries galaxy.yml's version."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    quoted = re.search(r"\.tar\.gz`, about (\d+) kB", (REPO / "docs" / "installed-collection.md").read_text())
    assert quoted, "docs/installed-collection.md no longer quotes the tarball's size"
    size_kb = tarball.stat().st_size / 1000
    assert abs(int(quoted.group(1)) - size_kb) <= 0.2 * size_kb, f"quoted {quoted.group(1)} kB; built {size_kb:.0f} kB"
    for page in pages:
        for named in re.findall(r"gpufleet-cluster-([0-9][^\s`/]*?)\.tar\.gz", page.read_text()):
            assert named == galaxy()["version"], f"{page.name} names gpufleet-cluster-{named}.tar.gz"


@pytest.mark.slow
def test_every_relative_link_of_a_shipped_doc_resolves_inside_the_tarball(tarball, tmp_path):
    """What a user of the installed collection reads: every Markdown document the tarball holds, each of its links
    and pictures found there (the recorded runs of docs/results stay in the repository, named, not linked)."""
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    pages = sorted(tmp_path.rglob("*.md"))
    assert {"README.md", "docs/reports.md", "docs/measured.md"} <= {p.relative_to(tmp_path).as_posix() for p in pages}
    assert sum(len(links(p)) for p in pages) > 100  # the links are found: the docs have well over a hundred
    assert broken_links(pages, tmp_path) == []


def test_changelog_fragments_use_the_configs_sections():
    config = yaml.safe_load((REPO / "changelogs" / "config.yaml").read_text())
    sections = {name for name, _ in config["sections"]} | {
        config["prelude_section_name"],
        config["trivial_section_name"],
    }
    fragments = sorted((REPO / "changelogs" / "fragments").glob("*.y*ml"))
    assert fragments, "no changelog fragment: every change adds one (docs/releasing.md)"
    for path in fragments:
        doc = yaml.safe_load(path.read_text())
        assert isinstance(doc, dict) and set(doc) <= sections, (
            f"{path.name}: sections {sorted(doc)}; expected of {sorted(sections)}"
        )
        for section, lines in doc.items():
            if section != config["prelude_section_name"]:
                assert isinstance(lines, list) and all(isinstance(line, str) and line for line in lines), (
                    path.name,
                    section,
                )
    assert yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["ancestor"] is None


def modules_md_table(heading: str) -> set[str]:
    text = (REPO / "docs" / "modules.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `gpufleet\.cluster\.(\w+)` \|", section, flags=re.M))


def ansible_doc(*args: str) -> dict:
    done = subprocess.run(
        [str(BIN / "ansible-doc"), *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1", "HOME": str(REPO / ".ansible")},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_internal_modules_are_marked_and_the_docs_list_both_kinds():
    listed = {
        name.removeprefix("gpufleet.cluster."): text for name, text in ansible_doc("-l", "gpufleet.cluster").items()
    }
    internal = {name for name, text in listed.items() if text.startswith("Internal:")}
    assert internal and modules_md_table("Internal modules") == internal
    assert modules_md_table("Public modules") == set(listed) - internal
    docs = ansible_doc(*(f"gpufleet.cluster.{name}" for name in sorted(listed)))
    for name in listed:
        notes = " ".join(docs[f"gpufleet.cluster.{name}"]["doc"].get("notes") or [])
        assert (INTERNAL_NOTE in notes) == (name in internal), f"{name}: internal {name in internal}, notes: {notes}"


def test_the_sanity_ignore_files_are_written_from_what_the_collection_ships(tmp_path):
    """tests/sanity/ignore-*.txt are `make generate`'s (tools/sanity_ignores.py): a module or an engine file added
    or removed without it fails here, not first in the slow ansible-test run (tests/test_ansible_quality.py)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sanity_ignores.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    ignores = tool_modules.load("sanity_ignores")
    shipped = sorted(p.name for p in (REPO / "tests" / "sanity").glob("ignore-*.txt"))
    assert shipped == sorted(p.name for p in ignores.ignore_files(REPO)), shipped
    # One for every ansible-core minor the collection claims (meta/runtime.yml to pyproject.toml's bound).
    assert shipped == sorted(f"ignore-{minor}.txt" for minor in claimed_minors()), shipped
    # In a collection of one module and one engine file, written then given a second engine file: not current
    # until written again, and then with that file's two skips.
    for f in ("plugins/modules/one.py", "src/gpufleet/one.py", "tests/sanity/.keep"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    for path, text in ignores.ignore_files(tmp_path).items():
        path.write_text(text)
    assert ignores.stale(tmp_path) == []
    (tmp_path / "src" / "gpufleet" / "two.py").write_text("")
    assert len(ignores.stale(tmp_path)) == len(shipped)
    lines = next(iter(ignores.ignore_files(tmp_path).values())).splitlines()
    assert [line.split(" #")[0] for line in lines] == [
        "plugins/modules/one.py validate-modules:missing-gplv3-license",
        "src/gpufleet/one.py pep8!skip",
        "src/gpufleet/one.py pylint!skip",
        "src/gpufleet/two.py pep8!skip",
        "src/gpufleet/two.py pylint!skip",
    ]
