"""The fleet's picture in report.html: one figure of the fleet view over the nodes, drawn as inline SVG by the
report itself (svg.py draws the node's pictures and says how): distribution_svg(d) draws a histogram of where the
middle of the fleet lies (its count axis from zero, the tallest bin's count written), its quartiles, the fleet and
baseline medians (each labelled with its figure), the nodes far from the rest on axes of their own, and the outliers
named. The data: chart_data.fleet_distributions().
"""

from __future__ import annotations

from gpufleet.comparisons import figure_text
from gpufleet.report.formatting import fmt_scalar
from gpufleet.report.svg import esc, num, svg_open, ticks

_DW, _DH, _DLEFT, _DRIGHT, _DTOP = 1000, 264, 48, 40, 32
_HIST_H, _BOX_Y, _STRIP_Y = 90, 142, 174


def _axis(d: dict, pw: float):
    """x(value) of a fleet's figure: the bulk (where the middle of the fleet lies) on most of the width, the nodes
    below and above it on axes of their own at either side, so that one slow node does not squeeze the fleet into a
    single bar. Returns (x, the segments drawn: [(low, high, x0, x1)], the bulk's (low, high))."""
    low, high = d["bulk"]
    marks = [v for v in (d["fleet_median"], d["baseline"]) if isinstance(v, (int, float))]
    low, high = min([low, *marks]), max([high, *marks])
    if high - low < abs(high) * 1e-6:
        low, high = low - abs(low) * 0.005 - 1e-9, high + abs(high) * 0.005 + 1e-9
    gap = 16
    left = pw * 0.15 if d["min"] < low else 0.0
    right = pw * 0.12 if d["max"] > high else 0.0
    segments = []
    if left:
        segments.append((d["min"], low, _DLEFT, _DLEFT + left))
    mid0 = _DLEFT + left + (gap if left else 0)
    mid1 = _DLEFT + pw - right - (gap if right else 0)
    segments.append((low, high, mid0, mid1))
    if right:
        segments.append((high, d["max"], mid1 + gap, _DLEFT + pw))

    def x(v: float) -> float:
        for lo, hi, x0, x1 in segments:
            if lo <= v <= hi:
                return x0 + (v - lo) / ((hi - lo) or 1.0) * (x1 - x0)
        return segments[0][2] if v < segments[0][0] else segments[-1][3]

    return x, segments, (low, high)


