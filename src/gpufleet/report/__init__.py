"""Aggregate per-host result documents into one fleet report.

    RUN_DIR/hosts/<host>.json   one host document per host (host_documents.check_host(),
                                or the playbook's minimal document for a host
                                that could not be checked)

build() reads them all and writes, beside hosts/:

    report.json   every result of every host, unchanged, with a verdict per node
    report.md     node table (failures first), the fleet view and drain lines, then each node's findings, each
                  picture of report.html as a small table
    report.html   the same, self-contained (inline CSS and SVG, no scripts, no external assets)
    junit.xml     one testsuite per node, one testcase per check
    fleet.json    the fleet layer's inputs per node (its metrics) and each fleet check's status, the medians
    prometheus/<host>.prom, drain.txt   (gpufleet.fleet.export)

The fleet layer (gpufleet.fleet) adds results of group `fleet` to every node whose document could be read,
and they count in its verdict; the run is indexed into the store (gpufleet.db beside the run folder).

Its parts: nodes.py reads the run's host documents into nodes, formatting.py holds what the renderers share
(among it decided_limit(): the limit that decided a result), cause.py what the first screen says of a node (its cause
in one sentence, its action, its figures past a limit), inventory.py each GPU's papers, chart_data.py and
soak_data.py what the pictures show (each GPU beside its siblings and its past, NCCL beside the baseline, the fleet's
distributions; the soak window by window), svg.py, svg_soak.py and svg_fleet.py draw them for report.html (report.md
writes them as tables: md_pictures.py), drain.py decides what the drain box proposes (only confirmed failures),
render_json.py, render_md.py, render_html.py (with html_parts.py, html_node.py and its style sheet html_style.py) and
render_junit.py write one rendering each (the output formats of registry.OUTPUTS, which pipeline.py loops over), and
pipeline.py builds the whole; build() and summary_text() are the package's entry points.
"""

from __future__ import annotations

from gpufleet.report.pipeline import build, summary_text

__all__ = ["build", "summary_text"]
