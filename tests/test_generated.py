"""What Ansible lists of the engine's registry, and docs/checks.md's tables of every check, are generated from it
(`make generate`, tools/generate.py) and current: a run tier, a benchmark or a depth added to
src/gpufleet/base/registry.py reaches the role's argument specs with no hand edit, a hand edit of a generated option is
undone, every check the engine declares is in docs/checks.md, and a check that says nothing of what it checks stops
the generator naming it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "roles" / "validate_node" / "meta" / "argument_specs.yml"
CHECKS_DOC = ROOT / "docs" / "checks.md"
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import registry  # noqa: E402


def generate(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "generate.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_the_generated_files_are_current():
    done = generate(ROOT, "--check")
    assert done.returncode == 0, done.stderr


def copied(tmp_path: Path) -> Path:
    """What the generator reads and writes, copied."""
    copy = tmp_path / "repo"
    for part in ("src", "tools", "roles"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (copy / "docs").mkdir()
    for doc in (CHECKS_DOC, ROOT / "docs" / "faults.md"):  # the docs `make generate` writes tables into
        shutil.copy(doc, copy / "docs" / doc.name)
    return copy


def test_every_check_the_engine_declares_is_in_checks_md():
    """Every check name the engine gives a class (registry.failure_classes, what the reports read) is a row of a
    table, under its group's heading; and the prose's anchors other docs link to are still there."""
    text = CHECKS_DOC.read_text()
    rows = re.findall(r"^\|(?: [^|]* \|)?? `([\w<>]+)\.([\w.]+)` \|", text, re.M)
    named = {check for _, check in rows} | {f"{g}.{c}" for g, c in rows}
    missing = [name for name in registry.failure_classes() if name not in named]
    assert not missing, f"not in docs/checks.md's tables: {missing}"
    groups = [g.name for g in registry.CHECK_GROUPS + registry.OTHER_GROUPS] + ["benchmark", "benchmark_multinode"]
    assert [g for g in groups if f"\n### {g}\n" not in text] == []
    for anchor in ("## Error counters as rates", "## The whole node", "## More on each check"):
        assert f"\n{anchor}\n" in text, anchor


def test_a_check_that_says_nothing_of_what_it_checks_stops_the_generator(tmp_path):
    copy = copied(tmp_path)
    registry_py = copy / "src" / "gpufleet" / "base" / "registry.py"
    text = registry_py.read_text()
    anchor = 'Check("returning_gpu", HARDWARE,'
    assert anchor in text
    registry_py.write_text(text.replace(anchor, 'Check("burn_marks", HARDWARE),\n        ' + anchor))
    done = generate(copy)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        'docs/checks.md: fleet.burn_marks says nothing of what it checks; give it text="..." in its Check of '
        "src/gpufleet/base/registry.py"
    ], done.stderr


def test_a_tier_added_to_the_registry_reaches_the_specs_and_a_stale_file_is_named(tmp_path):
    copy = copied(tmp_path)
    registry = copy / "src" / "gpufleet" / "base" / "registry.py"
    registry.write_text(
        registry.read_text().replace(
            'DEFAULT_RUN_TIER = "acceptance"',
            'RUN_TIERS += (RunTier("burn", "an hour of load", depth="thorough"),)\nDEFAULT_RUN_TIER = "acceptance"',
        )
    )
    stale = generate(copy, "--check")
    assert stale.returncode == 1 and "roles/validate_node/meta/argument_specs.yml" in stale.stderr, stale.stderr
    assert generate(copy).returncode == 0
    specs = yaml.safe_load((copy / SPECS.relative_to(ROOT)).read_text())["argument_specs"]
    tier = specs["main"]["options"]["gpufleet_tier"]
    assert tier["choices"] == ["smoke", "acceptance", "soak", "burn"], tier
    assert any(line.startswith("V(burn) an hour of load") for line in tier["description"]), tier
    # burn keeps thorough for itself: gpufleet_benchmark_depth may no longer name it
    assert specs["main"]["options"]["gpufleet_benchmark_depth"]["choices"] == ["quick"]
    assert generate(copy, "--check").returncode == 0
