"""The README starts in one screen, and what it and docs/ say stays true: every link resolves, every variable they
name is one the code knows, the defaults and lists they give are the roles' (meta/argument_specs.yml,
defaults/main.yml). The tarball's size they quote: tests/test_collection_conventions.py, which builds it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import yaml
from markdown_it import MarkdownIt

from gpufleet.base import registry

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
FIRST_SCREEN_LINES = 60  # a terminal or a browser window, about
CODE = [
    *REPO.glob("*.yml"),
    *(REPO / "playbooks").glob("*.yml"),
    *(REPO / "roles").rglob("*.yml"),
    *(REPO / "roles").rglob("*.j2"),
    *(REPO / "plugins").rglob("*.py"),
    *(p for p in (REPO / "src").rglob("*.py") if not p.name.startswith("test_")),  # the engine, not its tests
    *(REPO / "files").rglob("*.yml"),
    *(REPO / "inventory").rglob("*.yml"),
]


def spec(entry: str = "main") -> dict:
    specs = yaml.safe_load((REPO / "roles" / "validate_node" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]
    return specs[entry]["options"]


def all_options() -> dict:
    specs = yaml.safe_load((REPO / "roles" / "validate_node" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]
    return {name: option for body in specs.values() for name, option in body["options"].items()}


def test_the_first_screen_is_enough_to_start():
    screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])
    for needed in (
        "Contents:",
        "## Quick start",
        "**The controller**",
        "python3",
        "**Each node**",
        "ssh",
        "become",
        "29511",
        "bringup.yml",
        "torch",
        "**The inventory**",
        "gpu_nodes",
        "make validate",
        "ansible-playbook validate.yml -i inventory/<site>",
        "make test",
        "report.html",
    ):
        assert needed in screen, f"{needed!r} is not in the README's first {FIRST_SCREEN_LINES} lines"


def test_the_contents_name_every_section_and_every_guide_is_linked():
    text = README.read_text()
    contents = text[text.index("Contents:") : text.index("\n\n", text.index("Contents:"))]
    for section in re.findall(r"^## (.+)$", text, flags=re.M):
        assert f"(#{slug(section)})" in contents, f"README section {section!r} is not in its contents"
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", text))
    assert {p.name for p in DOCS} <= linked, (
        f"guides the README does not link: {sorted({p.name for p in DOCS} - linked)}"
    )


def test_ci_finds_the_test_command():
    assert re.search(r"^make test\b", README.read_text(), flags=re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)}


def links(page: Path) -> list[str]:
    """Every link and picture of a Markdown page as markdown-it reads it (none inside code), and the href and src of
    its HTML."""
    found = []
    todo = MarkdownIt("commonmark").enable("table").parse(page.read_text())
    while todo:
        token = todo.pop(0)
        todo[:0] = token.children or []
        if token.type in ("link_open", "image"):
            found.append(token.attrGet("href") or token.attrGet("src"))
        elif token.type in ("html_inline", "html_block"):
            found += re.findall(r"""(?:href|src)=["']([^"']+)["']""", token.content)
    return found


def broken_links(pages: list[Path], root: Path) -> list[str]:
    """Each relative link of the pages that does not resolve to a file under root (a heading, for an anchor into
    Markdown), as "page: link"; web addresses are left alone."""
    broken = []
    for page in pages:
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a web address
            file, _, anchor = target.partition("#")
            path = (page.parent / unquote(file)).resolve() if file else page
            where = f"{page.relative_to(root)}: {target}"
            if not path.exists() or root.resolve() not in (path, *path.parents):
                broken.append(where)
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no such heading)")
    return broken


def test_every_link_resolves():
    assert not broken_links([README, *DOCS], REPO)


def test_every_variable_the_docs_name_is_the_codes():
    code = "\n".join(p.read_text() for p in CODE)
    for page in [README, *DOCS]:
        named = set(re.findall(r"\bgpufleet_[a-z0-9_]*[a-z0-9]\b", page.read_text()))
        unknown = sorted(n for n in named if not re.search(rf"\b{n}\b", code))
        assert not unknown, f"{page.name} names variables or series the code does not have: {unknown}"


def yaml_lines(page: Path):
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.splitlines():
            found = re.match(r"^\s*(gpufleet_\w+):\s*(\S.*?)\s*(?:#.*)?$", line)
            if found:
                yield found.group(1), found.group(2)


def written(default) -> str:
    """A spec's default as the docs' tables write it: a boolean as YAML does (`false`), anything else as it is."""
    return str(default).lower() if isinstance(default, bool) else str(default)


def test_the_defaults_the_docs_give_are_the_roles():
    defaults = yaml.safe_load((REPO / "roles" / "validate_node" / "defaults" / "main.yml").read_text())
    options = all_options()
    checked = 0
    for page in [README, *DOCS]:
        for name, value in yaml_lines(page):
            if name in defaults and name != "gpufleet_thresholds":  # the thresholds shown are overrides, by design
                assert yaml.safe_load(value) == defaults[name], (
                    f"{page.name}: {name}: {value}; the default is {defaults[name]!r}"
                )
                checked += 1
        for name, value in re.findall(r"^\| `(gpufleet_\w+)` \| `([^`]*)` \|", page.read_text(), flags=re.M):
            assert written(options[name].get("default")) == value, (
                f"{page.name}: {name} defaults to {value}; the spec says {options[name].get('default')!r}"
            )
            checked += 1
    assert checked > 15, checked


def test_the_lists_the_docs_give_are_the_specs():
    options = spec()
    inventory = (REPO / "docs" / "inventory.md").read_text()
    listed = re.search(r"benchmarks from ([a-z0-9_, ]+) and ([a-z0-9_]+),", inventory)
    assert listed, "docs/inventory.md no longer says which benchmarks gpufleet_benchmarks takes"
    assert set(listed.group(1).split(", ")) | {listed.group(2)} <= set(registry.benchmark_names(selectable=True))
    tiers = re.search(r"a depth of (\w+) or (\w+),", inventory).groups()
    assert set(tiers) == set(options["gpufleet_benchmark_depth"]["choices"])
    fleet = (REPO / "docs" / "fleet.md").read_text()
    table = fleet[fleet.index("**Tiers**") : fleet.index("**Resume.**")]
    assert re.findall(r"^\| `(\w+)`", table, flags=re.M) == options["gpufleet_tier"]["choices"]
    (acceptance,) = [line for line in table.splitlines() if line.startswith("| `acceptance`")]
    assert "training gate" not in acceptance or "off by default" in acceptance, acceptance
    assert "train_gpt2" not in registry.benchmark_names(default=True)
