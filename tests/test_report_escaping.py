"""Every string of a host document is untrusted: poison them all, build every report, and find no live tag in
report.md or report.html, no broken Markdown table row, and a junit.xml that JUnit readers parse (one package
level per node whatever the node's name)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from junitparser import JUnitXml
from markdown_it import MarkdownIt

from gpufleet import report
from gpufleet.report import render_junit

from test_fleet_synthetic import ecc_failure, gpus_of, node_doc, write_run
from test_report import failing_results, host_doc

# A tag with a handler, a backtick run longer than a code fence, pipes, a line break that would end a table row,
# an entity and a backslash that would escape the escaping.
POISON = "<img src=x onerror=alert(1)>``` `|x| \n| <script>alert(2)</script> &lt;b&gt; \\"


def poisoned(value, keep: tuple[str, ...] = (), key: str | None = None):
    """value with POISON appended to every string in it (dict keys stay, and so do the fields named in keep)."""
    if isinstance(value, str):
        return value if key in keep else value + POISON
    if isinstance(value, dict):
        return {k: poisoned(v, keep, k) for k, v in value.items()}
    if isinstance(value, list):
        return [poisoned(v, keep, key) for v in value]
    return value


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.handlers = set(), []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.handlers += [name for name, _ in attrs if name.startswith("on")]


def _table_rows_hold(md: str) -> list[str]:
    """Lines of a Markdown table whose count of cell separators (unescaped pipes) differs from its header's."""
    broken, header = [], None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        pipes = len(re.findall(r"(?<!\\)\|", line.replace("\\\\", "")))
        if header is None:
            header = pipes
        elif pipes != header:
            broken.append(line)
    return broken


@pytest.fixture(params=["every string", "every string but the status"])
def run(request, tmp_path):
    keep = () if request.param == "every string" else ("status",)
    gpus = gpus_of(1)
    docs = {
        "n0.example.com": node_doc("n0.example.com", 0, read_at=("2026-11-21T10:00:00Z", "2026-11-21T10:15:00Z")),
        "n1.example.com": node_doc("n1.example.com", 1, extra=[ecc_failure(gpus[2])]),
        "n2": host_doc("n2", failing_results()),
    }
    for res in docs["n1.example.com"]["results"]:
        res["trust"] = "disturbed"  # poisoned below, like the class every result carries
    docs = {host: poisoned(doc, keep) for host, doc in docs.items()}
    run_dir = write_run(tmp_path, "r1", docs, started="2026-11-21T10:00:00Z")
    (run_dir / "peers").mkdir()
    (run_dir / "peers" / "p0.json").write_text(json.dumps(poisoned(node_doc("p0", 3), keep)))
    report.build(run_dir, use_store=False)
    return run_dir


def test_markdown_has_no_live_tag_and_no_broken_row(run):
    md = (run / "report.md").read_text()
    assert "onerror" in md  # the poison is there, as text
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    live = [t.content for t in tokens if t.type == "html_block"]
    live += [c.content for t in tokens for c in t.children or [] if c.type == "html_inline"]
    assert not live
    assert not _table_rows_hold(md)
    assert "\n| <script>" not in md  # the line break never reached the file


def test_html_has_no_live_tag(run):
    page = (run / "report.html").read_text()
    assert "onerror" in page
    parser = _Tags()
    parser.feed(page)
    assert not parser.tags & {"img", "script"} and not parser.handlers


def test_junit_parses_and_keeps_one_package_per_node(run):
    xml = JUnitXml.fromfile(str(run / "junit.xml"))
    cases = [(suite.name, case.classname, case.name) for suite in xml for case in suite]
    assert cases and {s for s, _, _ in cases} >= {"n0.example.com", "n1.example.com", "n2"}
    for suite, classname, name in cases:
        assert (
            classname == render_junit.classname(suite) and classname.count(".") == 1
        )  # package gpufleet, class: the node
    root = ET.parse(run / "junit.xml").getroot()
    assert not root.findall(".//img") and not root.findall(".//script")
    assert any(POISON.split("\n")[0] in (f.get("message") or "") for f in [*root.iter("failure"), *root.iter("error")])


def test_classname_of_a_dotted_host():
    assert render_junit.classname("gpu01.dc1.example.com") == "gpufleet.gpu01_dc1_example_com"
    assert render_junit.classname("node1") == "gpufleet.node1"


def test_code_span_holds_backticks_and_pipes():
    from gpufleet.report.md_pictures import code as _code

    assert _code("a`b") == "``a`b``"
    assert _code("`x`") == "`` `x` ``"
    assert _code("a|b") == "`a\\|b`"
    for text in ("``` x", "y ````", "plain"):
        tokens = MarkdownIt("commonmark").parseInline(_code(text))[0].children
        assert [t.type for t in tokens] == ["code_inline"] and tokens[0].content == text


def test_a_threshold_source_reaches_report_md_as_text(tmp_path):
    """A profile's `source` is free text: a link (javascript: too), an image or emphasis in it stays text."""
    source = "see [the guide](javascript:alert(1)) ![x](http://e/x.png) and *not* _this_ ~~either~~"
    results = failing_results()
    for res in results:
        if res.get("threshold"):
            res["threshold"]["source"] = source
    run_dir = write_run(tmp_path, "r1", {"n0": host_doc("n0", results)}, started="2026-11-21T10:00:00Z")
    report.build(run_dir, use_store=False)
    md = (run_dir / "report.md").read_text()
    line = next(line for line in md.splitlines() if line.startswith("- limit:") and "javascript" in line)
    tokens = MarkdownIt("commonmark").enable("strikethrough").parseInline(line)[0].children
    assert [t.type for t in tokens] == ["text"], [t.type for t in tokens]
    assert source in tokens[0].content
