"""The reports as an operator opens them: a fleet of 1,000 synthetic nodes read back as data, then every report of
tests/report_runs.py (a pass, a slowed soak, four GPUs, two disturbed soaks, a confirmed hardware failure, an
environment failure, the fleet) opened in headless Chromium (tests/chromium.py) in windows 800 and 1,400 pixels wide.

A page fails when it is wider than the window (it scrolls sideways, or any element reaches past its right edge), when
the cause of a node not accepted is not within the first screen (the node table's sentence, 900 pixels down at most),
when a status or action drawn has no style of its own, when one of its SVG pictures does not parse (in Python, and
again as XML in the browser) or draws nothing, when the browser logs an error, when it asks for anything but its own
file (no network: the report opens on an air-gapped laptop), when a result's limit is missing, and, for the fleet of
1,000 nodes, when it is 5 MB or more or the browser does not lay out every node, the outliers named in their pictures
and the fleet view's list. How long the browser takes to draw that page is measured by tools/report_render_time.py,
not here (docs/results/2026-11-27-cpu-report-render/).

Screenshots are kept under the test run's temporary folder (report-screenshots*/): each page whole and each picture
alone. With GPUFLEET_REPORT_SCREENSHOTS=<folder> the pictures are also written there: docs/reports.md shows them,
made with `GPUFLEET_REPORT_SCREENSHOTS=docs/images/report-pictures .venv/bin/python -m pytest <this file>`.
Without chromium the browser tests skip, saying so (scripts/system-deps.sh installs it with the test packages).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import chromium
import report_runs as runs
from gpufleet.report import formatting, html_style

pytestmark = pytest.mark.slow  # chromium, and a report of 1000 nodes

WIDTH = 1400
WIDTHS = (800, 1400)  # a laptop's half screen, a desktop's window
FIRST_SCREEN = 900  # pixels: what a window shows before any scrolling
SIZE_MAX = 5 * 1024 * 1024
SHOTS_ENV = "GPUFLEET_REPORT_SCREENSHOTS"
NODES = 1000
BINARY = chromium.find()
needs_chromium = pytest.mark.skipif(
    BINARY is None,
    reason="chromium is not installed (Debian's package chromium): scripts/system-deps.sh test installs it, "
    "as `make test SYSTEM_DEPS=install` does",
)
BUILDERS = {
    "one-gpu": runs.one_gpu,
    "one-gpu-soak": runs.one_gpu_soak,
    "four-gpus": runs.four_gpus,
    "disturbed-soak": runs.disturbed_soak,
    "host-soak": runs.host_soak,
    "hardware-failure": runs.hardware_failure,
    "environment-failure": runs.environment_failure,
    "fleet": lambda reports: runs.fleet(reports, NODES),
}
# Each picture's screenshot: (page, window width, CSS selector of what to capture or None for the first screen, file).
PICTURES = (
    ("hardware-failure", 800, None, "first-screen-800.png"),
    ("fleet", 1400, None, "first-screen-fleet.png"),
    ("host-soak", 1400, "div.soak", "soak-timeline.png"),
    ("hardware-failure", 1400, "details:has(> table.gpus)", "gpu-inventory.png"),
    ("four-gpus", 1400, "div.panels", "gpu-bars.png"),
    ("four-gpus", 1400, "figure:has(svg.busbw)", "nccl-baseline.png"),
    ("fleet", 1400, "figure:has(svg.distribution)", "fleet-distribution.png"),
    ("four-gpus", 1400, "tr:has(> td code.lim-check)", "decided-limit.png"),
)


def svg_sources(html: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", html, re.S)


def svgs(run: Path, kind: str) -> list[ET.Element]:
    parsed = [ET.fromstring(s) for s in svg_sources((run / "report.html").read_text())]
    return [s for s in parsed if kind in s.get("class", "").split()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """page name -> its run folder, each built once, when a test first asks for it."""
    reports, done = tmp_path_factory.mktemp("reports"), {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = BUILDERS[name](reports / name)
        return done[name]

    return get


@pytest.fixture(scope="module")
def fleet(built) -> Path:
    return built("fleet")


# ---------------------------------------------------------------- the fleet of 1,000 nodes, as data


def test_the_fleet_is_a_distribution_per_figure_with_its_outliers_named(fleet):
    dists = {s.get("data-column"): s for s in svgs(fleet, "distribution")}
    assert set(dists) == {"matmul", "hbm", "busbw"}
    for column, d in dists.items():
        assert d.get("data-nodes") == str(NODES)
        binned = sum(int(r.get("data-count")) for r in d.findall("rect[@class='bin']"))
        assert binned + len(d.findall("circle[@class='beyond']")) == NODES, column  # every node, once
        assert len(d.findall("rect")) <= 40  # bins, not 1,000 bars
    for column, host in (("matmul", runs.SLOW_GPU), ("hbm", runs.SLOW_HBM)):
        (outlier,) = dists[column].findall("g[@class='outlier']")
        assert outlier.get("data-host") == host and outlier.get("data-status") != "pass"  # as the fleet layer said
        assert outlier.find("text").text == host  # named in the picture
    # Every node ran the same recorded NCCL rows: no node is the slowest, and none is named so.
    assert dists["busbw"].findall("g[@class='outlier']") == []
    # The histogram's count axis from zero and its medians, labelled with their figures.
    for d in dists.values():
        counts = [int(t.text) for t in d.findall("text[@class='count']")]
        assert 0 in counts and max(int(r.get("data-count")) for r in d.findall("rect[@class='bin']")) in counts
        (median,) = d.findall("text[@class='fleet-median-label']")
        assert median.text.startswith("fleet median ")
    html = (fleet / "report.html").read_text()
    assert len(html.encode()) < SIZE_MAX, f"report.html of {NODES} nodes is {len(html.encode()):,} bytes"
    # The fleet view lists the nodes with a figure that did not pass; the page details the nodes not accepted,
    # warned or with information (a figure past a limit once only), and gives each other node one line.
    listed = re.findall(r'<tr><td><a href="#node-\d+-(n\d+)">', html[html.index('<table class="fleet">') :])
    assert sorted(listed) == [runs.SLOW_GPU, runs.SLOW_HBM]
    detailed = re.findall(r'<section id="node-\d+-(n\d+)">', html)
    assert sorted(detailed) == sorted([runs.SLOW_GPU, runs.SLOW_HBM, runs.ECC, runs.UNCONFIRMED, runs.CONFIRMED])
    assert len(re.findall(r'<section id="node-\d+-n\d+" class="brief">', html)) == NODES - len(detailed)
    md = (fleet / "report.md").read_text()
    assert re.search(
        rf"\| bf16 matmul, slowest GPU \(TFLOPS\) \| {NODES} \| [\d.,]+ \| .* \| {runs.SLOW_GPU} [\d.,]+ \(\w+\) \|",
        md,
    )
    assert re.search(r"\| all_reduce busbw, largest sizes \(GB/s\) \| .* \| none; every node reads [\d.,]+ \|", md)


def test_the_demos_outliers_are_judged_and_not_accepted(fleet):
    """The demo's figures are judged by the node's own judge after they are scaled: the slow GPU and the slow HBM
    fail their floors (measured twice, confirmed), no figure under its floor reads pass, and neither node is
    accepted."""
    nodes = runs.report_json(fleet)["nodes"]
    for host, check in ((runs.SLOW_GPU, "matmul_bf16"), (runs.SLOW_HBM, "hbm_bandwidth")):
        res = next(r for r in nodes[host]["results"] if r.get("group") == "benchmark" and r["check"] == check)
        assert (res["status"], res["trust"]) == ("fail", "confirmed") and nodes[host]["verdict"] == "fail"
    for host, node in nodes.items():
        for res in node["results"]:
            floor = (res.get("threshold") or {}).get("min") if isinstance(res.get("threshold"), dict) else None
            if res["status"] == "pass" and isinstance(floor, (int, float)) and isinstance(res.get("value"), float):
                assert res["value"] >= floor, (host, res["check"], res["value"], floor)


def test_the_drain_box_proposes_only_the_confirmed_failures(fleet):
    drain = (fleet / "drain.txt").read_text()
    # n0023's ECC error is read from the node: it stands; n0043's figure was measured again: confirmed
    for host in (runs.ECC, runs.CONFIRMED):
        assert f"NodeName={host} " in drain
    # n0031 failed on the same figure measured once (trust clean): named, not drained for
    assert f"NodeName={runs.UNCONFIRMED} " not in drain
    review = {r["host"]: r for r in runs.report_json(fleet)["fleet"]["drain_review"]}
    assert review[runs.UNCONFIRMED] == {
        "host": runs.UNCONFIRMED,
        "confirmed": [],
        "components": [],
        "unconfirmed": [{"check": "benchmark.matmul_fp8", "trust": "clean"}],
        "drain": None,
    }
    assert review[runs.ECC]["confirmed"] == ["gpu_health.ecc"] and review[runs.ECC]["drain"]
    assert review[runs.ECC]["components"][0].startswith("GPU 2 SN ")  # what the drain is about, for the desk
    assert review[runs.CONFIRMED]["confirmed"] == ["benchmark.matmul_fp8"] and review[runs.CONFIRMED]["drain"]
    html = (fleet / "report.html").read_text()
    box = html[html.index("<h3>Drain in Slurm</h3>") :]
    row = box[box.index(f"<td>{runs.UNCONFIRMED}</td>") :].split("</tr>")[0]
    assert "<td>none</td>" in row and "<code>benchmark.matmul_fp8</code> (clean)" in row
    assert "1 node(s) not proposed: a figure stands only once measured again" in box
    md = (fleet / "report.md").read_text()
    assert f"| {runs.UNCONFIRMED} | none | `benchmark.matmul_fp8` (clean) |" in md


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if BINARY is None:
        pytest.skip(needs_chromium.kwargs["reason"])
    b = chromium.Browser(BINARY, tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report-screenshots")
    print(f"report screenshots: {folder}")
    return folder


PAGE_CHECK = """(() => {
  const root = document.documentElement;
  const pictures = [...document.querySelectorAll('svg')].map(svg => {
    const xml = new DOMParser().parseFromString(new XMLSerializer().serializeToString(svg), 'image/svg+xml');
    const box = svg.getBoundingClientRect();
    return {kind: svg.getAttribute('class'), error: xml.querySelector('parsererror') ? xml.querySelector('parsererror').textContent : null,
            width: box.width, height: box.height};
  });
  // What can be laid out past the window's edges: a table that did not wrap (with all it holds), a picture that did
  // not scale, a label cut, a long name.
  const past = [...document.body.querySelectorAll('table, pre, figure, svg, svg text, img, code, h1, h2, p')].filter(el => {
    const box = el.getBoundingClientRect();
    return box.width > 0 && (box.right > root.clientWidth + 1 || box.left < -1);
  }).slice(0, 5).map(el => el.tagName + '.' + el.getAttribute('class') + ' ' + (el.textContent || '').slice(0, 40) + ' ' + Math.round(el.getBoundingClientRect().right));
  // Each status and action class drawn, and whether the style sheet has a rule for it.
  const rules = [...document.styleSheets].flatMap(sheet => [...sheet.cssRules].map(r => r.selectorText || ''));
  const used = new Set([...document.querySelectorAll('[class]')].flatMap(el =>
    (el.getAttribute('class') || '').split(/\\s+/).filter(c => /^[sba]-/.test(c))));
  // The cause of each node not accepted, and how far down the page it ends.
  const causes = [...document.querySelectorAll('table.nodes tr.s-fail td.cause[data-cause-of]')]
    .filter(td => td.closest('section') === null)
    .map(td => ({host: td.getAttribute('data-cause-of'), bottom: td.firstElementChild.getBoundingClientRect().bottom + scrollY,
                 text: td.firstElementChild.textContent}));
  return {scroll_width: root.scrollWidth, client_width: root.clientWidth, pictures, past, used: [...used], rules, causes,
          limits: document.querySelectorAll('.lim').length, height: root.scrollHeight};
})()"""
FLEET_DRAWN = """(() => {
  const drawn = el => { const box = el.getBoundingClientRect(); return box.width > 0 && box.height > 0; };
  const host = section => section.id.replace(/^node-\\d+-/, '');
  return {
    brief: [...document.querySelectorAll('section.brief')].filter(drawn).map(host),
    detailed: [...document.querySelectorAll('section[id^="node-"]:not(.brief)')].filter(drawn).map(host),
    outliers: [...document.querySelectorAll('svg.distribution g.outlier')].filter(drawn)
      .map(g => [g.closest('svg').getAttribute('data-column'), g.querySelector('text').textContent]),
    listed: [...document.querySelectorAll('table.fleet a[href^="#node-"]')].filter(drawn).map(a => a.textContent),
  };
})()"""


@needs_chromium
@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("width", WIDTHS)
def test_the_report_opens_in_chromium(name, width, built, browser, shots):
    run = built(name)
    page = run / "report.html"
    browser.open(page, width, FIRST_SCREEN)
    seen = browser.evaluate(PAGE_CHECK)
    browser.screenshot(
        shots / f"{name}-{width}.png", {"x": 0, "y": 0, "width": width, "height": min(seen["height"], 16000)}
    )
    assert seen["scroll_width"] <= seen["client_width"] and seen["past"] == [], (
        f"{name}: {seen['scroll_width']} px wide in a {width} px window; past its edge: {seen['past']}"
    )
    assert browser.console_errors == [], name
    assert [u for u in browser.requests if not u.startswith("file:")] == [], f"{name} asked for more than its file"
    sources = svg_sources(page.read_text())
    for source in sources:
        ET.fromstring(source)  # each picture is well-formed XML
    assert len(seen["pictures"]) == len(sources) > 0
    for picture in seen["pictures"]:
        assert picture["error"] is None, f"{name}: {picture['kind']}: {picture['error']}"
        assert picture["width"] > 0 and picture["height"] > 0, f"{name}: {picture['kind']} draws nothing"
    unstyled = [c for c in seen["used"] if not any(re.search(rf"\.{re.escape(c)}(?![\w-])", r) for r in seen["rules"])]
    assert unstyled == [], f"{name}: drawn without a style of its own: {unstyled}"
    nodes = runs.report_json(run)["nodes"]
    not_accepted = sorted(h for h, n in nodes.items() if n["verdict"] == "fail")
    assert sorted(c["host"] for c in seen["causes"]) == not_accepted, name
    for c in seen["causes"]:  # the sentence is there, and ends within the first screen
        assert c["text"].strip() and c["bottom"] <= FIRST_SCREEN, (name, width, c)
    if name != "fleet":  # one node, detailed: every result held against a limit shows the one that decided it
        results = nodes["localhost"]["results"]
        assert seen["limits"] == sum(1 for r in results if formatting.decided_limit(r)) > 0


@needs_chromium
def test_every_status_has_a_look_of_its_own(built, browser):
    """Each status a result, a comparison or a picture can show (the schema's and `inconclusive`) and each action is
    styled, and no two statuses look alike: a badge of each, drawn, has a colour of its own."""
    browser.open(built("one-gpu") / "report.html", WIDTH)
    statuses = [*html_style.STATUS_COLOURS]
    colours = browser.evaluate(
        "(() => { const out = {}; for (const s of "
        + json.dumps(statuses)
        + ") { const b = document.createElement('span');"
        " b.className = 'badge b-' + s; document.body.appendChild(b); out[s] = getComputedStyle(b).backgroundImage + "
        "getComputedStyle(b).backgroundColor; b.remove(); } return out; })()"
    )
    assert set(colours) == set(statuses) and len(set(colours.values())) == len(statuses), colours


@needs_chromium
def test_a_fleet_of_1000_nodes_is_laid_out_whole(fleet, browser):
    """Every node of the 1,000 drawn on the page: the five with something to say detailed, each other one a line; the
    outliers named in their pictures; the fleet view listing the nodes with a figure that did not pass."""
    browser.open(fleet / "report.html", WIDTH)
    seen = browser.evaluate(FLEET_DRAWN)
    detailed = sorted([runs.SLOW_GPU, runs.SLOW_HBM, runs.ECC, runs.UNCONFIRMED, runs.CONFIRMED])
    assert sorted(seen["detailed"]) == detailed
    assert sorted(seen["brief"]) == [f"n{i:04d}" for i in range(NODES) if f"n{i:04d}" not in detailed]
    for outlier in (["matmul", runs.SLOW_GPU], ["hbm", runs.SLOW_HBM]):
        assert outlier in seen["outliers"], seen["outliers"]
    assert sorted(seen["listed"]) == [runs.SLOW_GPU, runs.SLOW_HBM]


@needs_chromium
def test_a_screenshot_of_each_picture(built, browser, shots):
    """One screenshot of each picture, of a first screen and of a result's limit, kept with the others (and written
    where GPUFLEET_REPORT_SCREENSHOTS says: docs/reports.md shows them)."""
    into = os.environ.get(SHOTS_ENV)
    for name, width, selector, file in PICTURES:
        browser.open(built(name) / "report.html", width, FIRST_SCREEN)
        if file == "decided-limit.png":  # the row of fleet.node_vs_baseline, its whole threshold unfolded
            browser.evaluate(
                "(() => { const code = [...document.querySelectorAll('td code')].find(c => c.textContent === "
                "'fleet.node_vs_baseline'); code.classList.add('lim-check'); "
                "for (let d = code.closest('details'); d; d = d.parentElement.closest('details')) d.open = true; "
                "code.closest('tr').querySelectorAll('details').forEach(d => d.open = true); })()"
            )
        if selector is None:
            box = {"x": 0, "y": 0, "width": width, "height": FIRST_SCREEN}
        else:
            box = browser.evaluate(  # a few pixels around it: a caption's glyphs may end past its laid-out box
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(); "
                "return {x: Math.max(0, r.left + scrollX - 4), y: Math.max(0, r.top + scrollY - 4), "
                "width: r.width + 20, height: r.height + 8}; })()"
            )
        assert box["width"] > 0 and box["height"] > 0, (name, selector)
        shot = browser.screenshot(shots / file, box)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if into:
            Path(into).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, Path(into) / file)
