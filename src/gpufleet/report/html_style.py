"""report.html's style sheet, inline in the page (no file fetched).

Every status a result, a comparison or a picture can show has its own look, the same everywhere (a badge, a row, a
bar, a fleet cell, an outlier): the statuses of the one result schema and `inconclusive` (a figure past its limit in
one measurement only). Every recommended action (fleet/remediation.py) has its badge. The page holds at any window
from 800 px up without scrolling sideways: tables wrap their cells, long names break, pictures scale.
"""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.fleet.remediation import ACTIONS

INCONCLUSIVE = "inconclusive"
# status -> (its colour, its row's background)
STATUS_COLOURS = {
    schema.PASS: ("#1a7f37", "#f0fff4"),
    schema.WARN: ("#9a6700", "#fff8c5"),
    schema.FAIL: ("#cf222e", "#ffebe9"),
    schema.ERROR: ("#8250df", "#fbefff"),
    schema.SKIP: ("#6e7781", "#f6f8fa"),
    schema.INFO: ("#0969da", "#ddf4ff"),
    INCONCLUSIVE: ("#bc4c00", "#fff1e5"),
}
ACTION_COLOURS = dict(zip(ACTIONS, ("#6e7781", "#0969da", "#9a6700", "#bc4c00", "#cf222e")))


def action_class(action: str) -> str:
    return "a-" + action.lower().replace(" ", "-")


def _status_rules() -> str:
    out = []
    for s, (colour, back) in STATUS_COLOURS.items():
        out.append(
            f".b-{s}{{background:{colour}}}tr.s-{s}>td{{background:{back}}}tr.s-{s}>td:first-child"
            f"{{box-shadow:inset 4px 0 {colour}}}svg .bar.s-{s}{{fill:{colour}}}td.fv.s-{s}{{background:{back}}}"
            f".fv .bar.s-{s} i{{background:{colour}}}svg .outlier circle.s-{s}{{fill:{colour}}}"
            f"li.s-{s}{{border-left:4px solid {colour}}}"
        )
    out.append(
        "svg .bar.s-inconclusive{fill-opacity:.45;stroke:#bc4c00;stroke-width:1.5;stroke-dasharray:4 2}"
        ".b-inconclusive{background:repeating-linear-gradient(135deg,#bc4c00 0 6px,#d4661a 6px 12px)}"
    )
    out += [f".{action_class(a)}{{background:{c}}}" for a, c in ACTION_COLOURS.items()]
    return "".join(out)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.2em auto;max-width:1200px;padding:0 12px;color:#1f2328}
