"""The pictures of report.html, drawn as inline SVG by the report itself: no script, no font or file fetched, so
the page opens on a laptop with no network. Each picture is well-formed XML (every text escaped), and carries
what it shows as data attributes (data-gpu, data-window, data-size, data-host, ...), so that tests read it back.

    busbw_svg(chart)          NCCL busbw against message size (log2), one line per collective, the baseline dashed
    soak_svg(timeline)        a soak's windows per GPU and figure against time: the limit, the disturbed windows,
                              the foreign processes' spans
    bars_svg(panel)           one figure per GPU: each GPU's bar, its siblings' median, its past, the limits
    distribution_svg(dist)    one figure over a fleet: histogram, quartiles, fleet and baseline medians, outliers named

The data comes from figures.py; the CSS classes (grid, axis, limit, ...) are styled by render_html.
"""

from __future__ import annotations

import html
import math
from typing import Any

from gpufleet.comparisons import figure_text
from gpufleet.report.formatting import fmt_scalar
from gpufleet.schema import size_text

PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#9a6700", "#57606a")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _f(v: float) -> str:
    return f"{v:.1f}"


def nice_step(span: float, ticks: int = 5) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals over `span`."""
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _ticks(lo: float, hi: float, ticks: int = 5) -> list[float]:
    step = nice_step(hi - lo, ticks)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _open(kind: str, width: int, height: int, title: str, **data) -> list[str]:
    attrs = "".join(f' data-{k.replace("_", "-")}="{_e(v)}"' for k, v in data.items() if v is not None)
    return [
        f'<svg class="chart {kind}" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}"{attrs}>',
        f"<title>{_e(title)}</title>",
    ]


def _range(values: list[float], pad: float = 0.02) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) * 0.02 or 1.0
    return lo - span * pad * 5, hi + span * pad * 5


# ---------------------------------------------------------------- NCCL bus bandwidth

_W, _H = 760, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 190, 16, 48  # the plot area inside the chart; the legend goes right


def busbw_svg(chart: dict) -> str:
    """busbw (GB/s, linear) against message size (log2): a polyline and points (with tooltips) per collective, the
    baseline run's figures for it dashed beside them, axes, legend."""
    base = [p for line in chart["lines"] for p in line.get("baseline") or []]
    pts = [p for line in chart["lines"] for p in line["points"]] + base
    lo = math.floor(math.log2(min(p[0] for p in pts)))
    hi = math.ceil(math.log2(max(p[0] for p in pts)))
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    top = max(p[1] for p in pts) * 1.05 or 1.0
    ystep = nice_step(top)
    top = math.ceil(top / ystep) * ystep
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(size: float) -> float:
        return _LEFT + (math.log2(size) - lo) / (hi - lo) * pw

    def y(gbps: float) -> float:
        return _TOP + ph - gbps / top * ph

    out = _open(
        "busbw", _W, _H, chart["title"], world_size=chart.get("world_size"), baseline_run=chart.get("baseline_run")
    )
    xstep = max(1, math.ceil((hi - lo) / 8))  # at most about 8 size labels
    for exp in range(lo, hi + 1, xstep):
        px = x(2**exp)
        out.append(f'<line class="grid" x1="{_f(px)}" y1="{_TOP}" x2="{_f(px)}" y2="{_TOP + ph}"/>')
        out.append(f'<text x="{_f(px)}" y="{_TOP + ph + 16}" text-anchor="middle">{_e(size_text(2**exp))}</text>')
    for i in range(int(round(top / ystep)) + 1):
        py = y(i * ystep)
        out.append(f'<line class="grid" x1="{_LEFT}" y1="{_f(py)}" x2="{_LEFT + pw}" y2="{_f(py)}"/>')
        out.append(
            f'<text x="{_LEFT - 6}" y="{_f(py + 4)}" text-anchor="end">{_e(fmt_scalar(float(i * ystep)))}</text>'
        )
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}"/>')
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}"/>')
    out.append(f'<text x="{_f(_LEFT + pw / 2)}" y="{_H - 8}" text-anchor="middle">message size (log2 scale)</text>')
    out.append(
        f'<text x="14" y="{_f(_TOP + ph / 2)}" text-anchor="middle" transform="rotate(-90 14 {_f(_TOP + ph / 2)})">busbw (GB/s)</text>'
    )
    ly = _TOP + 10
    for i, line in enumerate(chart["lines"]):
        color = PALETTE[i % len(PALETTE)]
        label = _e(line["label"])
        coords = " ".join(f"{_f(x(s))},{_f(y(b))}" for s, b in line["points"])
        out.append(f'<g class="line" data-line="{label}" data-status="{_e(line["status"])}">')
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        for s, b in line["points"]:
            tip = f"{line['label']}, {size_text(s)}: {fmt_scalar(b)} GB/s"
            out.append(
                f'<circle cx="{_f(x(s))}" cy="{_f(y(b))}" r="3" fill="{color}" data-size="{s}" data-gbps="{b}">'
                f"<title>{_e(tip)}</title></circle>"
            )
        out.append("</g>")
        if line.get("baseline"):
            coords = " ".join(f"{_f(x(s))},{_f(y(b))}" for s, b in line["baseline"])
            out.append(f'<g class="baseline" data-line="{label}">')
            out.append(f'<polyline class="base" stroke="{color}" points="{coords}"/>')
            for s, b in line["baseline"]:
                tip = f"{line['label']}, {size_text(s)}: baseline run {chart.get('baseline_run')} {fmt_scalar(b)} GB/s"
                out.append(
                    f'<rect class="base" x="{_f(x(s) - 3)}" y="{_f(y(b) - 3)}" width="6" height="6" stroke="{color}" '
                    f'data-size="{s}" data-gbps="{b}"><title>{_e(tip)}</title></rect>'
                )
            out.append("</g>")
        out.append(
            f'<line x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">{label} ({_e(line["status"])})</text>')
        ly += 18
    if chart.get("baseline_run"):
        out.append(
            f'<line class="base" x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 32}" y2="{ly}" stroke="#57606a"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">baseline {_e(chart["baseline_run"])}</text>')
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- the soak


