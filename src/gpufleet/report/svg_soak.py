"""The soak's picture in report.html, drawn as inline SVG by the report itself (svg.py draws the other node pictures
and says how): soak_svg(timeline) draws, against time into the soak, one lane per GPU and figure (and NCCL's
all_reduce) with each window's figure, the limit, the windows kept apart and measured again; then per GPU what the
sampler saw in each window: its hottest temperature against its slowdown temperature, its power against its limit,
its SM clock, and the clock-event (throttle) reasons. Every foreign process is a span: over its GPU's lanes, or over
every lane for a process on the host's CPUs. Where nothing measured, the lines break and the span is marked. A
legend of swatches names each mark drawn. The data: soak_data.soak_timelines().
"""

from __future__ import annotations

from gpufleet.comparisons import figure_text
from gpufleet.report.formatting import fmt_scalar
from gpufleet.report.svg import esc, num, padded, svg_open

_SW, _SLEFT, _SRIGHT, _LANE, _GAP, _TEL, _REASONS = 1000, 190, 64, 46, 8, 30, 28
_LEGEND_ROW = 16
# Each telemetry lane per GPU: (what, the window's field drawn, a second field drawn as ticks, the unit, the limit's
# field in the telemetry and its words).
TELEMETRY_LANES = (
    ("temperature", "temperature_max_c", None, "°C", "slowdown_c", "slowdown"),
    ("power", "power_median_w", "power_max_w", "W", "power_limit_w", "limit"),
    ("SM clock", "sm_clock_median_mhz", "sm_clock_min_mhz", "MHz", None, None),
)


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


def _segments(points: list[tuple[float, float, float]], window_s: float) -> list[list[tuple[float, float]]]:
    """(start_s, middle_s, value or None) in time order -> runs of (middle_s, value) with no window missing between:
    a line never bridges a window that measured nothing."""
    runs: list[list[tuple[float, float]]] = []
    last_end = None
    for start, mid, value in points:
        if value is None:
            last_end = None
            continue
        if last_end is None or start - last_end > window_s * 0.1:
            runs.append([])
        runs[-1].append((mid, value))
        last_end = start + window_s
    return runs


def _legend(present: list[tuple[str, str]], y: float) -> list[str]:
    """A row of swatches, each the mark it names drawn small, wrapped to the picture's width."""
    out, x, row = ['<g class="legend">'], 8.0, 0
    for kind, text in present:
        width = 28 + 6.2 * len(text)
        if x + width > _SW - 8:
            x, row = 8.0, row + 1
        top = y + row * _LEGEND_ROW
        swatch = {
            "figure": f'<line class="figure" x1="{num(x)}" y1="{num(top + 6)}" x2="{num(x + 18)}" y2="{num(top + 6)}"/>'
            f'<circle class="pt" cx="{num(x + 9)}" cy="{num(top + 6)}" r="2"/>',
            "slow": f'<circle class="slow" cx="{num(x + 9)}" cy="{num(top + 6)}" r="3"/>',
            "dv": f'<circle class="dv" cx="{num(x + 9)}" cy="{num(top + 6)}" r="3"/>',
            "limit": f'<line class="limit" x1="{num(x)}" y1="{num(top + 6)}" x2="{num(x + 18)}" y2="{num(top + 6)}"/>',
        }.get(kind, f'<rect class="{kind}" x="{num(x)}" y="{num(top)}" width="18" height="12"/>')
        out.append(
            f'<g data-legend="{esc(kind)}">{swatch}<text x="{num(x + 22)}" y="{num(top + 10)}">{esc(text)}</text></g>'
        )
        x += width
    out.append("</g>")
    return out


LEGEND_WORDS = (
    ("figure", "each window's figure"),
    ("slow", "below the limit"),
    ("limit", "limit"),
    ("disturbed", "disturbed window (its figure hollow, left out)"),
    ("slowed", "slowed with nothing seen: measured again"),
    ("dv", "a figure left out"),
    ("again", "window measured again"),
    ("foreign", "process on a GPU"),
    ("foreign-host", "process on the host's CPUs"),
    ("gap", "not measured"),
    ("reason", "clock-event reason"),
)


