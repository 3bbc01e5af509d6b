"""The pictures of report.html, drawn as inline SVG by the report itself: no script, no font or file fetched, so
the page opens on a laptop with no network. Each picture is well-formed XML (every text escaped), and carries
what it shows as data attributes (data-gpu, data-window, data-size, data-host, ...), so that tests read it back.

    busbw_svg(chart)          NCCL busbw against message size (log2), one line per collective, the baseline dashed
    soak_svg(timeline)        a soak's windows per GPU and figure against time: the limit, the disturbed windows,
                              the foreign processes' spans
    bars_svg(panel)           one figure per GPU: each GPU's bar, its siblings' median, its past, the limits
    (svg_fleet.py: the fleet's figures over its nodes)

The data comes from figures.py; the CSS classes (grid, axis, limit, ...) are styled by render_html.
"""

from __future__ import annotations

import html
import math
from typing import Any

from gpufleet.comparisons import figure_text
from gpufleet.report.formatting import fmt_scalar
from gpufleet.base.schema import size_text

PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#9a6700", "#57606a")


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def num(v: float) -> str:
    return f"{v:.1f}"


def nice_step(span: float, ticks: int = 5) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals over `span`."""
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def ticks(lo: float, hi: float, ticks: int = 5) -> list[float]:
    step = nice_step(hi - lo, ticks)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def svg_open(kind: str, width: int, height: int, title: str, **data) -> list[str]:
    attrs = "".join(f' data-{k.replace("_", "-")}="{esc(v)}"' for k, v in data.items() if v is not None)
    return [
        f'<svg class="chart {kind}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}"{attrs}>',
        f"<title>{esc(title)}</title>",
    ]


def padded(values: list[float], pad: float = 0.02) -> tuple[float, float]:
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

    out = svg_open(
        "busbw", _W, _H, chart["title"], world_size=chart.get("world_size"), baseline_run=chart.get("baseline_run")
    )
    xstep = max(1, math.ceil((hi - lo) / 8))  # at most about 8 size labels
    for exp in range(lo, hi + 1, xstep):
        px = x(2**exp)
        out.append(f'<line class="grid" x1="{num(px)}" y1="{_TOP}" x2="{num(px)}" y2="{_TOP + ph}"/>')
        out.append(f'<text x="{num(px)}" y="{_TOP + ph + 16}" text-anchor="middle">{esc(size_text(2**exp))}</text>')
    for i in range(int(round(top / ystep)) + 1):
        py = y(i * ystep)
        out.append(f'<line class="grid" x1="{_LEFT}" y1="{num(py)}" x2="{_LEFT + pw}" y2="{num(py)}"/>')
        out.append(
            f'<text x="{_LEFT - 6}" y="{num(py + 4)}" text-anchor="end">{esc(fmt_scalar(float(i * ystep)))}</text>'
        )
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}"/>')
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}"/>')
    out.append(f'<text x="{num(_LEFT + pw / 2)}" y="{_H - 8}" text-anchor="middle">message size (log2 scale)</text>')
    out.append(
        f'<text x="14" y="{num(_TOP + ph / 2)}" text-anchor="middle" transform="rotate(-90 14 {num(_TOP + ph / 2)})">busbw (GB/s)</text>'
    )
    ly = _TOP + 10
    for i, line in enumerate(chart["lines"]):
        color = PALETTE[i % len(PALETTE)]
        label = esc(line["label"])
        out += _curve("line", line, line["points"], color, x, y, "")
        if line.get("baseline"):
            out += _curve("baseline", line, line["baseline"], color, x, y, f"baseline run {chart.get('baseline_run')} ")
        out.append(
            f'<line x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">{label} ({esc(line["status"])})</text>')
        ly += 18
    if chart.get("baseline_run"):
        out.append(
            f'<line class="base" x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 32}" y2="{ly}" stroke="#57606a"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">baseline {esc(chart["baseline_run"])}</text>')
    out.append("</svg>")
    return "".join(out)


def _curve(kind: str, line: dict, points: list, color: str, x, y, whose: str) -> list[str]:
    """One collective's curve: this run's (`line`: solid, dots) or the baseline's (`baseline`: dashed, squares),
    each point with its size and figure as data and a tooltip."""
    label = esc(line["label"])
    coords = " ".join(f"{num(x(s))},{num(y(b))}" for s, b in points)
    out = [
        f'<g class="{kind}" data-line="{label}"' + (f' data-status="{esc(line["status"])}">' if kind == "line" else ">")
    ]
    if kind == "line":
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
    else:
        out.append(f'<polyline class="base" stroke="{color}" points="{coords}"/>')
    for s, b in points:
        tip = esc(f"{line['label']}, {size_text(s)}: {whose}{fmt_scalar(b)} GB/s")
        data = f'data-size="{s}" data-gbps="{b}"><title>{tip}</title>'
        if kind == "line":
            out.append(f'<circle cx="{num(x(s))}" cy="{num(y(b))}" r="3" fill="{color}" {data}</circle>')
        else:
            out.append(
                f'<rect class="base" x="{num(x(s) - 3)}" y="{num(y(b) - 3)}" width="6" height="6" stroke="{color}" {data}</rect>'
            )
    return out + ["</g>"]


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
    out = svg_open("soak", _SW, height, title, windows=t.get("n_windows"), window_s=t["window_s"])
    bottom = _STOP + len(lanes) * (_LANE + _GAP)
    for s in _time_ticks(span):
        out.append(f'<line class="grid" x1="{num(x(s))}" y1="{_STOP}" x2="{num(x(s))}" y2="{bottom}"/>')
        out.append(f'<text x="{num(x(s))}" y="{bottom + 14}" text-anchor="middle">{esc(_time_text(s))}</text>')
    out.append(f'<text x="{num(_SLEFT + pw / 2)}" y="{bottom + 30}" text-anchor="middle">time into the soak</text>')
    for i, lane in enumerate(lanes):
        y0 = _STOP + i * (_LANE + _GAP)
        judged = [w["value"] for w in lane["windows"] if w["value"] is not None]
        left_out = [w["disturbed_value"] for w in lane["windows"] if isinstance(w["disturbed_value"], (int, float))]
        vals = judged + left_out
        labelled = judged or left_out
        span_text = f"{figure_text(min(labelled))} to {figure_text(max(labelled))} {lane['unit']}" + (
            "" if judged else ", left out"
        )
        lo, hi = padded(vals + ([lane["limit"]] if lane["limit"] is not None else []))

        def y(v: float, lo=lo, hi=hi, y0=y0) -> float:
            return y0 + _LANE - (v - lo) / (hi - lo) * _LANE

        disturbed = [w for w in lane["windows"] if w["disturbed"]]
        kept_apart = [w for w in lane["windows"] if w["disturbed"] or w.get("slowed")]
        out.append(
            f'<g class="lane" data-gpu="{esc(lane["index"] if lane["index"] is not None else "all")}" '
            f'data-metric="{esc(lane["metric"])}" data-windows="{" ".join(str(w["index"]) for w in lane["windows"])}" '
            f'data-disturbed="{" ".join(str(w["index"]) for w in disturbed)}" '
            f'data-remeasured="{" ".join(str(w["index"]) for w in lane["windows"] if w["remeasured"])}">'
        )
        out.append(f'<rect class="lane-bg" x="{_SLEFT}" y="{y0}" width="{pw}" height="{_LANE}"/>')
        out.append(
            f'<text x="{_SLEFT - 8}" y="{y0 + 18}" text-anchor="end" class="strong">{esc(lane["gpu"])} {esc(lane["label"])}</text>'
        )
        out.append(f'<text x="{_SLEFT - 8}" y="{y0 + 34}" text-anchor="end">{esc(span_text)}</text>')
        for p in t["foreign"]:
            if p.get("index") == lane["index"]:
                x0, x1 = x(p["first_s"]), x(p["last_s"] if p.get("last_s") is not None else p["first_s"])
                tip = f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB) on GPU {p['index']} from {fmt_scalar(p['first_s'])} s to {fmt_scalar(p.get('last_s'))} s"
                out.append(
                    f'<rect class="foreign" x="{num(x0)}" y="{y0}" width="{num(max(2.0, x1 - x0))}" height="{_LANE}" '
                    f'data-pid="{esc(p["pid"])}" data-gpu="{esc(p["index"])}"><title>{esc(tip)}</title></rect>'
                )
        for w in lane["windows"]:
            if w["remeasured"]:
                start = w["start_s"] or 0.0
                out.append(
                    f'<rect class="again" x="{num(x(start))}" y="{y0}" width="{num(max(2.0, x(start + t["window_s"]) - x(start)))}" '
                    f'height="{_LANE}" data-window="{w["index"]}"><title>window {w["index"]}: measured again once the '
                    "GPUs were quiet</title></rect>"
                )
        for w in kept_apart:
            start = w["start_s"] or 0.0
            kind = "disturbed" if w["disturbed"] else "slowed"
            what, beside = {
                "disturbed": ("disturbed: left out of the judgement", " beside another process"),
                "slowed": ("past a limit with nothing seen: measured again, left out", ""),
            }[kind]
            tip = f"window {w['index']} {what}" + (
                f"; measured {figure_text(w['disturbed_value'])} {lane['unit']}{beside}"
                if isinstance(w["disturbed_value"], (int, float))
                else ""
            )
            out.append(
                f'<rect class="{kind}" x="{num(x(start))}" y="{y0}" width="{num(max(2.0, x(start + t["window_s"]) - x(start)))}" '
                f'height="{_LANE}" data-window="{w["index"]}"><title>{esc(tip)}</title></rect>'
            )
            if isinstance(w["disturbed_value"], (int, float)):
                out.append(
                    f'<circle class="dv" cx="{num(x(start + t["window_s"] / 2))}" cy="{num(y(w["disturbed_value"]))}" r="3" '
                    f'data-window="{w["index"]}"/>'
                )
        if lane["limit"] is not None:
            ly = y(lane["limit"])
            tip = (
                f"limit: {fmt_scalar(t['limit_pct'])}% below the best windows ({figure_text(lane['best'])} "
                f"{lane['unit']}): {figure_text(lane['limit'])}"
            )
            out.append(
                f'<line class="limit" x1="{_SLEFT}" y1="{num(ly)}" x2="{_SLEFT + pw}" y2="{num(ly)}" '
                f'data-value="{lane["limit"]:.4g}"><title>{esc(tip)}</title></line>'
            )
            out.append(f'<text x="{_SLEFT + pw + 4}" y="{num(ly + 4)}">-{esc(fmt_scalar(t["limit_pct"]))}%</text>')
        shown = [w for w in lane["windows"] if w["value"] is not None]
        mid = lambda w: (w["start_s"] or 0.0) + t["window_s"] / 2  # noqa: E731
        if shown:
            coords = " ".join(f"{num(x(mid(w)))},{num(y(w['value']))}" for w in shown)
            out.append(f'<polyline class="figure" points="{coords}"/>')
        for w in shown:
            if w["below"] or len(shown) <= 60:
                cls = "slow" if w["below"] else "pt"
                tip = f"window {w['index']} from {fmt_scalar(w['start_s'])} s: {figure_text(w['value'])} {lane['unit']}"
                out.append(
                    f'<circle class="{cls}" cx="{num(x(mid(w)))}" cy="{num(y(w["value"]))}" r="{3 if w["below"] else 2}" '
                    f'data-window="{w["index"]}"><title>{esc(tip)}</title></circle>'
                )
        out.append("</g>")
    for j, p in enumerate(t["foreign"]):
        text = f"pid {p['pid']} {p.get('name') or ''} on GPU {p.get('index')}"
        out.append(f'<text class="foreign-label" x="{num(x(p["first_s"]))}" y="{12 + (j % 2) * 12}">{esc(text)}</text>')
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
    lo, hi = padded(marks)
    lo = max(0.0, lo)
    pw, ph = _BW - _BLEFT - _BRIGHT, _BH - _BTOP - _BBOTTOM

    def y(v: float) -> float:
        return _BTOP + ph - (v - lo) / (hi - lo) * ph

    title = f"{panel['label']} per GPU ({panel['unit']})"
    out = svg_open("bars", _BW, _BH, title, metric=panel["metric"])
    for v in ticks(lo, hi, 4):
        out.append(f'<line class="grid" x1="{_BLEFT}" y1="{num(y(v))}" x2="{_BLEFT + pw}" y2="{num(y(v))}"/>')
        out.append(f'<text x="{_BLEFT - 6}" y="{num(y(v) + 4)}" text-anchor="end">{esc(figure_text(v))}</text>')
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
            f'<g class="gpu" data-gpu="{esc(g["index"] if g["index"] is not None else g["gpu"])}" data-value="{g["value"]}" '
            f'data-status="{esc(g["status"])}"><title>{esc(tip)}</title>'
        )
        out.append(
            f'<rect class="bar s-{esc(g["status"])}" x="{num(cx - bw / 2)}" y="{num(top)}" width="{num(bw)}" height="{num(_BTOP + ph - top)}"/>'
        )
        if g["reference"] is not None:
            ry = y(g["reference"])
            out.append(
                f'<line class="ref" x1="{num(cx - bw / 2 - 4)}" y1="{num(ry)}" x2="{num(cx + bw / 2 + 4)}" y2="{num(ry)}"/>'
            )
        if g["usual"] is not None:
            out.append(f'<circle class="usual" cx="{num(cx + bw / 2 + 6)}" cy="{num(y(g["usual"]))}" r="3.5"/>')
        if g["baseline"] is not None:
            by = y(g["baseline"])
            out.append(
                f'<path class="past" d="M{num(cx)} {num(by - 5)}l5 5l-5 5l-5 -5z" data-value="{g["baseline"]}"/>'
            )
        out.append(f'<text x="{num(cx)}" y="{_BTOP + ph + 14}" text-anchor="middle">{esc(g["gpu"])}</text>')
        out.append(
            f'<text x="{num(cx)}" y="{_BTOP + ph + 27}" text-anchor="middle" class="strong">{esc(figure_text(g["value"]))}</text>'
        )
        out.append("</g>")
    for cls, value, text in (
        ("sibling-limit", panel["sibling_limit"], f"siblings' limit -{fmt_scalar(panel['sibling_limit_pct'])}%"),
        ("floor", panel["floor"], f"{panel['floor_key']} {figure_text(panel['floor'])}"),
    ):
        if isinstance(value, (int, float)):
            out.append(
                f'<line class="{cls}" x1="{_BLEFT}" y1="{num(y(value))}" x2="{_BLEFT + pw}" y2="{num(y(value))}" data-value="{value:.6g}">'
                f"<title>{esc(text)}</title></line>"
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
        out.append(f'<text x="{lx + 20}" y="{ly}">{esc(text)}</text>')
        lx += 24 + 7 * len(text)
    out.append("</g>")
    out.append("</svg>")
    return "".join(out)
