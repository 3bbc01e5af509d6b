"""report.md: a node table (failures first), then each node's findings.

Meant to read well as plain text and as rendered Markdown: findings as short
bullet lists, passes as one compact table per node, NCCL bus bandwidth as one
table per run (message size by collective).
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpufleet.base.registry import registers
from gpufleet.base.causes import in_shared
from gpufleet.comparisons import figure_text
from gpufleet.report import chart_data
from gpufleet.report.drain import NOT_CONFIRMED
from gpufleet.base.schema import size_text
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

_EVIDENCE_CHARS = 300  # longer evidence is in report.json and report.html


def _inline(text: Any) -> str:
    """One line of text that cannot open an HTML tag or break a table."""
    s = " ".join(str(text).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")


def _prose(text: Any) -> str:
    """_inline, and nothing in it read as Markdown: no link, image or emphasis (a profile's `source` is free text,
    and the document that carries it may be anyone's)."""
    return re.sub(r"([\[\]()*_`~!#&])", r"\\\1", _inline(text))


def _code(text: Any) -> str:
    """A code span that holds any text: its fence is longer than any run of backticks inside, and a pipe is
    escaped so that it cannot end a table cell (GFM drops the backslash inside the span)."""
    s = " ".join(str(text).split()).replace("|", "\\|")
    fence = "`" * (max(map(len, re.findall("`+", s)), default=0) + 1)
    pad = " " if s[:1] == "`" or s[-1:] == "`" else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _evidence(detail: Any) -> list[str]:
    if not detail:
        return []
    if not isinstance(detail, dict):
        detail = {"detail": detail}
    lines = ["- evidence:"]
    for k, v in detail.items():
        text = fmt_scalar(v) if not isinstance(v, (dict, list)) else json.dumps(v, sort_keys=True, default=str)
        if len(text) > _EVIDENCE_CHARS:
            text = text[:_EVIDENCE_CHARS] + " … (full text in report.json)"
        lines.append(f"  - {_inline(k)}: {_inline(text)}")
    return lines


def _finding(res: dict) -> list[str]:
    lines = [f"#### {_inline(res['status'].upper())} {_code(check_id(res))}", ""]
    if class_text(res):
        lines.append(f"- class: {_inline(class_text(res))}")
    value, trust = value_text(res), trust_text(res)
    if value:
        lines.append(f"- value: {_inline(value)}" + (f" (trust: {_inline(trust)})" if trust else ""))
    elif trust:  # a disturbed measurement keeps no figure, but says why
        lines.append(f"- trust: {_inline(trust)}")
    limit = decided_limit(res)
    bound, source = decided_text(limit) if limit else threshold_text(res.get("threshold"))
    if bound:
        lines.append(
            f"- {'limit' if limit else 'threshold'}: {_inline(bound)}"
            + (f" (source: {_prose(source)})" if source else "")
        )
    if limit and threshold_has_more(res):
        whole, _ = threshold_text(res.get("threshold"))
        lines.append(f"- whole threshold: {_inline(whole)}")
    lines.append(f"- reason: {_inline(res.get('reason') or '(no reason given)')}")
    if res.get("remedy"):
        lines.append(f"- remedy: {_inline(res['remedy'])}")
    lines += _evidence(res.get("detail"))
    lines.append("")
    return lines


def _node_section(node: dict, report: dict) -> list[str]:
    lines = [f"## {_inline(node['host'])}: {node['verdict'].upper()}", ""]
    facts = []
    if node.get("reported_host"):
        facts.append(f"reports itself as {_inline(node['reported_host'])}")
    if node.get("profile"):
        facts.append(f"profile {_inline(node['profile'])}")
    versions = node_versions_text(node)
    if versions:
        facts.append(_inline(versions))
    if node.get("started"):
        seconds = f" ({fmt_scalar(node['seconds'])} s)" if node.get("seconds") is not None else ""
        facts.append(_inline(f"checked {node['started']}{seconds}"))
    if node.get("source"):
        facts.append(f"from {_code(node['source'])}")
    if (node.get("certificate") or {}).get("certified"):
        expired = "**expired**: " if node["certificate"]["expired"] else ""
        facts.append(expired + _inline(node["certificate"]["text"]))
    if facts:
        lines += ["; ".join(facts) + ".", ""]
    bad, good = ordered_results(node["results"])
    shared = [g for g in node_causes(node) if len(g["checks"]) > 1]
    if shared:
        lines += [
            f"### Causes ({len(shared)})",
            "",
            "Failing results that give one reason, said once; each result is in report.json.",
            "",
        ]
        for group in shared:
            lines += [f"#### {_inline(group['status'].upper())} {_inline(group['cause'])}", ""]
            if group["class"]:
                lines.append(f"- class: {_inline(group['class'])}")
            if group["remedy"]:
                lines.append(f"- remedy: {_inline(group['remedy'])}")
            lines += [f"- {len(group['checks'])} checks: " + ", ".join(_code(c) for c in group["checks"]), ""]
    rest = [r for r in bad if not in_shared(r, shared)]
    if rest:
        lines += [f"### Not passing ({len(rest)}{' more' if shared else ''})", ""]
        for res in rest:
            lines += _finding(res)
    for title, rows in ((INFO_TITLE, information(node["results"])), ("Passed", good)):
        if not rows:
            continue
        lines += [
            f"### {title} ({len(rows)})",
            "",
            "| check | value | trust | limit | reason |",
            "| --- | --- | --- | --- | --- |",
        ]
        for res in rows:
            limit = decided_limit(res)
            bound = decided_text(limit)[0] if limit else threshold_text(res.get("threshold"))[0]
            lines.append(
                f"| {_code(check_id(res))} | {_inline(value_text(res))} | {_inline(trust_text(res))} | {_inline(bound)} | "
                f"{_inline(res.get('reason') or '')} |"
            )
        lines.append("")
    lines += _gpu_tables(node) + _soak_tables(node) + _busbw_tables(node, report)
    return lines


def _busbw_tables(node: dict, report: dict) -> list[str]:
    """busbw in GB/s, one row per message size, one column per collective, then the baseline's figures beside this
    run's; report.html draws the same."""
    charts = chart_data.nccl_charts(node, report)
    if not charts:
        return []
    lines = ["### NCCL bus bandwidth (GB/s)", ""]
    for chart in charts:
        note = "; on the CPU: a logic check, not a performance figure" if chart.get("backend") == "gloo" else ""
        lines += [f"{_inline(chart['title'])}{_inline(note)}:", ""]
        sizes = sorted({size for line in chart["lines"] for size, _ in line["points"]})
        by_line = [dict(line["points"]) for line in chart["lines"]]
        lines.append("| size | " + " | ".join(_inline(line["label"]) for line in chart["lines"]) + " |")
        lines.append("| ---: | " + " | ".join("---:" for _ in chart["lines"]) + " |")
        for size in sizes:
            cells = [_inline(fmt_scalar(points[size])) if size in points else "" for points in by_line]
            lines.append(f"| {_inline(size_text(size))} | " + " | ".join(cells) + " |")
        lines.append("")
        if chart.get("baseline_run"):
            lines += [
                f"Against baseline run {_inline(chart['baseline_run'])}, at the largest size of each size band:",
                "",
                "| collective | size | this run | baseline | change |",
                "| --- | ---: | ---: | ---: | ---: |",
            ]
            for line, points in zip(chart["lines"], by_line):
                for size, base in line["baseline"]:
                    now = points.get(size)
                    change = f"{(now - base) / base * 100:+.1f}%" if now is not None and base else ""
                    lines.append(
                        f"| {_inline(line['label'])} | {_inline(size_text(size))} | "
                        f"{_inline(fmt_scalar(now)) if now is not None else ''} | {_inline(fmt_scalar(base))} | {change} |"
                    )
            lines.append("")
    return lines


def _pct(v) -> str:
    return f"{v:+.1f}%" if isinstance(v, (int, float)) else ""


def _gpu_tables(node: dict) -> list[str]:
    """Each GPU beside its siblings and its past, one table per figure: what report.html draws as bars."""
    lines = []
    for panel in chart_data.gpu_bars(node["results"], node.get("per_gpu")):
        limits = []
        if panel["sibling_limit"] is not None:
            limits.append(
                f"siblings' limit {fmt_scalar(panel['sibling_limit_pct'])}% under what each GPU is held against "
                f"(lowest passing {figure_text(panel['sibling_limit'])})"
            )
        if panel["floor"] is not None:
            limits.append(f"floor {panel['floor_key']} {figure_text(panel['floor'])}")
        lines += [
            f"### {_inline(panel['label'])} per GPU ({_inline(panel['unit'])})",
            "",
            *([_inline("; ".join(limits)) + ".", ""] if limits else []),
            "| GPU | figure | status | held against | against it | usual place | baseline run | against baseline |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for g in panel["gpus"]:
            base = g["baseline"]
            lines.append(
                f"| {_inline(g['gpu'])} | {figure_text(g['value'])} | {_inline(g['status'])} | "
                f"{figure_text(g['reference']) if g['reference'] is not None else ''} | {_pct(g['deviation_pct'])} | "
                f"{figure_text(g['usual']) if g['usual'] is not None else ''} | "
                f"{figure_text(base) if base is not None else ''} | "
                f"{_pct((g['value'] - base) / base * 100) if base else ''} |"
            )
        lines.append("")
    return lines


def _soak_tables(node: dict) -> list[str]:
    """The soak window by window, in short: per GPU and figure, its best windows, its lowest window, the limit,
    the windows below it and the disturbed ones; then the foreign processes' spans."""
    lines = []
    for t in chart_data.soak_timelines(node["results"]):
        lines += [
            f"### Soak: {_inline(t['title'])} ({t.get('n_windows')} window(s) of {fmt_scalar(t['window_s'])} s)",
            "",
            f"Each window against the median of the GPU's best windows, limit {fmt_scalar(t['limit_pct'])}% under it.",
            "",
            "| GPU | figure | windows | best windows | lowest window | limit | below the limit | disturbed (left out) "
            "| measured again |",
            "| --- | --- | ---: | ---: | --- | ---: | --- | --- | --- |",
        ]
        for lane in t["lanes"]:
            shown = [w for w in lane["windows"] if w["value"] is not None]
            low = min(shown, key=lambda w: w["value"]) if shown else None
            lowest = (
                f"{figure_text(low['value'])} (window {low['index']}, at {fmt_scalar(low['start_s'])} s)" if low else ""
            )
            lines.append(
                f"| {_inline(lane['gpu'])} | {_inline(lane['label'])} ({_inline(lane['unit'])}) | {len(lane['windows'])} | "
                f"{figure_text(lane['best']) if lane['best'] is not None else ''} | {_inline(lowest)} | "
                f"{figure_text(lane['limit']) if lane['limit'] is not None else ''} | "
                f"{_inline(', '.join(str(w['index']) for w in lane['windows'] if w['below'])) or 'none'} | "
                f"{_inline(', '.join(str(w['index']) for w in lane['windows'] if w['disturbed'])) or 'none'} | "
                f"{_inline(', '.join(str(w['index']) for w in lane['windows'] if w['remeasured'])) or 'none'} |"
            )
        lines.append("")
        if t["foreign"]:
            lines += ["| foreign process | GPU | from | to | memory |", "| --- | --- | ---: | ---: | ---: |"]
            for p in t["foreign"]:
                lines.append(
                    f"| pid {p['pid']} ({_inline(p.get('name') or 'name unknown')}) | {p.get('index')} | "
                    f"{fmt_scalar(p['first_s'])} s | {fmt_scalar(p.get('last_s'))} s | {fmt_scalar(p.get('used_memory_mib'))} MiB |"
                )
            lines.append("")
    return lines


def _distribution_table(report: dict) -> list[str]:
    """Each fleet-view figure over the nodes (report.html draws it): its spread and its outliers named."""
    dists = chart_data.fleet_distributions(report)
    if not dists:
        return []
    lines = [
        "| figure | nodes | min | quartiles | max | fleet median | baseline fleet median | outliers (the slowest first) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for d in dists:
        flagged = d["outliers"][0]["status"] != "pass"
        named = ", ".join(
            f"{o['host']} {figure_text(o['value'])}" + (f" ({o['status']})" if flagged else "") for o in d["outliers"]
        )
        lines.append(
            f"| {_inline(d['title'])} ({_inline(d['unit'])}) | {d['n']} | {figure_text(d['min'])} | "
            f"{figure_text(d['q1'])} / {figure_text(d['median'])} / {figure_text(d['q3'])} | {figure_text(d['max'])} | "
            f"{figure_text(d['fleet_median']) if d['fleet_median'] is not None else ''} | "
            f"{figure_text(d['baseline']) if d['baseline'] is not None else ''} | "
            f"{_inline(named) if flagged else 'none; the slowest: ' + _inline(named)} |"
        )
    return lines + [""]


def _drain_box(fleet: dict) -> list[str]:
    """Which failures of each node not accepted were confirmed, and the drain lines of those with one."""
    review, drain = fleet.get("drain_review") or [], fleet.get("drain") or []
    lines = ["### Drain in Slurm", ""]
    if not review:
        return lines + ["Every node accepted: none to drain.", ""]
    lines += ["| node | confirmed failures: drained for | not confirmed: not drained for |", "| --- | --- | --- |"]
    for row in review:
        unconfirmed = ", ".join(f"{_code(u['check'])} ({_inline(u['trust'])})" for u in row["unconfirmed"])
        lines.append(
            f"| {_inline(row['host'])} | {', '.join(_code(c) for c in row['confirmed']) or 'none'} | {unconfirmed} |"
        )
    lines.append("")
    if drain:
        lines += [f"{len(drain)} node(s) with a confirmed failure (also in drain.txt):", "", "```sh", *drain, "```", ""]
    if len(drain) < len(review):
        lines += [f"{len(review) - len(drain)} node(s) {NOT_CONFIRMED}.", ""]
    return lines


def _fleet_section(report: dict) -> list[str]:
    """Each figure's distribution over the nodes, the fleet view as a table (each node's figures against the fleet
    median and the baseline; past FLEET_ROWS_MAX nodes, those with a figure that did not pass), then the drain box."""
    fleet = report.get("fleet")
    if not fleet:
        return []
    lines = ["## Fleet", "", _inline(fleet_note(report)), ""]  # the store and baseline used, even with no figures
    lines += _distribution_table(report)
    columns = fleet_columns(report)
    rows, left_out = fleet_view_rows(report)
    if columns:
        if left_out:
            lines += [_inline(left_out_text(left_out, len(rows))), ""]
        lines.append(
            "| node | " + " | ".join(f"{_inline(title)} ({_inline(unit or '')})" for _, title, unit in columns) + " |"
        )
        lines.append("| --- | " + " | ".join("---:" for _ in columns) + " |")
        for row in rows:
            cells = []
            for col, _, _ in columns:
                cell = row["columns"].get(col)
                if not cell:
                    cells.append("")
                    continue
                mark = f"**{_inline(cell['status'].upper())}** " if cell["status"] != "pass" else ""
                cells.append(mark + _inline("; ".join(fleet_cell_parts(cell))))
            lines.append(f"| {_inline(row['host'])} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines + _drain_box(fleet)


def _versions_section(report: dict) -> list[str]:
    """The software and firmware of every node, one row per component, differences first."""
    rows = versions_rows(report)
    if not rows:
        return []
    lines = [
        f"## {VERSIONS_TITLE}",
        "",
        _inline(versions_note(report)),
        "",
        "| " + " | ".join(VERSIONS_HEAD) + " |",
        "| " + " | ".join("---" for _ in VERSIONS_HEAD) + " |",
    ]
    for row in rows:
        label, *rest = row["cells"]
        name = f"**{_inline(label)}**" if row["differs"] else _inline(label)
        lines.append(f"| {name} | " + " | ".join(_inline(c) for c in rest) + " |")
    return lines + [""]


def _peers_section(report: dict) -> list[str]:
    """Known-good peers that joined the run across nodes: their figures beside the nodes', not judged."""
    peers = report.get("peers") or {}
    if not peers:
        return []
    lines = [
        "## Peers",
        "",
        "Known-good nodes that joined the run across nodes without their node stage (peers/); their "
        "figures of that run, beside the nodes', are part of no verdict.",
        "",
        "| peer | check | status | value | reason |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for host, peer in peers.items():
        for res in peer["results"]:
            lines.append(
                f"| {_inline(host)} | {_code(check_id(res))} | {_inline(res['status'])} | {_inline(value_text(res))} | "
                f"{_inline(str(res.get('reason') or '')[:_EVIDENCE_CHARS])} |"
            )
    return lines + [""]


@registers("output.md", "render")
def render(report: dict) -> str:
    nodes = list(report["nodes"].values())
    lines = [
        f"# gpufleet acceptance report: {_inline(report['run_id'])}",
        "",
        f"**Verdict: {report['verdict'].upper()}**: {fleet_line(report)}.",
        "",
        f"Generated {report['generated']} from {_code(str(report['run_dir']) + '/hosts')}. "
        "Every result is kept unchanged in report.json.",
        "",
        "| node | verdict | " + " | ".join(STATUS_ORDER) + " | profile | failing (each cause once), warning |",
        "| --- | --- | " + " | ".join("---:" for _ in STATUS_ORDER) + " | --- | --- |",
    ]
    for node in nodes:
        items, more = findings(node)
        listed = ", ".join(_code(i) for i in items) + (f" and {more} more" if more else "")
        lines.append(
            f"| {_inline(node['host'])} | **{node['verdict'].upper()}** | "
            + " | ".join(str(node["counts"][s]) for s in STATUS_ORDER)
            + f" | {_inline(node.get('profile') or '')} | {listed} |"
        )
    lines.append("")
    if kept_locks(report):
        lines += [
            _inline(
                "Locks not given back (the next run takes them over or waits out the lease): "
                + "; ".join(kept_locks(report))
            )
            + ".",
            "",
        ]
    lines += _fleet_section(report)
    lines += _versions_section(report)
    lines += _peers_section(report)
    for node in nodes:
        lines += _node_section(node, report)
    return "\n".join(lines).rstrip() + "\n"
