"""The guides in docs/ name files to change: each named file is there, so a guide cannot point at a file that
moved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDES = ["docs/adding-checks.md"]
NAMED = re.compile(r"`((?:src|tests|files|plugins|roles|playbooks|docs)/[^`\s<>]+)`")  # not a pattern (bench/<name>.py)


@pytest.mark.parametrize("guide", GUIDES)
def test_every_file_a_guide_names_is_there(guide):
    named = NAMED.findall((REPO / guide).read_text())
    assert len(named) > 10, named
    assert [p for p in named if not (REPO / p).exists()] == []


def test_architecture_links_the_guides():
    text = (REPO / "docs" / "architecture.md").read_text()
    assert all(Path(g).name in text for g in GUIDES)