def _present(t: dict) -> list[tuple[str, str]]:
    windows = [w for lane in t["lanes"] for w in lane["windows"]]
    seen = {
        "figure": any(w["value"] is not None for w in windows),
        "slow": any(w["below"] for w in windows),
        "limit": any(lane["limit"] is not None for lane in t["lanes"]),
        "disturbed": any(w["disturbed"] for w in windows),
        "slowed": any(w["slowed"] for w in windows),
        "dv": any(isinstance(w["disturbed_value"], (int, float)) for w in windows),
        "again": any(w["remeasured"] for w in windows),
        "foreign": any(p["kind"] == "gpu" for p in t["foreign"]),
        "foreign-host": any(p["kind"] == "host_cpu" for p in t["foreign"]),
        "gap": bool(t["gaps"]),
        "reason": any(w["reasons"] for g in t["telemetry"] for w in g["windows"]),
    }
    return [(kind, text) for kind, text in LEGEND_WORDS if seen[kind]]


def soak_svg(t: dict) -> str:
    """The soak's lanes, the sampler's lanes per GPU, every foreign process, the gaps and a legend (module docstring)."""
    lanes, telemetry = t["lanes"], t.get("telemetry") or []
    span = max(t["span_s"], t["window_s"] or 1.0, 1.0)
    pw = _SW - _SLEFT - _SRIGHT
    present = _present({**t, "telemetry": telemetry, "gaps": t.get("gaps") or []})
    legend_rows = 1 + int(sum(28 + 6.2 * len(text) for _, text in present) // (_SW - 16))
    top = 14 + legend_rows * _LEGEND_ROW + 18
    tel_h = sum(_TEL + _GAP for _ in TELEMETRY_LANES) + _REASONS + _GAP * 2
    bottom = top + len(lanes) * (_LANE + _GAP) + len(telemetry) * tel_h
    height = bottom + 34

    def x(s: float) -> float:
        return _SLEFT + max(0.0, min(s, span)) / span * pw

    title = f"{t['title']}: {t.get('n_windows')} window(s) of {fmt_scalar(t['window_s'])} s on each GPU"
    out = svg_open("soak", _SW, height, title, windows=t.get("n_windows"), window_s=t["window_s"])
    out += _legend(present, 8)
    for s in _time_ticks(span):
        out.append(f'<line class="grid" x1="{num(x(s))}" y1="{top}" x2="{num(x(s))}" y2="{bottom}"/>')
        out.append(f'<text x="{num(x(s))}" y="{bottom + 14}" text-anchor="middle">{esc(_time_text(s))}</text>')
    out.append(f'<text x="{num(_SLEFT + pw / 2)}" y="{bottom + 30}" text-anchor="middle">time into the soak</text>')
    rows_of: dict = {}  # GPU index -> (top, bottom) of its lanes, for its processes' spans
    y0 = top
    for lane in lanes:
        out += _figure_lane(lane, t, x, y0, pw)
        rows_of.setdefault(lane["index"], []).append((y0, y0 + _LANE))
        y0 += _LANE + _GAP
    for g in telemetry:
        start = y0
        y0 = _telemetry_lanes(out, g, t, x, y0, pw)
        rows_of.setdefault(g["index"], []).append((start, y0 - _GAP))
    for a, b in t.get("gaps") or []:
        out.append(
            f'<rect class="gap" x="{num(x(a))}" y="{top}" width="{num(max(1.0, x(b) - x(a)))}" height="{bottom - top}" '
            f'data-from="{a}" data-to="{b}"><title>{esc(f"from {fmt_scalar(a)} s to {fmt_scalar(b)} s: no window measured")}</title></rect>'
        )
    for p in t["foreign"]:
        rows = [(top, bottom)] if p["kind"] == "host_cpu" else rows_of.get(p["index"]) or [(top, bottom)]
        x0, x1 = x(p["first_s"]), x(p["last_s"])
        cls = "foreign-host" if p["kind"] == "host_cpu" else "foreign"
        where = "the host's CPUs" if p["kind"] == "host_cpu" else f"GPU {p['index']}"
        tip = f"{p['label']} on {where} from {fmt_scalar(p['first_s'])} s to {fmt_scalar(p['last_s'])} s"
        for a, b in rows:
            out.append(
                f'<rect class="{cls}" x="{num(x0)}" y="{num(a)}" width="{num(max(2.0, x1 - x0))}" height="{num(b - a)}" '
                f'data-pid="{esc(p["pid"])}" data-gpu="{esc(p["index"] if p["index"] is not None else "host")}" '
                f'data-kind="{esc(p["kind"])}"><title>{esc(tip)}</title></rect>'
            )
    for j, p in enumerate(t["foreign"]):
        where = "host CPUs" if p["kind"] == "host_cpu" else f"GPU {p.get('index')}"
        text = f"pid {p['pid']} {p.get('name') or ''} on {where}"
        out.append(
            f'<text class="foreign-label" x="{num(x(p["first_s"]))}" y="{num(top - 6 - (j % 2) * 11)}">{esc(text)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _figure_lane(lane: dict, t: dict, x, y0: float, pw: float) -> list[str]:
    judged = [w["value"] for w in lane["windows"] if w["value"] is not None]
    left_out = [w["disturbed_value"] for w in lane["windows"] if isinstance(w["disturbed_value"], (int, float))]
    labelled = judged or left_out
    span_text = f"{figure_text(min(labelled))} to {figure_text(max(labelled))} {lane['unit']}" + (
        "" if judged else ", left out"
    )
    lo, hi = padded(judged + left_out + ([lane["limit"]] if lane["limit"] is not None else []))

    def y(v: float) -> float:
        return y0 + _LANE - (v - lo) / (hi - lo) * _LANE

    disturbed = [w for w in lane["windows"] if w["disturbed"]]
    out = [
        f'<g class="lane" data-gpu="{esc(lane["index"] if lane["index"] is not None else "all")}" '
        f'data-metric="{esc(lane["metric"])}" data-windows="{" ".join(str(w["index"]) for w in lane["windows"])}" '
        f'data-disturbed="{" ".join(str(w["index"]) for w in disturbed)}" '
        f'data-remeasured="{" ".join(str(w["index"]) for w in lane["windows"] if w["remeasured"])}">',
        f'<rect class="lane-bg" x="{_SLEFT}" y="{y0}" width="{pw}" height="{_LANE}"/>',
        f'<text x="{_SLEFT - 8}" y="{y0 + 18}" text-anchor="end" class="strong">{esc(lane["gpu"])} {esc(lane["label"])}</text>',
        f'<text x="{_SLEFT - 8}" y="{y0 + 34}" text-anchor="end">{esc(span_text)}</text>',
    ]
    ws = t["window_s"]
    for w in lane["windows"]:
        start = w["start_s"] or 0.0
        width = num(max(2.0, x(start + ws) - x(start)))
        if w["remeasured"]:
            out.append(
                f'<rect class="again" x="{num(x(start))}" y="{y0}" width="{width}" height="{_LANE}" '
                f'data-window="{w["index"]}"><title>window {w["index"]}: measured again once the GPUs were quiet</title></rect>'
            )
        if w["disturbed"] or w["slowed"]:
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
                f'<rect class="{kind}" x="{num(x(start))}" y="{y0}" width="{width}" height="{_LANE}" '
                f'data-window="{w["index"]}"><title>{esc(tip)}</title></rect>'
            )
            if isinstance(w["disturbed_value"], (int, float)):
                out.append(
                    f'<circle class="dv" cx="{num(x(start + ws / 2))}" cy="{num(y(w["disturbed_value"]))}" r="3" '
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
    ordered = sorted(lane["windows"], key=lambda w: w["start_s"] or 0.0)
    points = [((w["start_s"] or 0.0), (w["start_s"] or 0.0) + ws / 2, w["value"]) for w in ordered]
    for run in _segments(points, ws):
        out.append(f'<polyline class="figure" points="{" ".join(f"{num(x(m))},{num(y(v))}" for m, v in run)}"/>')
    shown = [w for w in lane["windows"] if w["value"] is not None]
    for w in shown:
        if w["below"] or len(shown) <= 60:
            cls = "slow" if w["below"] else "pt"
            tip = f"window {w['index']} from {fmt_scalar(w['start_s'])} s: {figure_text(w['value'])} {lane['unit']}"
            out.append(
                f'<circle class="{cls}" cx="{num(x((w["start_s"] or 0.0) + ws / 2))}" cy="{num(y(w["value"]))}" '
                f'r="{3 if w["below"] else 2}" data-window="{w["index"]}"><title>{esc(tip)}</title></circle>'
            )
    out.append("</g>")
    return out


def _telemetry_lanes(out: list[str], g: dict, t: dict, x, y0: float, pw: float) -> float:
    """GPU g's temperature, power and SM clock lanes (each window a step at its figure, a second figure as ticks,
    the limit dashed) and its clock-event reasons; returns where the next lane starts."""
    ws = t["window_s"]
    windows = sorted(g["windows"], key=lambda w: w["start_s"] or 0.0)
    data = " ".join(str(w["index"]) for w in windows)
    for what, field, second, unit, limit_key, limit_words in TELEMETRY_LANES:
        values = [w[field] for w in windows if w[field] is not None]
        ticks = [w[second] for w in windows if second and w[second] is not None]
        limit = g.get(limit_key) if limit_key else None
        if not values:
            continue
        lo, hi = padded(values + ticks + ([limit] if isinstance(limit, (int, float)) else []))

        def y(v: float, lo=lo, hi=hi, y0=y0) -> float:
            return y0 + _TEL - (v - lo) / (hi - lo) * _TEL

        words = f"{figure_text(min(values))} to {figure_text(max(values + ticks))} {unit}"
        if isinstance(limit, (int, float)):
            words += f"; {limit_words} {figure_text(limit)}"
        out.append(f'<g class="telemetry" data-gpu="{g["index"]}" data-metric="{field}" data-windows="{data}">')
        out.append(f'<rect class="lane-bg" x="{_SLEFT}" y="{y0}" width="{pw}" height="{_TEL}"/>')
        out.append(
            f'<text x="{_SLEFT - 8}" y="{num(y0 + 12)}" text-anchor="end" class="strong">{esc(g["gpu"])} {esc(what)}</text>'
        )
        out.append(f'<text x="{_SLEFT - 8}" y="{num(y0 + 25)}" text-anchor="end">{esc(words)}</text>')
        if isinstance(limit, (int, float)):
            out.append(
                f'<line class="limit" x1="{_SLEFT}" y1="{num(y(limit))}" x2="{_SLEFT + pw}" y2="{num(y(limit))}" '
                f'data-value="{limit}"><title>{esc(f"{limit_words} {figure_text(limit)} {unit}")}</title></line>'
            )
        runs = _segments([(w["start_s"] or 0.0, w["start_s"] or 0.0, w[field]) for w in windows], ws)
        for run in runs:  # a step per window: its figure held over the window
            path = []
            for start, v in run:
                path.append(f"{num(x(start))},{num(y(v))} {num(x(start + ws))},{num(y(v))}")
            out.append(f'<polyline class="tel" points="{" ".join(path)}"/>')
        for w in windows:
            if w[field] is None:
                continue
            tip = f"window {w['index']} from {fmt_scalar(w['start_s'])} s: {what} {figure_text(w[field])} {unit}"
            if second and w[second] is not None:
                tip += f" ({second.rsplit('_', 2)[-2]} {figure_text(w[second])})"
                out.append(
                    f'<line class="tel-tick" x1="{num(x(w["start_s"] or 0.0) + 2)}" y1="{num(y(w[second]))}" '
                    f'x2="{num(x((w["start_s"] or 0.0) + ws) - 2)}" y2="{num(y(w[second]))}"/>'
                )
            out.append(
                f'<rect class="tel-hit" x="{num(x(w["start_s"] or 0.0))}" y="{y0}" '
                f'width="{num(max(2.0, x((w["start_s"] or 0.0) + ws) - x(w["start_s"] or 0.0)))}" height="{_TEL}" '
                f'data-window="{w["index"]}" data-value="{w[field]}"><title>{esc(tip)}</title></rect>'
            )
        out.append("</g>")
        y0 += _TEL + _GAP
    throttled = "; ".join(f"{r} {fmt_scalar(s)} s" for r, s in g["throttle"].items() if s)
    ran = f" of {fmt_scalar(g['ran_s'])} s" if g.get("ran_s") else ""
    out.append(f'<g class="reasons" data-gpu="{g["index"]}" data-windows="{data}">')
    out.append(
        f'<text x="{_SLEFT - 8}" y="{num(y0 + 11)}" text-anchor="end" class="strong">{esc(g["gpu"])} clock-event reasons</text>'
    )
    out.append(
        f'<text x="{_SLEFT - 8}" y="{num(y0 + 24)}" text-anchor="end">{esc(throttled + ran if throttled else "none")}</text>'
    )
    for w in windows:
        x0, x1 = x(w["start_s"] or 0.0), x((w["start_s"] or 0.0) + ws)
        text = ", ".join(w["reasons"]) or "none"
        cls = "reason" if w["reasons"] else "lane-bg"
        tip = f"window {w['index']}: {text}"
        out.append(
            f'<rect class="{cls}" x="{num(x0 + 1)}" y="{y0}" width="{num(max(1.0, x1 - x0 - 2))}" height="{_REASONS}" '
            f'data-window="{w["index"]}" data-reasons="{esc(" ".join(w["reasons"]))}"><title>{esc(tip)}</title></rect>'
        )
        if w["reasons"] and x1 - x0 > 6.5 * len(text):
            out.append(f'<text x="{num(x0 + 4)}" y="{num(y0 + 17)}" class="name">{esc(text)}</text>')
    out.append("</g>")
    return y0 + _REASONS + _GAP * 2
