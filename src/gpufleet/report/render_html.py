"""report.html: one self-contained page (inline CSS and SVG, no script, no external asset), for any window from
800 px up.

The first screen decides: a node table (worst first) gives each node its verdict, its cause in one sentence (the
figure, how far from what, which GPU and serial or which process, the class, whether it was confirmed) with the
recommended action, and every figure of it past a limit, whatever its kind. Then the fleet (each figure's
distribution, the fleet view, the drain box), the software and firmware, and one section per node (html_node.py).
Every piece of text goes through html.escape.
"""

from __future__ import annotations

import re

from gpufleet.base.registry import registers
from gpufleet.base import schema
from gpufleet.comparisons import figure_text
from gpufleet.report import chart_data, html_node, svg_fleet
from gpufleet.report.drain import NOT_CONFIRMED
from gpufleet.report.formatting import (
    STATUS_ORDER,
    VERSIONS_HEAD,
    VERSIONS_TITLE,
    fleet_cell_parts,
    fleet_columns,
    fleet_line,
    fleet_note,
    fleet_view_rows,
    kept_locks,
    left_out_text,
    versions_note,
    versions_rows,
)
from gpufleet.report.html_parts import badge, cause_cells, esc
from gpufleet.report.html_style import CSS


def _anchor(host: str, i: int) -> str:
    return f"node-{i}-" + re.sub(r"[^A-Za-z0-9_-]", "_", host)


def _distributions(report: dict) -> list[str]:
    out = []
    for d in chart_data.fleet_distributions(report):
        named = ", ".join(f"{o['host']} {figure_text(o['value'])}" for o in d["outliers"][: chart_data.OUTLIERS_NAMED])
        more = len(d["outliers"]) - chart_data.OUTLIERS_NAMED
        if d["alike"] and not d["outliers"]:
            who = f"every node reads {figure_text(d['min'])}: none is slower than another"
        elif d["outliers"][0]["status"] != schema.PASS:
            who = f"outliers (the fleet layer did not pass them): {named}" + (f" and {more} more" if more > 0 else "")
        else:
            who = f"none judged an outlier; the slowest: {named}"
        caption = (
            f"{d['title']} ({d['unit']}) over {d['n']} nodes: a histogram of where the middle of the fleet lies "
            f"(nodes per bin), quartiles as a box, the medians labelled; beyond the axis breaks (//), the nodes far "
            f"from the rest; {who}"
        )
        out.append(f"<figure>{svg_fleet.distribution_svg(d)}<figcaption>{esc(caption)}</figcaption></figure>")
    return out


def _fleet_cell(cell: dict | None, top: float) -> str:
    """One figure of the fleet view: the figure, a bar scaled to the column's largest value with a black mark at
    the fleet median and a purple one at the baseline, the figure against both; outliers coloured."""
    if not cell:
        return '<td class="fv"></td>'
    top = top or 1.0
    width = max(0.0, min(100.0, cell["value"] / top * 100))
    mark = ""
    if cell.get("fleet_median"):
        mark = f'<b style="left:{min(100.0, cell["fleet_median"] / top * 100):.1f}%" title="fleet median"></b>'
    base = cell.get("baseline") or cell.get("baseline_fleet_median")
    if base:
        mark += f'<b class="base" style="left:{min(100.0, base / top * 100):.1f}%" title="baseline"></b>'
    parts = fleet_cell_parts(cell)
    status = cell["status"]
    marked = f" {badge(status)}" if status != "pass" else ""
    return (
        f'<td class="fv s-{esc(status)}"><div class="v">{esc(parts[0])}{marked}</div>'
        f'<div class="bar s-{esc(status)}"><i style="width:{width:.1f}%"></i>{mark}</div>'
        + "".join(f'<div class="src">{esc(p)}</div>' for p in parts[1:])
        + "</td>"
    )


def _confirmed(row: dict) -> str:
    """Each confirmed cause with the component it is about (`GPU 3 SN ...`, `host data loader`)."""
    named = zip(row["confirmed"], row.get("components") or [None] * len(row["confirmed"]))
    return ", ".join(f"<code>{esc(c)}</code>" + (f" ({esc(w)})" if w and w != c else "") for c, w in named)


def _drain_box(fleet: dict) -> list[str]:
    """Which failures of each node not accepted were confirmed, and the drain lines of those with one."""
    review, drain = fleet.get("drain_review") or [], fleet.get("drain") or []
    out = ["<h3>Drain in Slurm</h3>"]
    if not review:
        return out + ["<p>Every node accepted: none to drain.</p>"]
    out.append(
        '<table class="drain-review"><thead><tr><th>node</th><th>confirmed failures: drained for</th>'
        "<th>not confirmed: not drained for</th></tr></thead><tbody>"
    )
    for row in review:
        unconfirmed = ", ".join(f"<code>{esc(u['check'])}</code> ({esc(u['trust'])})" for u in row["unconfirmed"])
        out.append(
            f'<tr class="{"s-fail" if row["drain"] else "s-warn"}"><td>{esc(row["host"])}</td>'
            f"<td>{_confirmed(row) or 'none'}</td><td>{unconfirmed}</td></tr>"
        )
    out.append("</tbody></table>")
    if drain:
        out.append(f"<p>{len(drain)} node(s) with a confirmed failure (also in <code>drain.txt</code>):</p>")
        out.append(f'<pre class="drain">{esc(chr(10).join(drain))}</pre>')
    if len(drain) < len(review):
        out.append(f'<p class="meta">{len(review) - len(drain)} node(s) {esc(NOT_CONFIRMED)}.</p>')
    return out


