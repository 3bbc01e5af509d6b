"""report.html: one self-contained page (inline CSS, no scripts, no external assets).

A node table (failures first) links to one section per node: its findings
first, each with value, threshold, reason, remedy and its evidence (detail)
as a key/value table under a <details>, then its passes folded away, then
its NCCL bus bandwidth drawn as inline SVG charts (busbw against message
size, one line per collective). Every piece of text goes through html.escape.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

from gpufleet.causes import in_shared
from gpufleet.schema import size_text
from gpufleet.report.formatting import (
    INFO_TITLE,
    STATUS_ORDER,
    VERSIONS_HEAD,
    VERSIONS_TITLE,
    busbw_series,
    check_id,
    class_text,
    fleet_cell_parts,
    fleet_columns,
    fleet_line,
    fleet_note,
    findings,
    fmt_scalar,
    information,
    kept_locks,
    node_causes,
    node_versions_text,
    ordered_results,
    threshold_text,
    trust_text,
    value_text,
    versions_note,
    versions_rows,
)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#1f2328}
h1{font-size:1.5em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #d0d7de;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}td.zero{color:#8c959f}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}pre{margin:.2em 0;white-space:pre-wrap;font:12px ui-monospace,monospace}
.badge{display:inline-block;min-width:3.2em;text-align:center;padding:0 .4em;border-radius:3px;font-weight:600;font-size:12px;color:#fff}
.b-pass{background:#1a7f37}.b-warn{background:#9a6700}.b-fail{background:#cf222e}.b-error{background:#8250df}.b-skip{background:#6e7781}.b-info{background:#0969da}
tr.s-fail>td{background:#ffebe9}tr.s-error>td{background:#fbefff}tr.s-warn>td{background:#fff8c5}tr.s-skip>td{background:#f6f8fa}
.remedy{margin-top:.3em}.remedy b{color:#0969da}.src{color:#57606a;font-size:12px}.meta{color:#57606a}
details{margin-top:.3em}summary{cursor:pointer;color:#0969da}table.kv{margin:.3em 0;font-size:12px}table.kv th{font-weight:600;white-space:nowrap}
table.results td:first-child{white-space:nowrap}
figure{margin:.8em 0}figcaption{color:#57606a;font-size:12px}svg.chart{width:100%;max-width:760px;height:auto}
svg.chart text{font:11px system-ui,sans-serif;fill:#1f2328}svg.chart .grid{stroke:#d0d7de;stroke-width:1}
svg.chart .axis{stroke:#57606a;stroke-width:1}
td.fv{min-width:11em}.fv .bar{position:relative;height:8px;background:#eaeef2;border-radius:2px;margin:3px 0}
.fv .bar i{position:absolute;left:0;top:0;bottom:0;background:#0969da;border-radius:2px}
.fv .bar b{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1f2328}.fv .bar b.base{background:#8250df}
.fv div.v{font-weight:600}
td.fv.s-warn{background:#fff8c5}td.fv.s-fail{background:#ffebe9}.fv .bar.s-warn i{background:#9a6700}.fv .bar.s-fail i{background:#cf222e}
pre.drain{background:#f6f8fa;padding:.5em;border:1px solid #d0d7de}
"""

_MAX_DEPTH = 3  # deeper evidence is shown as JSON


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _plain_table(results: list[dict]) -> str:
    rows = "".join(
        f"<tr><td>{_badge(r['status'])}</td><td><code>{_e(check_id(r))}</code></td>"
        f"<td>{_e(value_text(r))}</td><td>{_e(trust_text(r))}</td><td>{_threshold_cell(r)}</td><td>{_e(r.get('reason') or '')}</td></tr>"
        for r in results
    )
    return (
        "<table><thead><tr><th>status</th><th>check</th><th>value</th><th>trust</th><th>threshold</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _badge(status: str) -> str:
    return f'<span class="badge b-{_e(status)}">{_e(status.upper())}</span>'


def _anchor(host: str, i: int) -> str:
    return f"node-{i}-" + re.sub(r"[^A-Za-z0-9_-]", "_", host)


def _scalar(v: Any) -> str:
    text = fmt_scalar(v)
    return f"<pre>{_e(text)}</pre>" if "\n" in text else _e(text)


def _evidence(v: Any, depth: int = 0) -> str:
    """A readable form of a detail value: key/value tables, row tables for lists of records."""
    if depth >= _MAX_DEPTH and isinstance(v, (dict, list)):
        return f"<pre>{_e(json.dumps(v, indent=1, sort_keys=True, default=str))}</pre>"
    if isinstance(v, dict):
        if not v:
            return "<i>empty</i>"
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_evidence(x, depth + 1)}</td></tr>" for k, x in v.items())
        return f'<table class="kv">{rows}</table>'
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        # e.g. one record per GPU: one row each, the union of their keys as columns
        cols: list = []
        for rec in v:
            cols += [k for k in rec if k not in cols]
        head = "".join(f"<th>{_e(c)}</th>" for c in cols)
        body = "".join(
            "<tr>" + "".join(f"<td>{_evidence(rec[c], depth + 1) if c in rec else ''}</td>" for c in cols) + "</tr>"
            for rec in v
        )
        return f'<table class="kv"><tr>{head}</tr>{body}</table>'
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return "".join(f"<div>{_evidence(x, depth + 1)}</div>" for x in v)
    return _scalar(v)


