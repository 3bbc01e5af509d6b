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
import re
from typing import Any

from gpufleet.base.registry import registers
from gpufleet.base import schema
from gpufleet.base.causes import in_shared
from gpufleet.comparisons import figure_text
from gpufleet.report import chart_data, svg, svg_fleet
from gpufleet.report.drain import NOT_CONFIRMED
from gpufleet.report.formatting import (
    INFO_TITLE,
    STATUS_ORDER,
    VERSIONS_HEAD,
    VERSIONS_TITLE,
    check_id,
    class_text,
    decided_limit,
    decided_text,
    fleet_cell_parts,
    fleet_columns,
    fleet_line,
    fleet_note,
    fleet_view_rows,
    findings,
    fmt_scalar,
    information,
    kept_locks,
    left_out_text,
    node_causes,
    node_versions_text,
    ordered_results,
    threshold_has_more,
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
figure{margin:.8em 0}figcaption{color:#57606a;font-size:12px}svg.chart{width:100%;height:auto;display:block}
svg.busbw{max-width:760px}svg.soak,svg.distribution{max-width:1000px}svg.bars{max-width:560px}
svg.chart text{font:11px system-ui,sans-serif;fill:#1f2328}svg.chart .grid{stroke:#d0d7de;stroke-width:1}
svg.chart .axis{stroke:#57606a;stroke-width:1}svg.chart text.strong{font-weight:600}svg.chart text.name{font-size:10px}
svg .lane-bg{fill:#f6f8fa}svg .figure{fill:none;stroke:#0969da;stroke-width:1.5}svg .pt{fill:#0969da}
svg .slow{fill:#cf222e}svg .disturbed{fill:#d4a72c;fill-opacity:.35}svg .slowed{fill:#cf222e;fill-opacity:.12}svg .dv{fill:#fff;stroke:#9a6700;stroke-width:1.5}
svg .again{fill:#1a7f37;fill-opacity:.12}svg .foreign{fill:#cf222e;fill-opacity:.16;stroke:#cf222e;stroke-dasharray:2 2}svg .foreign-label{fill:#cf222e}
svg .limit,svg .floor{stroke:#cf222e;stroke-width:1.2;stroke-dasharray:5 3}
svg .sibling-limit{stroke:#9a6700;stroke-width:1.2;stroke-dasharray:5 3}
svg polyline.base{fill:none;stroke-width:1.5;stroke-dasharray:5 4}svg rect.base{fill:#fff;stroke-width:1.5}
svg line.base{stroke-width:1.5;stroke-dasharray:5 4}
svg .bar{fill:#0969da}svg .bar.s-warn{fill:#9a6700}svg .bar.s-fail,svg .bar.s-error{fill:#cf222e}
svg .ref{stroke:#1f2328;stroke-width:2}svg .usual{fill:none;stroke:#57606a;stroke-width:1.5}svg .past{fill:#8250df}
svg .bin{fill:#0969da;fill-opacity:.7}svg .whisker{stroke:#57606a}svg .iqr{fill:#ddf4ff;stroke:#0969da}
svg .med,svg .fleet-median{stroke:#1f2328;stroke-width:2}svg .base-median{stroke:#8250df;stroke-width:1.5;stroke-dasharray:5 3}
svg .beyond{fill:#8c959f}svg text.break{fill:#57606a;font-weight:600}svg .outlier circle{fill:#57606a}svg .outlier circle.s-warn{fill:#9a6700}svg .outlier circle.s-fail{fill:#cf222e}
.panels{display:flex;flex-wrap:wrap;gap:0 1.5em}.panels figure{flex:1 1 480px;max-width:560px}
.lim{font-weight:600}td{overflow-wrap:break-word}.src,table.kv th{overflow-wrap:anywhere}section.brief{margin:.15em 0;content-visibility:auto;contain-intrinsic-size:auto 22px}section.brief h4{display:inline;margin:0}
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
    """The limit that decided the result (decided_limit), its source, and the whole threshold folded under it."""
    limit = decided_limit(res)
    if limit is None:
        bound, source = threshold_text(res.get("threshold"))
        shown = _e(bound)
    else:
        bound, source = decided_text(limit)
        shown = f'<div class="lim">{_e(bound)}</div>'
    if not bound:
        return ""
    cell = shown + (f'<div class="src">source: {_e(source)}</div>' if source else "")
    if limit is not None and threshold_has_more(res):
        cell += f"<details><summary>whole threshold</summary>{_evidence(res['threshold'])}</details>"
    return cell


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


def _node_section(node: dict, anchor: str, report: dict) -> str:
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
    if (node.get("certificate") or {}).get("certified"):
        expired = "<strong>expired</strong>: " if node["certificate"]["expired"] else ""
        facts.append(expired + _e(node["certificate"]["text"]))
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
    pictures = _pictures(node, report)
    if pictures:
        out.append(pictures)
    out.append("</section>")
    return "\n".join(out)


def _pictures(node: dict, report: dict) -> str:
    """The node's pictures: each GPU beside its siblings and its past, the soak window by window, NCCL's busbw
    beside the baseline's."""
    out = []
    panels = chart_data.gpu_bars(node["results"], node.get("per_gpu"))
    if panels:
        out.append("<h3>Each GPU beside its siblings and its past</h3>")
        out.append('<div class="panels">')
        for panel in panels:
            caption = f"{panel['label']} per GPU ({panel['unit']})" + (
                f"; the siblings' limit {fmt_scalar(panel['sibling_limit_pct'])}% under what each GPU is held against"
                if panel["sibling_limit_pct"] is not None
                else ""
            )
            out.append(f"<figure>{svg.bars_svg(panel)}<figcaption>{_e(caption)}</figcaption></figure>")
        out.append("</div>")
    timelines = chart_data.soak_timelines(node["results"])
    if timelines:
        out.append('<h3>The soak, window by window</h3><div class="soak">')
        for t in timelines:
            caption = (
                f"{t['title']}: each GPU's figure per {fmt_scalar(t['window_s'])} s window; dashed, the limit "
                f"({fmt_scalar(t['limit_pct'])}% under the GPU's best windows); shaded, a disturbed window (left out, "
                "its figure hollow); pale red, a window past a limit with nothing seen, measured again (left out, its "
                "figure hollow); green, a window measured again; red band, a foreign process on that GPU"
            )
            out.append(f"<figure>{svg.soak_svg(t)}<figcaption>{_e(caption)}</figcaption></figure>")
        out.append("</div>")
    charts = chart_data.nccl_charts(node, report)
    if charts:
        out.append("<h3>NCCL bus bandwidth</h3>")
    for chart in charts:
        notes = []
        if chart.get("backend") == "gloo":
            notes.append("on the CPU: a logic check, not a performance figure")
        if chart.get("baseline_run"):
            notes.append(f"dashed: baseline run {chart['baseline_run']}, at the largest size of each size band")
        caption = _e(chart["title"]) + "".join(f"; {_e(n)}" for n in notes)
        out.append(f"<figure>{svg.busbw_svg(chart)}<figcaption>{caption}</figcaption></figure>")
    return "\n".join(out)


def _distributions(report: dict) -> list[str]:
    out = []
    for d in chart_data.fleet_distributions(report):
        named = ", ".join(f"{o['host']} {figure_text(o['value'])}" for o in d["outliers"][: chart_data.OUTLIERS_NAMED])
        more = len(d["outliers"]) - chart_data.OUTLIERS_NAMED
        flagged = d["outliers"][0]["status"] != "pass"
        caption = (
            f"{d['title']} ({d['unit']}) over {d['n']} nodes: quartiles as a box; beyond the axis breaks, the nodes "
            f"far from the rest; {'outliers (the fleet layer did not pass them)' if flagged else 'none judged an outlier; the slowest'}: "
            f"{named}" + (f" and {more} more" if more > 0 else "")
        )
        out.append(f"<figure>{svg_fleet.distribution_svg(d)}<figcaption>{_e(caption)}</figcaption></figure>")
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
    badge = f" {_badge(status)}" if status != "pass" else ""
    return (
        f'<td class="fv s-{_e(status)}"><div class="v">{_e(parts[0])}{badge}</div>'
        f'<div class="bar s-{_e(status)}"><i style="width:{width:.1f}%"></i>{mark}</div>'
        + "".join(f'<div class="src">{_e(p)}</div>' for p in parts[1:])
        + "</td>"
    )


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
        unconfirmed = ", ".join(f"<code>{_e(u['check'])}</code> ({_e(u['trust'])})" for u in row["unconfirmed"])
        out.append(
            f'<tr class="{"s-fail" if row["drain"] else "s-warn"}"><td>{_e(row["host"])}</td>'
            f"<td>{', '.join(f'<code>{_e(c)}</code>' for c in row['confirmed']) or 'none'}</td><td>{unconfirmed}</td></tr>"
        )
    out.append("</tbody></table>")
    if drain:
        out.append(f"<p>{len(drain)} node(s) with a confirmed failure (also in <code>drain.txt</code>):</p>")
        out.append(f'<pre class="drain">{_e(chr(10).join(drain))}</pre>')
    if len(drain) < len(review):
        out.append(f'<p class="meta">{len(review) - len(drain)} node(s) {_e(NOT_CONFIRMED)}.</p>')
    return out


def _fleet_section(report: dict, anchors: dict[str, str]) -> str:
    """The fleet: each figure's distribution over the nodes with its outliers named, the fleet view (every node
    of a fleet up to FLEET_ROWS_MAX, else the nodes with a figure that did not pass), then the drain box."""
    fleet = report.get("fleet")
    if not fleet:
        return ""
    out = ["<h2>Fleet</h2>", f'<p class="meta">{_e(fleet_note(report))}</p>']  # the store and baseline used
    out += _distributions(report)
    columns = fleet_columns(report)
    rows, left_out = fleet_view_rows(report)
    if columns:
        if left_out:
            out.append(f'<p class="meta">{_e(left_out_text(left_out, len(rows)))}</p>')
        head = "".join(f"<th>{_e(title)} ({_e(unit or '')})</th>" for _, title, unit in columns)
        out.append(f'<table class="fleet"><thead><tr><th>node</th>{head}</tr></thead><tbody>')
        everyone = fleet.get("view") or []
        tops = {
            col: max((r["columns"][col]["value"] for r in everyone if r["columns"].get(col)), default=0)
            for col, _, _ in columns
        }
        for row in rows:
            cells = "".join(_fleet_cell(row["columns"].get(col), tops[col]) for col, _, _ in columns)
            link = anchors.get(row["host"])
            name = f'<a href="#{link}">{_e(row["host"])}</a>' if link else _e(row["host"])
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


def _brief(node: dict, anchor: str) -> str:
    """One line for a node the page does not detail: its verdict, its counts, what failed or warned."""
    counts = ", ".join(f"{node['counts'][s]} {s}" for s in STATUS_ORDER if node["counts"][s])
    items, more = findings(node, limit=6)
    failing = f"; {', '.join(items)}{f' and {more} more' if more else ''}" if items else ""
    return (
        f'<section id="{anchor}" class="brief"><h4>{_e(node["host"])} {_badge(node["verdict"])}</h4> '
        f'<span class="meta">{_e(counts)}; {_e(node.get("profile") or "")}{_e(failing)}</span></section>'
    )


def _node_row(node: dict, anchor: str) -> str:
    counts = "".join(
        f'<td class="n{" zero" if not node["counts"][s] else ""}">{node["counts"][s]}</td>' for s in STATUS_ORDER
    )
    items, more = findings(node, limit=12)
    return (
        f'<tr class="s-{_e(node["verdict"])}"><td><a href="#{anchor}">{_e(node["host"])}</a></td>'
        f"<td>{_badge(node['verdict'])}</td>{counts}<td>{_e(node.get('profile') or '')}</td>"
        f"<td>{', '.join(f'<code>{_e(i)}</code>' for i in items)}{f' and {more} more' if more else ''}</td></tr>"
    )


@registers("output.html", "render")
def render(report: dict) -> str:
    nodes = list(report["nodes"].values())
    anchors = [_anchor(n["host"], i) for i, n in enumerate(nodes)]
    detailed = _detailed(nodes)
    rows = [_node_row(n, a) for n, a in zip(nodes, anchors) if n["host"] in detailed]
    sections = [_node_section(n, a, report) if n["host"] in detailed else _brief(n, a) for n, a in zip(nodes, anchors)]
    scale = (
        f'<p class="meta">{len(nodes)} nodes: this page details the {len(detailed)} not accepted, warned or with '
        f"information (at most {NODES_DETAILED}, worst first); every other node has one line at the end of the page, "
        "and every node its "
        "results, per-GPU figures and NCCL curves whole in report.md and report.json.</p>"
        if len(detailed) < len(nodes)
        else ""
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
            scale,
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
            *sections,
            "</body></html>",
            "",
        ]
    )