h1{font-size:1.5em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #d0d7de;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0;max-width:100%}th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td{overflow-wrap:anywhere}td.n{text-align:right;font-variant-numeric:tabular-nums;overflow-wrap:normal}td.zero{color:#8c959f}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}pre{margin:.2em 0;white-space:pre-wrap;overflow-wrap:anywhere;font:12px ui-monospace,monospace}
.badge{display:inline-block;min-width:3.2em;text-align:center;padding:0 .4em;border-radius:3px;font-weight:600;font-size:12px;color:#fff;white-space:nowrap}
.remedy{margin-top:.3em}.remedy b{color:#0969da}.src{color:#57606a;font-size:12px}.meta{color:#57606a}
details{margin-top:.3em}summary{cursor:pointer;color:#0969da}table.kv{margin:.3em 0;font-size:12px}table.kv th{font-weight:600}details>table.kv>tbody>tr>th{min-width:6em}
figure{margin:.8em 0}figcaption{color:#57606a;font-size:12px}svg.chart{width:100%;height:auto;display:block}
svg.busbw{max-width:760px}svg.soak,svg.distribution{max-width:1000px}svg.bars{max-width:560px}
svg.chart text{font:11px system-ui,sans-serif;fill:#1f2328}svg.chart .grid{stroke:#d0d7de;stroke-width:1}
svg.chart .axis{stroke:#57606a;stroke-width:1}svg.chart text.strong{font-weight:600}svg.chart text.name{font-size:10px}
svg .lane-bg{fill:#f6f8fa}svg .figure{fill:none;stroke:#0969da;stroke-width:1.5}svg .pt{fill:#0969da}
svg .slow{fill:#cf222e}svg .disturbed{fill:#d4a72c;fill-opacity:.35}svg .slowed{fill:#cf222e;fill-opacity:.12}svg .dv{fill:#fff;stroke:#9a6700;stroke-width:1.5}
svg .again{fill:#1a7f37;fill-opacity:.12}svg .foreign{fill:#cf222e;fill-opacity:.16;stroke:#cf222e;stroke-dasharray:2 2}svg .foreign-label{fill:#cf222e}
svg .foreign-host{fill:#8250df;fill-opacity:.13;stroke:#8250df;stroke-dasharray:6 2}svg .gap{fill:#eaeef2;fill-opacity:.85;stroke:#8c959f;stroke-dasharray:1 3}
svg .tel{fill:none;stroke:#bc4c00;stroke-width:1.5}svg .tel-tick{stroke:#57606a;stroke-width:1}svg .tel-hit{fill:transparent}
svg .reason{fill:#1b7c83;fill-opacity:.28}svg .legend text{font-size:11px}
svg .limit,svg .floor{stroke:#cf222e;stroke-width:1.2;stroke-dasharray:5 3}
svg .sibling-limit{stroke:#9a6700;stroke-width:1.2;stroke-dasharray:5 3}
svg polyline.base{fill:none;stroke-width:1.5;stroke-dasharray:5 4}svg rect.base{fill:#fff;stroke-width:1.5}
svg line.base{stroke-width:1.5;stroke-dasharray:5 4}svg .axis-break,svg .bar-break{fill:none;stroke:#fff;stroke-width:3}
svg .axis-break{stroke:#57606a;stroke-width:1.5}
svg .ref{stroke:#1f2328;stroke-width:2}svg .usual{fill:none;stroke:#57606a;stroke-width:1.5}svg .past{fill:#8250df}
svg .bin{fill:#0969da;fill-opacity:.7}svg .whisker{stroke:#57606a}svg .iqr{fill:#ddf4ff;stroke:#0969da}
svg .med,svg .fleet-median{stroke:#1f2328;stroke-width:2}svg .base-median{stroke:#8250df;stroke-width:1.5;stroke-dasharray:5 3}
svg text.base-median-label{fill:#8250df}svg text.count{fill:#57606a}
svg .beyond{fill:#8c959f}svg text.break{fill:#57606a;font-weight:600}svg .outlier circle{fill:#57606a}
.panels{display:flex;flex-wrap:wrap;gap:0 1.5em}.panels figure{flex:1 1 340px;max-width:560px;min-width:0}
.lim{font-weight:600}.src{overflow-wrap:anywhere}td.check{min-width:9em}section.brief{margin:.15em 0;content-visibility:auto;contain-intrinsic-size:auto 22px}section.brief h4{display:inline;margin:0}
td.fv{min-width:8em}.fv .bar{position:relative;height:8px;background:#eaeef2;border-radius:2px;margin:3px 0}
.fv .bar i{position:absolute;left:0;top:0;bottom:0;border-radius:2px}
.fv .bar b{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1f2328}.fv .bar b.base{background:#8250df}
.fv div.v{font-weight:600}
pre.drain{background:#f6f8fa;padding:.5em;border:1px solid #d0d7de}
table.nodes{width:100%}table.nodes td.cause{min-width:14em}table.nodes td:first-child,table.fleet td:first-child,table.drain-review td:first-child{min-width:6.5em}table.nodes ul{margin:0;padding-left:0;list-style:none}
table.nodes li{padding-left:.4em;margin:.1em 0}.act{margin-top:.2em}.act .badge{min-width:0}
.why{color:#57606a;font-size:12px}.past{color:#cf222e;font-weight:600;font-size:12px}
""" + _status_rules()