def _threshold_cell(res: dict) -> str:
    bound, source = threshold_text(res.get("threshold"))
    if not bound:
        return ""
    return _e(bound) + (f'<div class="src">source: {_e(source)}</div>' if source else "")


def _finding_row(res: dict) -> str:
    text = f"<div>{_e(res.get('reason') or '(no reason given)')}</div>"
    if res.get("remedy"):
        text += f'<div class="remedy"><b>Remedy:</b> {_e(res["remedy"])}</div>'
    detail = res.get("detail")
    if detail:
        n = len(detail) if isinstance(detail, (dict, list)) else 1
        text += f"<details><summary>evidence ({n} field{'s' if n != 1 else ''})</summary>{_evidence(detail)}</details>"
    return (
        f'<tr class="s-{_e(res["status"])}"><td>{_badge(res["status"])}</td><td>{_e(class_text(res))}</td>'
        f"<td><code>{_e(check_id(res))}</code></td><td>{_e(value_text(res))}</td><td>{_e(trust_text(res))}</td>"
        f"<td>{_threshold_cell(res)}</td><td>{text}</td></tr>"
    )


def _cause_row(group: dict) -> str:
    """One row for a cause several failing checks share: the checks listed, the reason and remedy once."""
    text = f"<div>{_e(group['cause'])}</div>"
    if group["remedy"]:
        text += f'<div class="remedy"><b>Remedy:</b> {_e(group["remedy"])}</div>'
    checks = ", ".join(f"<code>{_e(c)}</code>" for c in group["checks"])
    return (
        f'<tr class="s-{_e(group["status"])}"><td>{_badge(group["status"])}</td><td>{_e(group["class"] or "")}</td>'
        f"<td>{len(group['checks'])} checks: {checks}</td><td></td><td></td><td></td><td>{text}</td></tr>"
    )


def _node_section(node: dict, anchor: str) -> str:
    facts = []
    if node.get("reported_host"):
        facts.append(f"reports itself as {_e(node['reported_host'])}")
    if node.get("profile"):
        facts.append(f"profile <code>{_e(node['profile'])}</code>")
    if node_versions_text(node):
        facts.append(_e(node_versions_text(node)))
    if node.get("started"):
        secs = f" ({_e(fmt_scalar(node['seconds']))} s)" if node.get("seconds") is not None else ""
        facts.append(f"checked {_e(node['started'])}{secs}")
    if node.get("source"):
        facts.append(f"from <code>{_e(node['source'])}</code>")
    out = [f'<section id="{anchor}"><h2>{_e(node["host"])} {_badge(node["verdict"])}</h2>']
    if facts:
        out.append(f'<p class="meta">{"; ".join(facts)}</p>')
    bad, good = ordered_results(node["results"])
    # A reason several failing checks give is said once, with those checks; the other results one row each.
    shared = [g for g in node_causes(node) if len(g["checks"]) > 1]
    bad = [r for r in bad if not in_shared(r, shared)]
    if shared or bad:
        out.append(
            '<table class="results"><thead><tr><th>status</th><th>class</th><th>check</th><th>value</th><th>trust</th><th>threshold</th>'
            "<th>reason, remedy, evidence</th></tr></thead><tbody>"
        )
        out += [_cause_row(g) for g in shared]
        out += [_finding_row(r) for r in bad]
        out.append("</tbody></table>")
    info = information(node["results"])
    if info:  # findings with no action: shown apart, open, and part of no verdict
        out.append(
            f"<details open><summary>{len(info)} {_e(INFO_TITLE[0].lower() + INFO_TITLE[1:])}</summary>"
            + _plain_table(info)
            + "</details>"
        )
    if good:
        # Passes are folded away unless nothing else is there to read.
        out.append(
            f"<details{'' if bad or info else ' open'}><summary>{len(good)} passed check{'s' if len(good) != 1 else ''}</summary>"
            + _plain_table(good)
            + "</details>"
        )
    charts = _busbw_section(node)
    if charts:
        out.append(charts)
    out.append("</section>")
    return "\n".join(out)


