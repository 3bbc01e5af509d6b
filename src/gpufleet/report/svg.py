"""The pictures of report.html, drawn as inline SVG by the report itself: no script, no font or file fetched, so
the page opens on a laptop with no network. Each picture is well-formed XML (every text escaped), and carries
what it shows as data attributes (data-gpu, data-window, data-size, data-host, ...), so that tests read it back.

    busbw_svg(chart)          NCCL busbw against message size (log2), one line per collective, the baseline dashed
    bars_svg(panel)           one figure per GPU: each GPU's bar, its siblings' median, its past, the limits
    (svg_soak.py: the soak window by window; svg_fleet.py: the fleet's figures over its nodes)

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


# ---------------------------------------------------------------- each GPU beside its siblings

_BW, _BH, _BLEFT, _BRIGHT, _BTOP, _BBOTTOM = 560, 260, 64, 12, 14, 72


def _break_mark(x0: float, y0: float, cls: str, width: float = 12.0) -> str:
    """A zigzag across an axis or a bar: the scale is broken here (it does not start at zero)."""
    teeth = max(2, int(width // 6))
    step = width / teeth
    points = " ".join(f"{num(x0 + i * step)},{num(y0 + (3 if i % 2 else -3))}" for i in range(teeth + 1))
    return f'<polyline class="{cls}" points="{points}"/>'


def bars_svg(panel: dict) -> str:
    """A bar per GPU (coloured by how the fleet judged it against its siblings), a black tick at what it was held
    against, a purple diamond at the baseline run's figure for it, a grey ring at its usual place among its
    siblings, the siblings' limit (amber, dashed) and the benchmark's floor (red, dashed); a bar under the floor is
    red whatever its siblings say. The differences that matter are a few percent, so the axis starts above zero
    where the figures allow: the break is marked on the axis and every bar (//), and where the scale starts is
    written under it. The scale runs from gridline to gridline: no bar passes the top one."""
    gpus = panel["gpus"]
    marks = [g["value"] for g in gpus] + [
        v for g in gpus for v in (g["reference"], g["baseline"], g["usual"]) if isinstance(v, (int, float))
    ]
    marks += [v for v in (panel["sibling_limit"], panel["floor"]) if isinstance(v, (int, float))]
    lo, hi = padded(marks)
    step = nice_step(hi - max(0.0, lo), 4)
    lo, hi = max(0.0, float(math.floor(lo / step) * step)), float(math.ceil(hi / step) * step)
    broken = lo > 0
    pw, ph = _BW - _BLEFT - _BRIGHT, _BH - _BTOP - _BBOTTOM

    def y(v: float) -> float:
        return _BTOP + ph - (v - lo) / (hi - lo) * ph

    title = f"{panel['label']} per GPU ({panel['unit']})"
    out = svg_open("bars", _BW, _BH, title, metric=panel["metric"], axis_from=lo)
    for i in range(int(round((hi - lo) / step)) + 1):
        v = lo + i * step
        out.append(f'<line class="grid" x1="{_BLEFT}" y1="{num(y(v))}" x2="{_BLEFT + pw}" y2="{num(y(v))}"/>')
        out.append(f'<text x="{_BLEFT - 6}" y="{num(y(v) + 4)}" text-anchor="end">{esc(fmt_scalar(v))}</text>')
    out.append(f'<line class="axis" x1="{_BLEFT}" y1="{_BTOP}" x2="{_BLEFT}" y2="{_BTOP + ph}"/>')
    if broken:
        out.append(_break_mark(_BLEFT, _BTOP + ph - 6, "axis-break"))
        out.append(
            f'<text class="break" x="{_BLEFT - 6}" y="{_BTOP + ph + 40}" text-anchor="start">'
            f"// the scale starts at {esc(fmt_scalar(lo))} {esc(panel['unit'])}, not at zero</text>"
        )
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
        under = isinstance(panel["floor"], (int, float)) and g["value"] < panel["floor"]
        status = "fail" if under else g["status"]
        out.append(
            f'<rect class="bar s-{esc(status)}{" under-floor" if under else ""}" x="{num(cx - bw / 2)}" y="{num(top)}" '
            f'width="{num(bw)}" height="{num(_BTOP + ph - top)}"/>'
        )
        if broken:
            out.append(_break_mark(cx - bw / 2 - 2, _BTOP + ph - 10, "bar-break", bw + 4))
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
