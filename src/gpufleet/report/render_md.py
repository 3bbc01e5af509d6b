"""report.md: a node table (failures first), then each node's findings.

Meant to read well as plain text and as rendered Markdown: findings as short
bullet lists, passes as one compact table per node, NCCL bus bandwidth as one
table per run (message size by collective).
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.base import schema
from gpufleet.base.registry import registers
from gpufleet.base.causes import in_shared
from gpufleet.comparisons import figure_text
from gpufleet.report import cause, chart_data, md_pictures
from gpufleet.report.md_pictures import code, inline, prose
from gpufleet.fleet.remediation import THEIRS, recommended
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
    threshold_has_more,
    threshold_text,
    trust_text,
    value_text,
    versions_note,
    versions_rows,
)

_EVIDENCE_CHARS = 300  # longer evidence is in report.json and report.html


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
        lines.append(f"  - {inline(k)}: {inline(text)}")
    return lines


def _finding(res: dict, profile: str | None) -> list[str]:
    lines = [f"#### {inline(cause.shown_status(res).upper())} {code(check_id(res))}", ""]
    if class_text(res):
        lines.append(f"- class: {inline(class_text(res))}")
    value, trust = value_text(res), trust_text(res)
    if value:
        lines.append(f"- value: {inline(value)}" + (f" (trust: {inline(trust)})" if trust else ""))
    elif trust:  # a disturbed measurement keeps no figure, but says why
        lines.append(f"- trust: {inline(trust)}")
    limit = decided_limit(res)
    bound, source = decided_text(limit) if limit else threshold_text(res.get("threshold"))
    if bound:
        lines.append(
            f"- {'limit' if limit else 'threshold'}: {inline(bound)}"
            + (f" (source: {prose(source)})" if source else "")
        )
    if limit and threshold_has_more(res):
        whole, _ = threshold_text(res.get("threshold"))
        lines.append(f"- whole threshold: {inline(whole)}")
    lines.append(f"- reason: {inline(res.get('reason') or '(no reason given)')}")
    if res.get("remedy"):
        lines.append(f"- remedy: {inline(res['remedy'])}")
    act = recommended(res, profile)
    lines.append(f"- action: {act['action']} ({inline(act['why'])}; as {inline(THEIRS[act['action']])})")
    lines += _evidence(res.get("detail"))
    lines.append("")
    return lines


def _node_section(node: dict, report: dict) -> list[str]:
    lines = [f"## {inline(node['host'])}: {node['verdict'].upper()}", ""]
    facts = []
    if node.get("reported_host"):
        facts.append(f"reports itself as {inline(node['reported_host'])}")
    if node.get("profile"):
        facts.append(f"profile {inline(node['profile'])}")
    versions = node_versions_text(node)
    if versions:
        facts.append(inline(versions))
    if node.get("started"):
        seconds = f" ({fmt_scalar(node['seconds'])} s)" if node.get("seconds") is not None else ""
        facts.append(inline(f"checked {node['started']}{seconds}"))
    if node.get("source"):
        facts.append(f"from {code(node['source'])}")
    if (node.get("certificate") or {}).get("certified"):
        expired = "**expired**: " if node["certificate"]["expired"] else ""
        facts.append(expired + inline(node["certificate"]["text"]))
    if facts:
        lines += ["; ".join(facts) + ".", ""]
    said = cause.cause(node)  # its words are in the node table and in the findings below: here what to do
    lines += [f"**What to do:** {said['action']} ({inline(said['action_why'])}).", ""]
    figures = cause.failing_figures(node)
    if figures:
        lines += ["Figures past a limit:", ""]
        lines += [f"- {inline(f['status'].upper())} {inline(cause.figure_line(f))}" for f in figures]
        lines.append("")
    results = node["results"]
    unsure = [r for r in results if cause.shown_status(r) == cause.INCONCLUSIVE]
    bad = sorted(
        (r for r in results if r["status"] not in (schema.PASS, schema.INFO, schema.SKIP)),
        key=lambda r: -schema.severity(r["status"]),
    )
    good = [r for r in results if r["status"] == schema.PASS]
    skipped = [r for r in results if r["status"] == schema.SKIP]
    shared = [g for g in node_causes(node) if len(g["checks"]) > 1]
    if shared:
        lines += [
            f"### Causes ({len(shared)})",
            "",
            "Failing results that give one reason, said once; each result is in report.json.",
            "",
        ]
        for group in shared:
            lines += [f"#### {inline(group['status'].upper())} {inline(group['cause'])}", ""]
            if group["class"]:
                lines.append(f"- class: {inline(group['class'])}")
            if group["remedy"]:
                lines.append(f"- remedy: {inline(group['remedy'])}")
            lines += [f"- {len(group['checks'])} checks: " + ", ".join(code(c) for c in group["checks"]), ""]
    rest = [r for r in bad if not in_shared(r, shared)] + unsure
    if rest:
        lines += [f"### Not passing ({len(rest)}{' more' if shared else ''})", ""]
        for res in rest:
            lines += _finding(res, node.get("profile"))
    info = [r for r in information(results) if r not in unsure]
    for title, rows in ((INFO_TITLE, info), ("Skipped: not applicable on this node", skipped), ("Passed", good)):
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
            past = cause.past_own_bound(res)
            value = value_text(res) + (f" ({past})" if past else "")
            lines.append(
                f"| {code(check_id(res))} | {inline(value)} | {inline(trust_text(res))} | {inline(bound)} | "
                f"{inline(res.get('reason') or '')} |"
            )
        lines.append("")
    lines += md_pictures.inventory_table(node)
    lines += md_pictures.gpu_tables(node) + md_pictures.soak_tables(node) + md_pictures.busbw_tables(node, report)
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
        flagged = bool(d["outliers"]) and d["outliers"][0]["status"] != "pass"
        named = ", ".join(
            f"{o['host']} {figure_text(o['value'])}" + (f" ({o['status']})" if flagged else "") for o in d["outliers"]
        )
        if not d["outliers"]:
            named = f"none; every node reads {figure_text(d['min'])}"
        lines.append(
            f"| {inline(d['title'])} ({inline(d['unit'])}) | {d['n']} | {figure_text(d['min'])} | "
            f"{figure_text(d['q1'])} / {figure_text(d['median'])} / {figure_text(d['q3'])} | {figure_text(d['max'])} | "
            f"{figure_text(d['fleet_median']) if d['fleet_median'] is not None else ''} | "
            f"{figure_text(d['baseline']) if d['baseline'] is not None else ''} | "
            f"{inline(named) if flagged or not d['outliers'] else 'none; the slowest: ' + inline(named)} |"
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
        unconfirmed = ", ".join(f"{code(u['check'])} ({inline(u['trust'])})" for u in row["unconfirmed"])
        named = zip(row["confirmed"], row.get("components") or [None] * len(row["confirmed"]))
        confirmed = ", ".join(code(c) + (f" ({inline(w)})" if w and w != c else "") for c, w in named)
        lines.append(f"| {inline(row['host'])} | {confirmed or 'none'} | {unconfirmed} |")
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
    lines = ["## Fleet", "", inline(fleet_note(report)), ""]  # the store and baseline used, even with no figures
    lines += _distribution_table(report)
    columns = fleet_columns(report)
    rows, left_out = fleet_view_rows(report)
    if columns:
        if left_out:
            lines += [inline(left_out_text(left_out, len(rows))), ""]
        lines.append(
            "| node | " + " | ".join(f"{inline(title)} ({inline(unit or '')})" for _, title, unit in columns) + " |"
        )
        lines.append("| --- | " + " | ".join("---:" for _ in columns) + " |")
        for row in rows:
            cells = []
            for col, _, _ in columns:
                cell = row["columns"].get(col)
                if not cell:
                    cells.append("")
                    continue
                mark = f"**{inline(cell['status'].upper())}** " if cell["status"] != "pass" else ""
                cells.append(mark + inline("; ".join(fleet_cell_parts(cell))))
            lines.append(f"| {inline(row['host'])} | " + " | ".join(cells) + " |")
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
        inline(versions_note(report)),
        "",
        "| " + " | ".join(VERSIONS_HEAD) + " |",
        "| " + " | ".join("---" for _ in VERSIONS_HEAD) + " |",
    ]
    for row in rows:
        label, *rest = row["cells"]
        name = f"**{inline(label)}**" if row["differs"] else inline(label)
        lines.append(f"| {name} | " + " | ".join(inline(c) for c in rest) + " |")
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
                f"| {inline(host)} | {code(check_id(res))} | {inline(res['status'])} | {inline(value_text(res))} | "
                f"{inline(str(res.get('reason') or '')[:_EVIDENCE_CHARS])} |"
            )
    return lines + [""]


@registers("output.md", "render")
def render(report: dict) -> str:
    nodes = list(report["nodes"].values())
    lines = [
        f"# gpufleet acceptance report: {inline(report['run_id'])}",
        "",
        f"**Verdict: {report['verdict'].upper()}**: {fleet_line(report)}.",
        "",
        f"Generated {report['generated']} from {code(str(report['run_dir']) + '/hosts')}. "
        "Every result is kept unchanged in report.json.",
        "",
        "| node | verdict | "
        + " | ".join(STATUS_ORDER)
        + " | profile | failing (each cause once), warning | why, and what to do |",
        "| --- | --- | " + " | ".join("---:" for _ in STATUS_ORDER) + " | --- | --- | --- |",
    ]
    for node in nodes:
        items, more = findings(node)
        listed = ", ".join(code(i) for i in items) + (f" and {more} more" if more else "")
        lines.append(
            f"| {inline(node['host'])} | **{node['verdict'].upper()}** | "
            + " | ".join(str(node["counts"][s]) for s in STATUS_ORDER)
            + f" | {inline(node.get('profile') or '')} | {listed} | {inline(cause.sentence(node))} |"
        )
    lines.append("")
    if kept_locks(report):
        lines += [
            inline(
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