# ---------------------------------------------------------------- NCCL bus bandwidth charts

_PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#9a6700", "#57606a")
_W, _H = 760, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 190, 16, 48  # the plot area inside the chart; the legend goes right


def _nice_step(span: float, ticks: int = 5) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals over `span`."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _busbw_svg(chart: dict) -> str:
    """busbw (GB/s, linear) against message size (log2): polylines, points with tooltips, axes, legend."""
    pts = [p for line in chart["lines"] for p in line["points"]]
    lo = math.floor(math.log2(min(p[0] for p in pts)))
    hi = math.ceil(math.log2(max(p[0] for p in pts)))
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    top = max(p[1] for p in pts) * 1.05 or 1.0
    ystep = _nice_step(top)
    top = math.ceil(top / ystep) * ystep
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(size: float) -> float:
        return _LEFT + (math.log2(size) - lo) / (hi - lo) * pw

    def y(gbps: float) -> float:
        return _TOP + ph - gbps / top * ph

    out = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(chart["title"])}">',
        f"<title>{_e(chart['title'])}</title>",
    ]
    xstep = max(1, math.ceil((hi - lo) / 8))  # at most about 8 size labels
    for exp in range(lo, hi + 1, xstep):
        px = x(2**exp)
        out.append(f'<line class="grid" x1="{px:.1f}" y1="{_TOP}" x2="{px:.1f}" y2="{_TOP + ph}"/>')
        out.append(f'<text x="{px:.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_e(size_text(2**exp))}</text>')
    for i in range(int(round(top / ystep)) + 1):
        val = i * ystep
        py = y(val)
        out.append(f'<line class="grid" x1="{_LEFT}" y1="{py:.1f}" x2="{_LEFT + pw}" y2="{py:.1f}"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_e(fmt_scalar(float(val)))}</text>')
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}"/>')
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}"/>')
    out.append(f'<text x="{_LEFT + pw / 2:.1f}" y="{_H - 8}" text-anchor="middle">message size (log2 scale)</text>')
    out.append(
        f'<text x="14" y="{_TOP + ph / 2:.1f}" text-anchor="middle" transform="rotate(-90 14 {_TOP + ph / 2:.1f})">busbw (GB/s)</text>'
    )
    for i, line in enumerate(chart["lines"]):
        color = _PALETTE[i % len(_PALETTE)]
        coords = " ".join(f"{x(s):.1f},{y(b):.1f}" for s, b in line["points"])
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        for s, b in line["points"]:
            tip = f"{line['label']}, {size_text(s)}: {fmt_scalar(b)} GB/s"
            out.append(
                f'<circle cx="{x(s):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"><title>{_e(tip)}</title></circle>'
            )
        ly = _TOP + 10 + i * 18
        out.append(
            f'<line x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">{_e(line["label"])} ({_e(line["status"])})</text>')
    out.append("</svg>")
    return "".join(out)


def _busbw_section(node: dict) -> str:
    charts = busbw_series(node["results"])
    if not charts:
        return ""
    out = ["<h3>NCCL bus bandwidth</h3>"]
    for chart in charts:
        notes = []
        if chart.get("backend") == "gloo":
            notes.append("on the CPU: a logic check, not a performance figure")
        caption = _e(chart["title"]) + "".join(f"; {_e(n)}" for n in notes)
        out.append(f"<figure>{_busbw_svg(chart)}<figcaption>{caption}</figcaption></figure>")
    return "\n".join(out)


