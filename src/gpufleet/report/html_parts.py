"""The pieces report.html is made of, shared by its page (render_html.py) and its node sections (html_node.py): text
escaped, a status badge, an action badge, evidence as key/value tables, the limit that decided a result, a table of
results, a node's cause and its figures past a limit. Every piece of text goes through html.escape."""

from __future__ import annotations

import html
import json
from typing import Any

from gpufleet.fleet.remediation import THEIRS
from gpufleet.report import cause as causes_of
from gpufleet.report.formatting import (
    check_id,
    decided_limit,
    decided_text,
    fmt_scalar,
    threshold_has_more,
    threshold_text,
    trust_text,
    value_text,
)
from gpufleet.report.html_style import action_class

MAX_DEPTH = 3  # deeper evidence is shown as JSON
ROW_TABLE_COLUMNS = 6  # records with more keys are shown one under the other: a wider table would not fit 800 px
FIGURES_LISTED = 6  # figures past a limit listed in the node table; the node's section has them all


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def badge(status: str) -> str:
    return f'<span class="badge b-{esc(status)}">{esc(status.upper())}</span>'


def action_badge(action: str) -> str:
    return f'<span class="badge {action_class(action)}" title="{esc(THEIRS.get(action, ""))}">{esc(action)}</span>'


def _scalar(v: Any) -> str:
    text = fmt_scalar(v)
    return f"<pre>{esc(text)}</pre>" if "\n" in text else esc(text)


def evidence(v: Any, depth: int = 0) -> str:
    """A readable form of a detail value: key/value tables, row tables for lists of records."""
    if depth >= MAX_DEPTH and isinstance(v, (dict, list)):
        return f"<pre>{esc(json.dumps(v, indent=1, sort_keys=True, default=str))}</pre>"
    if isinstance(v, dict):
        if not v:
            return "<i>empty</i>"
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{evidence(x, depth + 1)}</td></tr>" for k, x in v.items())
        return f'<table class="kv">{rows}</table>'
    cols: list = []
    for rec in v if isinstance(v, list) and all(isinstance(x, dict) for x in v) else []:
        cols += [k for k in rec if k not in cols]
    if v and 0 < len(cols) <= ROW_TABLE_COLUMNS:
        # e.g. one record per GPU: one row each, the union of their keys as columns
        head = "".join(f"<th>{esc(c)}</th>" for c in cols)
        body = "".join(
            "<tr>" + "".join(f"<td>{evidence(rec[c], depth + 1) if c in rec else ''}</td>" for c in cols) + "</tr>"
            for rec in v
        )
        return f'<table class="kv"><tr>{head}</tr>{body}</table>'
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return "".join(f"<div>{evidence(x, depth + 1)}</div>" for x in v)
    return _scalar(v)


def threshold_cell(res: dict) -> str:
    """The limit that decided the result (decided_limit), its source, and the whole threshold folded under it."""
    limit = decided_limit(res)
    if limit is None:
        bound, source = threshold_text(res.get("threshold"))
        shown = esc(bound)
    else:
        bound, source = decided_text(limit)
        shown = f'<div class="lim">{esc(bound)}</div>'
    if not bound:
        return ""
    cell = shown + (f'<div class="src">source: {esc(source)}</div>' if source else "")
    if limit is not None and threshold_has_more(res):
        cell += f"<details><summary>whole threshold</summary>{evidence(res['threshold'])}</details>"
    return cell


def figure_cell(res: dict) -> str:
    value, trust, past = value_text(res), trust_text(res), causes_of.past_own_bound(res)
    return (
        esc(value)
        + (f'<div class="past">{esc(past)}</div>' if past else "")
        + (f'<div class="src">trust: {esc(trust)}</div>' if trust else "")
    )


def plain_table(results: list[dict]) -> str:
    rows = "".join(
        f'<tr class="s-{esc(causes_of.shown_status(r))}"><td>{badge(causes_of.shown_status(r))}</td>'
        f'<td class="check"><code>{esc(check_id(r))}</code></td><td>{figure_cell(r)}</td><td>{threshold_cell(r)}</td>'
        f"<td>{esc(r.get('reason') or '')}</td></tr>"
        for r in results
    )
    return (
        "<table><thead><tr><th>status</th><th>check</th><th>value</th><th>limit</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def cause_cells(node: dict) -> str:
    """The node table's cells of one node: its cause in one sentence with what to do, then its figures past a
    limit (cause.py)."""
    c = causes_of.cause(node)
    said = ", ".join(x for x in (c["class"], c["trust"]) if x)
    more = f"; and {c['more']} more cause(s) below" if c["more"] else ""
    figures = causes_of.failing_figures(node)
    listed = "".join(
        f'<li class="s-{esc(f["status"])}">{esc(causes_of.figure_line(f))}</li>' for f in figures[:FIGURES_LISTED]
    )
    left = len(figures) - FIGURES_LISTED
    return (
        f'<td class="cause" data-cause-of="{esc(node["host"])}"><div>{esc(c["text"])}</div>'
        + (f'<div class="why">{esc(said + more)}</div>' if said or more else "")
        + f'<div class="act">action: {action_badge(c["action"])} <span class="why">{esc(c["action_why"])}</span></div>'
        + "</td>"
        + f'<td class="figs">{"<ul>" + listed + "</ul>" if listed else ""}'
        + (f'<span class="why">and {left} more in its section</span>' if left > 0 else "")
        + "</td>"
    )