def _fleet_section(report: dict, anchors: dict[str, str]) -> str:
    """The fleet: each figure's distribution over the nodes with its outliers named, the fleet view (every node
    of a fleet up to FLEET_ROWS_MAX, else the nodes with a figure that did not pass), then the drain box."""
    fleet = report.get("fleet")
    if not fleet:
        return ""
    out = ["<h2>Fleet</h2>", f'<p class="meta">{esc(fleet_note(report))}</p>']  # the store and baseline used
    out += _distributions(report)
    columns = fleet_columns(report)
    rows, left_out = fleet_view_rows(report)
    if columns:
        if left_out:
            out.append(f'<p class="meta">{esc(left_out_text(left_out, len(rows)))}</p>')
        head = "".join(f"<th>{esc(title)} ({esc(unit or '')})</th>" for _, title, unit in columns)
        out.append(f'<table class="fleet"><thead><tr><th>node</th>{head}</tr></thead><tbody>')
        everyone = fleet.get("view") or []
        tops = {
            col: max((r["columns"][col]["value"] for r in everyone if r["columns"].get(col)), default=0)
            for col, _, _ in columns
        }
        for row in rows:
            cells = "".join(_fleet_cell(row["columns"].get(col), tops[col]) for col, _, _ in columns)
            link = anchors.get(row["host"])
            name = f'<a href="#{link}">{esc(row["host"])}</a>' if link else esc(row["host"])
            out.append(f"<tr><td>{name}</td>{cells}</tr>")
        out.append("</tbody></table>")
    out += _drain_box(fleet)
    return "\n".join(out)


def _versions_section(report: dict) -> str:
    """The software and firmware of every node, one row per component, differences first and marked."""
    rows = versions_rows(report)
    if not rows:
        return ""
    out = [
        f"<h2>{esc(VERSIONS_TITLE)}</h2>",
        f'<p class="meta">{esc(versions_note(report))}</p>',
        '<table class="versions"><thead><tr>'
        + "".join(f"<th>{esc(h)}</th>" for h in VERSIONS_HEAD)
        + "</tr></thead><tbody>",
    ]
    for row in rows:
        marked = ' class="s-warn"' if row["differs"] else ""
        out.append(f"<tr{marked}>" + "".join(f"<td>{esc(c)}</td>" for c in row["cells"]) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


# Past this many nodes the page details only the nodes not accepted or warned, at most this many: a table of
# thousands of rows takes a browser seconds to lay out.
NODES_DETAILED = 64


def _detailed(nodes: list[dict]) -> set[str]:
    """The nodes the page details (a row in the node table, a whole section): every node of a fleet up to
    NODES_DETAILED nodes; past that, the first NODES_DETAILED nodes not accepted, warned or with information (a
    figure past a limit once only, say), worst first."""
    if len(nodes) <= NODES_DETAILED:
        return {n["host"] for n in nodes}
    return set([n["host"] for n in nodes if n["verdict"] != schema.PASS or n["counts"][schema.INFO]][:NODES_DETAILED])


def _node_row(node: dict, anchor: str) -> str:
    counts = "".join(
        f'<div class="{"zero" if not node["counts"][s] else ""}">{node["counts"][s]} {esc(s)}</div>'
        for s in STATUS_ORDER
        if node["counts"][s]
    )
    return (
        f'<tr class="s-{esc(node["verdict"])}" data-host="{esc(node["host"])}"><td><a href="#{anchor}">'
        f"{esc(node['host'])}</a><div>{badge(node['verdict'])}</div></td>{cause_cells(node)}"
        f'<td class="counts">{counts}<div class="src">{esc(node.get("profile") or "")}</div></td></tr>'
    )


NODES_HEAD = (
    '<table class="nodes"><thead><tr><th>node</th><th>why, and what to do</th><th>figures past a limit</th>'
    "<th>results</th></tr></thead><tbody>"
)


@registers("output.html", "render")
def render(report: dict) -> str:
    nodes = list(report["nodes"].values())
    anchors = [_anchor(n["host"], i) for i, n in enumerate(nodes)]
    detailed = _detailed(nodes)
    rows = [_node_row(n, a) for n, a in zip(nodes, anchors) if n["host"] in detailed]
    sections = [
        html_node.section(n, a, report) if n["host"] in detailed else html_node.brief(n, a)
        for n, a in zip(nodes, anchors)
    ]
    scale = (
        f'<p class="meta">{len(nodes)} nodes: this page details the {len(detailed)} not accepted, warned or with '
        f"information (at most {NODES_DETAILED}, worst first); every other node has one line at the end of the page, "
        "and every node its results, per-GPU figures and NCCL curves whole in report.md and report.json.</p>"
        if len(detailed) < len(nodes)
        else ""
    )
    title = f"gpufleet report {report['run_id']}: {report['verdict'].upper()}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>gpufleet acceptance report {badge(report['verdict'])}</h1>",
            f'<p class="meta">run <code>{esc(report["run_id"])}</code>: {esc(fleet_line(report))}. '
            f"Generated {esc(report['generated'])} from <code>{esc(report['run_dir'])}/hosts</code>; "
            "every result is kept unchanged in report.json.</p>",
            "<h2>Nodes</h2>",
            NODES_HEAD,
            *rows,
            "</tbody></table>",
            scale,
            *(
                [
                    f'<p class="meta">Locks not given back (the next run takes them over or waits out the lease): '
                    f"{esc('; '.join(kept_locks(report)))}.</p>"
                ]
                if kept_locks(report)
                else []
            ),
            _fleet_section(report, {n["host"]: a for n, a in zip(nodes, anchors)}),
            _versions_section(report),
            *sections,
            "</body></html>",
            "",
        ]
    )