def distribution_svg(d: dict, named: int = 12) -> str:
    """A histogram of the fleet's bulk, its quartiles as a box (whiskers to the farthest nodes inside the bulk),
    the fleet median (black) and the baseline run's fleet median (purple, dashed); the nodes outside the bulk on
    axes of their own at either side; on a strip under it, the outliers (the nodes the fleet layer did not pass,
    coloured), the first `named` named."""
    pw = _DW - _DLEFT - _DRIGHT
    x, segments, (low, high) = _axis(d, pw)
    inside = [v for v in d["values"] if low <= v <= high]
    bins = max(5, min(40, len(inside) // 5))
    width = (high - low) / bins
    counts = [0] * bins
    for v in inside:
        counts[min(bins - 1, int((v - low) / width))] += 1
    top = max(counts) or 1
    title = f"{d['title']} ({d['unit']}) over {d['n']} nodes"
    out = svg_open("distribution", _DW, _DH, title, column=d["column"], nodes=d["n"])
    # The count axis: how many nodes a bin holds, from zero.
    out.append(f'<line class="axis" x1="{_DLEFT}" y1="{_DTOP}" x2="{_DLEFT}" y2="{_DTOP + _HIST_H}"/>')
    for c in sorted({0, top // 2, top}):
        cy = _DTOP + _HIST_H - c / top * _HIST_H
        out.append(f'<line class="grid" x1="{_DLEFT - 3}" y1="{num(cy)}" x2="{_DLEFT}" y2="{num(cy)}"/>')
        out.append(f'<text class="count" x="{_DLEFT - 5}" y="{num(cy + 4)}" text-anchor="end">{c}</text>')
    out.append(
        f'<text x="12" y="{num(_DTOP + _HIST_H / 2)}" text-anchor="middle" '
        f'transform="rotate(-90 12 {num(_DTOP + _HIST_H / 2)})">nodes</text>'
    )
    for lo, hi, x0, x1 in segments:
        marks = ticks(lo, hi, max(2, int((x1 - x0) / 110))) if (lo, hi) == (low, high) else [lo if lo < low else hi]
        for v in marks:
            out.append(f'<line class="grid" x1="{num(x(v))}" y1="{_DTOP}" x2="{num(x(v))}" y2="{_STRIP_Y + 8}"/>')
            out.append(f'<text x="{num(x(v))}" y="{_DH - 30}" text-anchor="middle">{esc(fmt_scalar(v))}</text>')
        out.append(f'<line class="axis" x1="{num(x0)}" y1="{_STRIP_Y}" x2="{num(x1)}" y2="{_STRIP_Y}"/>')
    for lo, hi, x0, x1 in segments[:-1]:  # the axis breaks
        out.append(f'<text x="{num(x1 + 8)}" y="{_STRIP_Y + 4}" text-anchor="middle" class="break">//</text>')
    for i, c in enumerate(counts):
        if not c:
            continue
        a = low + i * width
        h = c / top * _HIST_H
        tip = f"{c} node(s) from {figure_text(a)} to {figure_text(a + width)} {d['unit']}"
        out.append(
            f'<rect class="bin" x="{num(x(a))}" y="{num(_DTOP + _HIST_H - h)}" width="{num(max(1.0, x(a + width) - x(a) - 1))}" '
            f'height="{num(h)}" data-count="{c}"><title>{esc(tip)}</title></rect>'
        )
        if c == top:  # the tallest bin says its count; the axis gives the others
            out.append(
                f'<text class="count" x="{num((x(a) + x(a + width)) / 2)}" y="{num(_DTOP + _HIST_H - h - 3)}" '
                f'text-anchor="middle">{c}</text>'
            )
    q = (
        f"quartiles {figure_text(d['q1'])} / {figure_text(d['median'])} / {figure_text(d['q3'])}; "
        f"slowest {figure_text(d['min'])}, fastest {figure_text(d['max'])}"
    )
    out.append(f'<g class="box"><title>{esc(q)}</title>')
    out.append(
        f'<line class="whisker" x1="{num(x(min(inside)))}" y1="{_BOX_Y}" x2="{num(x(max(inside)))}" y2="{_BOX_Y}"/>'
    )
    out.append(
        f'<rect class="iqr" x="{num(x(d["q1"]))}" y="{_BOX_Y - 8}" width="{num(max(1.0, x(d["q3"]) - x(d["q1"])))}" height="16"/>'
    )
    out.append(
        f'<line class="med" x1="{num(x(d["median"]))}" y1="{_BOX_Y - 8}" x2="{num(x(d["median"]))}" y2="{_BOX_Y + 8}"/>'
    )
    out.append("</g>")
    for cls, v, text, anchor in (
        ("fleet-median", d["fleet_median"], "fleet median", "end"),
        ("base-median", d["baseline"], "baseline run's median", "start"),
    ):
        if isinstance(v, (int, float)):
            tip = f"{text} {figure_text(v)} {d['unit']}"
            out.append(
                f'<line class="{cls}" x1="{num(x(v))}" y1="{_DTOP - 12}" x2="{num(x(v))}" y2="{_BOX_Y + 10}" data-value="{v}">'
                f"<title>{esc(tip)}</title></line>"
            )
            nudge = -3 if anchor == "end" else 3
            out.append(
                f'<text class="{cls}-label" x="{num(x(v) + nudge)}" y="{_DTOP - 16}" text-anchor="{anchor}">'
                f"{esc(text)} {esc(figure_text(v))}</text>"
            )
    for b in d["beyond"]:  # each node outside the bulk (an outlier among them is drawn again, coloured, below)
        tip = f"{b['host']}: {figure_text(b['value'])} {d['unit']} ({b['status']})"
        out.append(
            f'<circle class="beyond" cx="{num(x(b["value"]))}" cy="{_STRIP_Y}" r="3" data-host="{esc(b["host"])}">'
            f"<title>{esc(tip)}</title></circle>"
        )
    for i, o in enumerate(d["outliers"]):
        ox = x(o["value"])
        tip = f"{o['host']}: {figure_text(o['value'])} {d['unit']} ({o['status']})"
        out.append(
            f'<g class="outlier" data-host="{esc(o["host"])}" data-value="{o["value"]}" data-status="{esc(o["status"])}">'
            f'<title>{esc(tip)}</title><circle class="s-{esc(o["status"])}" cx="{num(ox)}" cy="{_STRIP_Y}" r="4"/>'
        )
        if i < named:
            ty = _STRIP_Y + 16 + (i % 3) * 11
            anchor = "end" if ox > _DLEFT + pw * 0.8 else "start"
            out.append(f'<text x="{num(ox)}" y="{ty}" text-anchor="{anchor}" class="name">{esc(o["host"])}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
