"""The reports as an operator opens them: a fleet of 1,000 synthetic nodes read back as data, then every report of
tests/report_runs.py (one GPU, four GPUs, a soak on one GPU, a disturbed soak, the fleet) opened in headless Chromium
(tests/chromium.py) in a window 1,400 pixels wide.

A page fails when it is wider than the window, when one of its SVG pictures does not parse (in Python, and again as
XML in the browser) or draws nothing, when the browser logs an error, when it asks for anything but its own file
(no network: the report opens on an air-gapped laptop), when a result's limit is missing, and, for the fleet of
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
from gpufleet.report import formatting

pytestmark = pytest.mark.slow  # chromium, and a report of 1000 nodes

WIDTH = 1400
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
    "fleet": lambda reports: runs.fleet(reports, NODES),
}
# Each picture's screenshot: (page, CSS selector of what to capture, file name).
PICTURES = (
    ("disturbed-soak", "div.soak", "soak-timeline.png"),
    ("four-gpus", "div.panels", "gpu-bars.png"),
    ("four-gpus", "figure:has(svg.busbw)", "nccl-baseline.png"),
    ("fleet", "figure:has(svg.distribution)", "fleet-distribution.png"),
    ("four-gpus", "tr:has(> td > code.lim-check)", "decided-limit.png"),
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
        "unconfirmed": [{"check": "benchmark.matmul_fp8", "trust": "clean"}],
        "drain": None,
    }
    assert review[runs.ECC]["confirmed"] == ["gpu_health.ecc"] and review[runs.ECC]["drain"]
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
  return {scroll_width: root.scrollWidth, client_width: root.clientWidth, pictures,
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
def test_the_report_opens_in_chromium(name, built, browser, shots):
    run = built(name)
    page = run / "report.html"
    browser.open(page, WIDTH)
    seen = browser.evaluate(PAGE_CHECK)
    browser.screenshot(shots / f"{name}.png", {"x": 0, "y": 0, "width": WIDTH, "height": min(seen["height"], 16000)})
    assert seen["scroll_width"] <= seen["client_width"], (
        f"{name}: {seen['scroll_width']} px wide in a {WIDTH} px window"
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
    if name != "fleet":  # one node, detailed: every result held against a limit shows the one that decided it
        results = runs.report_json(run)["nodes"]["localhost"]["results"]
        assert seen["limits"] == sum(1 for r in results if formatting.decided_limit(r)) > 0


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
    """One screenshot of each picture and of a result's limit, kept with the others (and written where
    GPUFLEET_REPORT_SCREENSHOTS says: docs/reports.md shows them)."""
    into = os.environ.get(SHOTS_ENV)
    for name, selector, file in PICTURES:
        browser.open(built(name) / "report.html", WIDTH)
        if file == "decided-limit.png":  # the row of fleet.node_vs_baseline, its whole threshold unfolded
            browser.evaluate(
                "(() => { const code = [...document.querySelectorAll('td > code')].find(c => c.textContent === "
                "'fleet.node_vs_baseline'); code.classList.add('lim-check'); "
                "for (let d = code.closest('details'); d; d = d.parentElement.closest('details')) d.open = true; "
                "code.closest('tr').querySelectorAll('details').forEach(d => d.open = true); })()"
            )
        box = browser.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(); "
            "return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; })()"
        )
        assert box["width"] > 0 and box["height"] > 0, (name, selector)
        shot = browser.screenshot(shots / file, box)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if into:
            Path(into).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, Path(into) / file)