def _time_text(s: float) -> str:
    if s >= 7200:
        return f"{s / 3600:g} h"
    if s >= 120:
        return f"{s / 60:g} min"
    return f"{s:g} s"


def _time_ticks(span: float) -> list[float]:
    for step in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800):
        if span / step <= 10:
            return [i * step for i in range(int(span // step) + 1)]
    return [0.0, span]


_SW, _SLEFT, _SRIGHT, _STOP, _LANE, _GAP = 1000, 190, 64, 30, 46, 8


def soak_svg(t: dict) -> str:
    """One lane per GPU and figure: each window's figure at its middle, the windows below the limit red, the
    disturbed ones shaded (their figure, left out of the judgement, hollow), the limit dashed, the foreign
    processes' spans over the lanes of their GPU."""
    lanes = t["lanes"]
    span = max(t["span_s"], t["window_s"] or 1.0, 1.0)
    pw = _SW - _SLEFT - _SRIGHT
    height = _STOP + len(lanes) * (_LANE + _GAP) + 34

    def x(s: float) -> float:
        return _SLEFT + max(0.0, min(s, span)) / span * pw

    title = f"{t['title']}: {t.get('n_windows')} window(s) of {fmt_scalar(t['window_s'])} s on each GPU"
    out = _open("soak", _SW, height, title, windows=t.get("n_windows"), window_s=t["window_s"])
    bottom = _STOP + len(lanes) * (_LANE + _GAP)
    for s in _time_ticks(span):
        out.append(f'<line class="grid" x1="{_f(x(s))}" y1="{_STOP}" x2="{_f(x(s))}" y2="{bottom}"/>')
        out.append(f'<text x="{_f(x(s))}" y="{bottom + 14}" text-anchor="middle">{_e(_time_text(s))}</text>')
    out.append(f'<text x="{_f(_SLEFT + pw / 2)}" y="{bottom + 30}" text-anchor="middle">time into the soak</text>')
    for i, lane in enumerate(lanes):
        y0 = _STOP + i * (_LANE + _GAP)
        judged = [w["value"] for w in lane["windows"] if w["value"] is not None]
        left_out = [w["disturbed_value"] for w in lane["windows"] if isinstance(w["disturbed_value"], (int, float))]
        vals = judged + left_out
        labelled = judged or left_out
        span_text = f"{figure_text(min(labelled))} to {figure_text(max(labelled))} {lane['unit']}" + (
            "" if judged else ", left out"
        )
        lo, hi = _range(vals + ([lane["limit"]] if lane["limit"] is not None else []))

        def y(v: float, lo=lo, hi=hi, y0=y0) -> float:
            return y0 + _LANE - (v - lo) / (hi - lo) * _LANE

        disturbed = [w for w in lane["windows"] if w["disturbed"]]
        out.append(
            f'<g class="lane" data-gpu="{_e(lane["index"] if lane["index"] is not None else "all")}" '
            f'data-metric="{_e(lane["metric"])}" data-windows="{" ".join(str(w["index"]) for w in lane["windows"])}" '
            f'data-disturbed="{" ".join(str(w["index"]) for w in disturbed)}" '
            f'data-remeasured="{" ".join(str(w["index"]) for w in lane["windows"] if w["remeasured"])}">'
        )
        out.append(f'<rect class="lane-bg" x="{_SLEFT}" y="{y0}" width="{pw}" height="{_LANE}"/>')
        out.append(
            f'<text x="{_SLEFT - 8}" y="{y0 + 18}" text-anchor="end" class="strong">{_e(lane["gpu"])} {_e(lane["label"])}</text>'
        )
        out.append(f'<text x="{_SLEFT - 8}" y="{y0 + 34}" text-anchor="end">{_e(span_text)}</text>')
        for p in t["foreign"]:
            if p.get("index") == lane["index"]:
                x0, x1 = x(p["first_s"]), x(p["last_s"] if p.get("last_s") is not None else p["first_s"])
                tip = f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB) on GPU {p['index']} from {fmt_scalar(p['first_s'])} s to {fmt_scalar(p.get('last_s'))} s"
                out.append(
                    f'<rect class="foreign" x="{_f(x0)}" y="{y0}" width="{_f(max(2.0, x1 - x0))}" height="{_LANE}" '
                    f'data-pid="{_e(p["pid"])}" data-gpu="{_e(p["index"])}"><title>{_e(tip)}</title></rect>'
                )
        for w in lane["windows"]:
            if w["remeasured"]:
                start = w["start_s"] or 0.0
                out.append(
                    f'<rect class="again" x="{_f(x(start))}" y="{y0}" width="{_f(max(2.0, x(start + t["window_s"]) - x(start)))}" '
                    f'height="{_LANE}" data-window="{w["index"]}"><title>window {w["index"]}: measured again once the '
                    "GPUs were quiet</title></rect>"
                )
        for w in disturbed:
            start = w["start_s"] or 0.0
            tip = f"window {w['index']} disturbed: left out of the judgement" + (
                f"; measured {figure_text(w['disturbed_value'])} {lane['unit']} beside another process"
                if isinstance(w["disturbed_value"], (int, float))
                else ""
            )
            out.append(
                f'<rect class="disturbed" x="{_f(x(start))}" y="{y0}" width="{_f(max(2.0, x(start + t["window_s"]) - x(start)))}" '
                f'height="{_LANE}" data-window="{w["index"]}"><title>{_e(tip)}</title></rect>'
            )
            if isinstance(w["disturbed_value"], (int, float)):
                out.append(
                    f'<circle class="dv" cx="{_f(x(start + t["window_s"] / 2))}" cy="{_f(y(w["disturbed_value"]))}" r="3" '
                    f'data-window="{w["index"]}"/>'
                )
        if lane["limit"] is not None:
            ly = y(lane["limit"])
            tip = (
                f"limit: {fmt_scalar(t['limit_pct'])}% below the best windows ({figure_text(lane['best'])} "
                f"{lane['unit']}): {figure_text(lane['limit'])}"
            )
            out.append(
                f'<line class="limit" x1="{_SLEFT}" y1="{_f(ly)}" x2="{_SLEFT + pw}" y2="{_f(ly)}" '
                f'data-value="{lane["limit"]:.4g}"><title>{_e(tip)}</title></line>'
            )
            out.append(f'<text x="{_SLEFT + pw + 4}" y="{_f(ly + 4)}">-{_e(fmt_scalar(t["limit_pct"]))}%</text>')
        shown = [w for w in lane["windows"] if w["value"] is not None]
        mid = lambda w: (w["start_s"] or 0.0) + t["window_s"] / 2  # noqa: E731
        if shown:
            coords = " ".join(f"{_f(x(mid(w)))},{_f(y(w['value']))}" for w in shown)
            out.append(f'<polyline class="figure" points="{coords}"/>')
        for w in shown:
            if w["below"] or len(shown) <= 60:
                cls = "slow" if w["below"] else "pt"
                tip = f"window {w['index']} from {fmt_scalar(w['start_s'])} s: {figure_text(w['value'])} {lane['unit']}"
                out.append(
                    f'<circle class="{cls}" cx="{_f(x(mid(w)))}" cy="{_f(y(w["value"]))}" r="{3 if w["below"] else 2}" '
                    f'data-window="{w["index"]}"><title>{_e(tip)}</title></circle>'
                )
        out.append("</g>")
    for j, p in enumerate(t["foreign"]):
        text = f"pid {p['pid']} {p.get('name') or ''} on GPU {p.get('index')}"
        out.append(f'<text class="foreign-label" x="{_f(x(p["first_s"]))}" y="{12 + (j % 2) * 12}">{_e(text)}</text>')
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- each GPU beside its siblings

_BW, _BH, _BLEFT, _BRIGHT, _BTOP, _BBOTTOM = 560, 260, 64, 12, 14, 72


def bars_svg(panel: dict) -> str:
    """A bar per GPU (coloured by how the fleet judged it against its siblings), a black tick at what it was held
    against, a purple diamond at the baseline run's figure for it, a grey ring at its usual place among its
    siblings, the siblings' limit (amber, dashed) and the benchmark's floor (red, dashed). The axis does not
    start at zero: the differences that matter are a few percent."""
    gpus = panel["gpus"]
    marks = [g["value"] for g in gpus] + [
        v for g in gpus for v in (g["reference"], g["baseline"], g["usual"]) if isinstance(v, (int, float))
    ]
    marks += [v for v in (panel["sibling_limit"], panel["floor"]) if isinstance(v, (int, float))]
    lo, hi = _range(marks)
    lo = max(0.0, lo)
    pw, ph = _BW - _BLEFT - _BRIGHT, _BH - _BTOP - _BBOTTOM

    def y(v: float) -> float:
        return _BTOP + ph - (v - lo) / (hi - lo) * ph

    title = f"{panel['label']} per GPU ({panel['unit']})"
    out = _open("bars", _BW, _BH, title, metric=panel["metric"])
    for v in _ticks(lo, hi, 4):
        out.append(f'<line class="grid" x1="{_BLEFT}" y1="{_f(y(v))}" x2="{_BLEFT + pw}" y2="{_f(y(v))}"/>')
        out.append(f'<text x="{_BLEFT - 6}" y="{_f(y(v) + 4)}" text-anchor="end">{_e(figure_text(v))}</text>')
    slot = pw / max(1, len(gpus))
    bw = min(44.0, slot * 0.6)
    for i, g in enumerate(gpus):
        cx = _BLEFT + slot * (i + 0.5)
        top = y(g["value"])
        tip = f"{g['gpu']}: {figure_text(g['value'])} {panel['unit']}"
        if g["reference"] is not None:
            tip += f"; {fmt_scalar(g['deviation_pct'])}% against {figure_text(g['reference'])}"
        if g["baseline"] is not None:
            tip += f"; baseline run {figure_text(g['baseline'])}"
        out.append(
            f'<g class="gpu" data-gpu="{_e(g["index"] if g["index"] is not None else g["gpu"])}" data-value="{g["value"]}" '
            f'data-status="{_e(g["status"])}"><title>{_e(tip)}</title>'
        )
        out.append(
            f'<rect class="bar s-{_e(g["status"])}" x="{_f(cx - bw / 2)}" y="{_f(top)}" width="{_f(bw)}" height="{_f(_BTOP + ph - top)}"/>'
        )
        if g["reference"] is not None:
            ry = y(g["reference"])
            out.append(
                f'<line class="ref" x1="{_f(cx - bw / 2 - 4)}" y1="{_f(ry)}" x2="{_f(cx + bw / 2 + 4)}" y2="{_f(ry)}"/>'
            )
        if g["usual"] is not None:
            out.append(f'<circle class="usual" cx="{_f(cx + bw / 2 + 6)}" cy="{_f(y(g["usual"]))}" r="3.5"/>')
        if g["baseline"] is not None:
            by = y(g["baseline"])
            out.append(f'<path class="past" d="M{_f(cx)} {_f(by - 5)}l5 5l-5 5l-5 -5z" data-value="{g["baseline"]}"/>')
        out.append(f'<text x="{_f(cx)}" y="{_BTOP + ph + 14}" text-anchor="middle">{_e(g["gpu"])}</text>')
        out.append(
            f'<text x="{_f(cx)}" y="{_BTOP + ph + 27}" text-anchor="middle" class="strong">{_e(figure_text(g["value"]))}</text>'
        )
        out.append("</g>")
    for cls, value, text in (
        ("sibling-limit", panel["sibling_limit"], f"siblings' limit -{fmt_scalar(panel['sibling_limit_pct'])}%"),
        ("floor", panel["floor"], f"{panel['floor_key']} {figure_text(panel['floor'])}"),
    ):
        if isinstance(value, (int, float)):
            out.append(
                f'<line class="{cls}" x1="{_BLEFT}" y1="{_f(y(value))}" x2="{_BLEFT + pw}" y2="{_f(y(value))}" data-value="{value:.6g}">'
                f"<title>{_e(text)}</title></line>"
            )
    present = {
        "ref": any(g["reference"] is not None for g in gpus),
        "past": any(g["baseline"] is not None for g in gpus),
        "usual": any(g["usual"] is not None for g in gpus),
        "sibling-limit": isinstance(panel["sibling_limit"], (int, float)),
        "floor": isinstance(panel["floor"], (int, float)),
    }
    legend = (
        ("ref", "held against"),
        ("past", "baseline run"),
        ("usual", "usual place"),
        ("sibling-limit", "siblings' limit"),
        ("floor", "floor"),
    )
    lx, ly = _BLEFT, _BH - 14
    out.append('<g class="legend">')
    for cls, text in legend:
        if not present[cls]:
            continue
        if cls in ("ref", "sibling-limit", "floor"):
            out.append(f'<line class="{cls}" x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}"/>')
        elif cls == "past":
            out.append(f'<path class="past" d="M{lx + 8} {ly - 9}l5 5l-5 5l-5 -5z"/>')
        else:
            out.append(f'<circle class="usual" cx="{lx + 8}" cy="{ly - 4}" r="3.5"/>')
        out.append(f'<text x="{lx + 20}" y="{ly}">{_e(text)}</text>')
        lx += 24 + 7 * len(text)
    out.append("</g>")
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- the fleet


_DW, _DH, _DLEFT, _DRIGHT, _DTOP = 1000, 236, 40, 40, 18
_HIST_H, _BOX_Y, _STRIP_Y = 90, 128, 160


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
    out = _open("distribution", _DW, _DH, title, column=d["column"], nodes=d["n"])
    for lo, hi, x0, x1 in segments:
        ticks = _ticks(lo, hi, max(2, int((x1 - x0) / 110))) if (lo, hi) == (low, high) else [lo if lo < low else hi]
        for v in ticks:
            out.append(f'<line class="grid" x1="{_f(x(v))}" y1="{_DTOP}" x2="{_f(x(v))}" y2="{_STRIP_Y + 8}"/>')
            out.append(f'<text x="{_f(x(v))}" y="{_DH - 30}" text-anchor="middle">{_e(figure_text(v))}</text>')
        out.append(f'<line class="axis" x1="{_f(x0)}" y1="{_STRIP_Y}" x2="{_f(x1)}" y2="{_STRIP_Y}"/>')
    for lo, hi, x0, x1 in segments[:-1]:  # the axis breaks
        out.append(f'<text x="{_f(x1 + 8)}" y="{_STRIP_Y + 4}" text-anchor="middle" class="break">//</text>')
    for i, c in enumerate(counts):
        if not c:
            continue
        a = low + i * width
        h = c / top * _HIST_H
        tip = f"{c} node(s) from {figure_text(a)} to {figure_text(a + width)} {d['unit']}"
        out.append(
            f'<rect class="bin" x="{_f(x(a))}" y="{_f(_DTOP + _HIST_H - h)}" width="{_f(max(1.0, x(a + width) - x(a) - 1))}" '
            f'height="{_f(h)}" data-count="{c}"><title>{_e(tip)}</title></rect>'
        )
    q = (
        f"quartiles {figure_text(d['q1'])} / {figure_text(d['median'])} / {figure_text(d['q3'])}; "
        f"slowest {figure_text(d['min'])}, fastest {figure_text(d['max'])}"
    )
    out.append(f'<g class="box"><title>{_e(q)}</title>')
    out.append(
        f'<line class="whisker" x1="{_f(x(min(inside)))}" y1="{_BOX_Y}" x2="{_f(x(max(inside)))}" y2="{_BOX_Y}"/>'
    )
    out.append(
        f'<rect class="iqr" x="{_f(x(d["q1"]))}" y="{_BOX_Y - 8}" width="{_f(max(1.0, x(d["q3"]) - x(d["q1"])))}" height="16"/>'
    )
    out.append(
        f'<line class="med" x1="{_f(x(d["median"]))}" y1="{_BOX_Y - 8}" x2="{_f(x(d["median"]))}" y2="{_BOX_Y + 8}"/>'
    )
    out.append("</g>")
    for cls, v, text in (
        ("fleet-median", d["fleet_median"], "fleet median"),
        ("base-median", d["baseline"], "baseline run's fleet median"),
    ):
        if isinstance(v, (int, float)):
            tip = f"{text} {figure_text(v)} {d['unit']}"
            out.append(
                f'<line class="{cls}" x1="{_f(x(v))}" y1="{_DTOP - 6}" x2="{_f(x(v))}" y2="{_BOX_Y + 10}" data-value="{v}">'
                f"<title>{_e(tip)}</title></line>"
            )
    for b in d["beyond"]:  # each node outside the bulk (an outlier among them is drawn again, coloured, below)
        tip = f"{b['host']}: {figure_text(b['value'])} {d['unit']} ({b['status']})"
        out.append(
            f'<circle class="beyond" cx="{_f(x(b["value"]))}" cy="{_STRIP_Y}" r="3" data-host="{_e(b["host"])}">'
            f"<title>{_e(tip)}</title></circle>"
        )
    for i, o in enumerate(d["outliers"]):
        ox = x(o["value"])
        tip = f"{o['host']}: {figure_text(o['value'])} {d['unit']} ({o['status']})"
        out.append(
            f'<g class="outlier" data-host="{_e(o["host"])}" data-value="{o["value"]}" data-status="{_e(o["status"])}">'
            f'<title>{_e(tip)}</title><circle class="s-{_e(o["status"])}" cx="{_f(ox)}" cy="{_STRIP_Y}" r="4"/>'
        )
        if i < named:
            ty = _STRIP_Y + 16 + (i % 3) * 11
            anchor = "end" if ox > _DLEFT + pw * 0.8 else "start"
            out.append(f'<text x="{_f(ox)}" y="{ty}" text-anchor="{anchor}" class="name">{_e(o["host"])}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
