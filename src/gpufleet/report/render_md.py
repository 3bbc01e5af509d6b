"""report.md: a node table (failures first), then each node's findings.

Meant to read well as plain text and as rendered Markdown: findings as short
bullet lists, passes as one compact table per node, NCCL bus bandwidth as one
table per run (message size by collective).
"""

from __future__ import annotations

import json
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
    bound, source = threshold_text(res.get("threshold"))
    if bound:
        lines.append(f"- threshold: {_inline(bound)}" + (f" (source: {_prose(source)})" if source else ""))
    lines.append(f"- reason: {_inline(res.get('reason') or '(no reason given)')}")
    if res.get("remedy"):
        lines.append(f"- remedy: {_inline(res['remedy'])}")
    lines += _evidence(res.get("detail"))
    lines.append("")
    return lines


def _node_section(node: dict) -> list[str]:
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
            "| check | value | trust | threshold | reason |",
            "| --- | --- | --- | --- | --- |",
        ]
        for res in rows:
            bound, _ = threshold_text(res.get("threshold"))
            lines.append(
                f"| {_code(check_id(res))} | {_inline(value_text(res))} | {_inline(trust_text(res))} | {_inline(bound)} | "
                f"{_inline(res.get('reason') or '')} |"
            )
        lines.append("")
    lines += _busbw_tables(node)
    return lines


def _busbw_tables(node: dict) -> list[str]:
    """busbw in GB/s, one row per message size, one column per collective; report.html draws the same."""
    charts = busbw_series(node["results"])
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
    return lines


def _fleet_section(report: dict) -> list[str]:
    """The fleet view as a table (each node's figures against the fleet median and the baseline), then the drain lines."""
    fleet = report.get("fleet")
    if not fleet:
        return []
    lines = ["## Fleet", "", _inline(fleet_note(report)), ""]  # the store and baseline used, even with no figures
    columns = fleet_columns(report)
    if columns:
        lines.append(
            "| node | " + " | ".join(f"{_inline(title)} ({_inline(unit or '')})" for _, title, unit in columns) + " |"
        )
        lines.append("| --- | " + " | ".join("---:" for _ in columns) + " |")
        for row in fleet.get("view") or []:
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
    drain = fleet.get("drain") or []
    lines += ["### Drain in Slurm", ""]
    if drain:
        lines += [f"{len(drain)} node(s) not accepted (also in drain.txt):", "", "```sh", *drain, "```", ""]
    else:
        lines += ["Every node accepted: none to drain.", ""]
    return lines


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
        lines += _node_section(node)
    return "\n".join(lines).rstrip() + "\n"
