"""What Ansible lists of the engine's registry is generated from it (`make generate`, tools/generate.py) and current:
a run tier, a benchmark or a depth added to src/gpufleet/base/registry.py reaches the role's argument specs with no hand
edit, and a hand edit of a generated option is undone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "roles" / "validate_node" / "meta" / "argument_specs.yml"


def generate(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "generate.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_the_generated_files_are_current():
    done = generate(ROOT, "--check")
    assert done.returncode == 0, done.stderr


def test_a_tier_added_to_the_registry_reaches_the_specs_and_a_stale_file_is_named(tmp_path):
    copy = tmp_path / "repo"
    for part in ("src", "tools", "roles"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
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
