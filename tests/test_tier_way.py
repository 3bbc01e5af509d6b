"""The run tier's way (docs/architecture.md, "The run tier's way"): the table names files that are there and on the
way, and `gpufleet fleet run --tier` refuses a tier the registry lacks before anything runs. The one check on the
controller and the node's words are held by tests/test_playbook_validate.py and tests/test_node_stage.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpufleet.base import registry

REPO = Path(__file__).resolve().parents[1]
GPUFLEET = Path(sys.executable).parent / "gpufleet"
# What a file on the way names: the tier, or what it becomes (the stage's benchmarks and their depth).
ON_THE_WAY = re.compile(r"tier|stage_plan|\bnames\b")


def way_text() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    return " ".join(text.split("## The run tier's way", 1)[1].split("\n## ", 1)[0].split())


def way_rows() -> list[tuple[int, str]]:
    section = (REPO / "docs" / "architecture.md").read_text().split("## The run tier's way", 1)[1].split("\n## ", 1)[0]
    return [(int(n), path) for n, path in re.findall(r"^\| (\d+) \| `([^`]+)` \|", section, flags=re.M)]


def test_the_tiers_way_in_the_architecture_names_files_on_the_way_in_order():
    rows = way_rows()
    assert [n for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    assert len(rows) <= 10, "the tier's way is held to 10 files at most"
    assert f"Before: {len(rows)} files on the way" in way_text(), "the section's prose counts the table's rows"
    for _, path in rows:
        source = (REPO / path).read_text()
        assert ON_THE_WAY.search(source), f"{path} names neither the tier nor what it becomes"
    assert [path for _, path in rows][:2] == ["src/gpufleet/commands/fleet.py", "src/gpufleet/runner/api.py"]


def test_fleet_run_refuses_a_tier_the_registry_lacks_before_anything_runs(tmp_path):
    reports = tmp_path / "reports"
    argv = [str(GPUFLEET), "fleet", "run", "-i", "inventory/local", "--tier", "bogus", "--reports-dir", str(reports)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "argument --tier: invalid choice: 'bogus'" in done.stderr, done.stderr
    assert all(tier in done.stderr for tier in registry.run_tier_names()), done.stderr
    assert not reports.exists()