def _fleet_section(report: dict, anchors: dict[str, str]) -> str:
    """The fleet view: per node and figure, a bar scaled to the column's largest value with a black mark at the
    fleet median and a purple one at the baseline, the figure against both; outliers coloured. Then the drain lines."""
    fleet = report.get("fleet")
    if not fleet:
        return ""
    out = [
        "<h2>Fleet</h2>",
        f'<p class="meta">{_e(fleet_note(report))}</p>',
    ]  # the store and baseline used, even with no figures
    columns = fleet_columns(report)
    rows = fleet.get("view") or []
    if columns:
        head = "".join(f"<th>{_e(title)} ({_e(unit or '')})</th>" for _, title, unit in columns)
        out.append(f'<table class="fleet"><thead><tr><th>node</th>{head}</tr></thead><tbody>')
        tops = {
            col: max((r["columns"][col]["value"] for r in rows if r["columns"].get(col)), default=0)
            for col, _, _ in columns
        }
        for row in rows:
            cells = []
            for col, _, _ in columns:
                cell = row["columns"].get(col)
                if not cell:
                    cells.append('<td class="fv"></td>')
                    continue
                top = tops[col] or 1.0
                width = max(0.0, min(100.0, cell["value"] / top * 100))
                mark = ""
                if cell.get("fleet_median"):
                    mark = (
                        f'<b style="left:{min(100.0, cell["fleet_median"] / top * 100):.1f}%" title="fleet median"></b>'
                    )
                base = cell.get("baseline") or cell.get("baseline_fleet_median")
                if base:
                    mark += f'<b class="base" style="left:{min(100.0, base / top * 100):.1f}%" title="baseline"></b>'
                parts = fleet_cell_parts(cell)
                status = cell["status"]
                badge = f" {_badge(status)}" if status != "pass" else ""
                cells.append(
                    f'<td class="fv s-{_e(status)}"><div class="v">{_e(parts[0])}{badge}</div>'
                    f'<div class="bar s-{_e(status)}"><i style="width:{width:.1f}%"></i>{mark}</div>'
                    + "".join(f'<div class="src">{_e(p)}</div>' for p in parts[1:])
                    + "</td>"
                )
            link = anchors.get(row["host"])
            name = f'<a href="#{link}">{_e(row["host"])}</a>' if link else _e(row["host"])
            out.append(f"<tr><td>{name}</td>{''.join(cells)}</tr>")
        out.append("</tbody></table>")
    drain = fleet.get("drain") or []
    out.append("<h3>Drain in Slurm</h3>")
    if drain:
        out.append(f"<p>{len(drain)} node(s) not accepted (also in <code>drain.txt</code>):</p>")
        out.append(f'<pre class="drain">{_e(chr(10).join(drain))}</pre>')
    else:
        out.append("<p>Every node accepted: none to drain.</p>")
    return "\n".join(out)


def _versions_section(report: dict) -> str:
    """The software and firmware of every node, one row per component, differences first and marked."""
    rows = versions_rows(report)
    if not rows:
        return ""
    out = [
        f"<h2>{_e(VERSIONS_TITLE)}</h2>",
        f'<p class="meta">{_e(versions_note(report))}</p>',
        '<table class="versions"><thead><tr>'
        + "".join(f"<th>{_e(h)}</th>" for h in VERSIONS_HEAD)
        + "</tr></thead><tbody>",
    ]
    for row in rows:
        marked = ' class="s-warn"' if row["differs"] else ""
        out.append(f"<tr{marked}>" + "".join(f"<td>{_e(c)}</td>" for c in row["cells"]) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def render(report: dict) -> str:
    nodes = list(report["nodes"].values())
    anchors = [_anchor(n["host"], i) for i, n in enumerate(nodes)]
    rows = []
    for node, anchor in zip(nodes, anchors):
        counts = "".join(
            f'<td class="n{" zero" if not node["counts"][s] else ""}">{node["counts"][s]}</td>' for s in STATUS_ORDER
        )
        items, more = findings(node, limit=12)
        rows.append(
            f'<tr class="s-{_e(node["verdict"])}"><td><a href="#{anchor}">{_e(node["host"])}</a></td>'
            f"<td>{_badge(node['verdict'])}</td>{counts}<td>{_e(node.get('profile') or '')}</td>"
            f"<td>{', '.join(f'<code>{_e(i)}</code>' for i in items)}{f' and {more} more' if more else ''}</td></tr>"
        )
    title = f"gpufleet report {report['run_id']}: {report['verdict'].upper()}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>gpufleet acceptance report {_badge(report['verdict'])}</h1>",
            f'<p class="meta">run <code>{_e(report["run_id"])}</code>: {_e(fleet_line(report))}. '
            f"Generated {_e(report['generated'])} from <code>{_e(report['run_dir'])}/hosts</code>; "
            "every result is kept unchanged in report.json.</p>",
            "<h2>Nodes</h2>",
            "<table><thead><tr><th>node</th><th>verdict</th>"
            + "".join(f"<th>{_e(s)}</th>" for s in STATUS_ORDER)
            + "<th>profile</th><th>failing (each cause once), warning</th></tr></thead><tbody>",
            *rows,
            "</tbody></table>",
            *(
                [
                    f'<p class="meta">Locks not given back (the next run takes them over or waits out the lease): '
                    f"{_e('; '.join(kept_locks(report)))}.</p>"
                ]
                if kept_locks(report)
                else []
            ),
            _fleet_section(report, {n["host"]: a for n, a in zip(nodes, anchors)}),
            _versions_section(report),
            *(_node_section(n, a) for n, a in zip(nodes, anchors)),
            "</body></html>",
            "",
        ]
    )
