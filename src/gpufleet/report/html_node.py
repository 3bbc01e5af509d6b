"""One node's section of report.html: its cause and what to do, its findings (each with the limit that decided it,
its reason, remedy, recommended action and evidence), a figure past its limit once only beside them (it asks for a
re-test), information apart, its GPUs as an RMA desk asks for them, its skipped checks and its passes folded and
counted, then its pictures: each GPU beside its siblings and its past, the soak window by window, NCCL's busbw
beside the baseline's."""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.base.causes import in_shared
from gpufleet.fleet.remediation import recommended
from gpufleet.report import cause as causes_of
from gpufleet.report import chart_data, inventory, soak_data, svg, svg_soak
from gpufleet.report.formatting import (
    INFO_TITLE,
    STATUS_ORDER,
    check_id,
    class_text,
    findings,
    fmt_scalar,
    information,
    node_causes,
    node_versions_text,
)
from gpufleet.report.html_parts import (
    action_badge,
    badge,
    esc,
    evidence,
    figure_cell,
    plain_table,
    threshold_cell,
)

SKIPPED_TITLE = "skipped: not applicable on this node"


def _finding_row(res: dict, profile: str | None) -> str:
    status = causes_of.shown_status(res)
    text = f"<div>{esc(res.get('reason') or '(no reason given)')}</div>"
    if res.get("remedy"):
        text += f'<div class="remedy"><b>Remedy:</b> {esc(res["remedy"])}</div>'
    act = recommended(res, profile)
    text += f'<div class="act">action: {action_badge(act["action"])} <span class="why">{esc(act["why"])}</span></div>'
    detail = res.get("detail")
    if detail:
        n = len(detail) if isinstance(detail, (dict, list)) else 1
        text += f"<details><summary>evidence ({n} field{'s' if n != 1 else ''})</summary>{evidence(detail)}</details>"
    head = f"{badge(status)} {esc(class_text(res))}<div><code>{esc(check_id(res))}</code></div>"
    return (
        f'<tr class="s-{esc(status)}"><td class="check">{head}</td><td>{figure_cell(res)}</td><td>{threshold_cell(res)}</td>'
        f"<td>{text}</td></tr>"
    )


def _cause_row(group: dict) -> str:
    """One row for a cause several failing checks share: the checks listed, the reason and remedy once."""
    text = f"<div>{esc(group['cause'])}</div>"
    if group["remedy"]:
        text += f'<div class="remedy"><b>Remedy:</b> {esc(group["remedy"])}</div>'
    checks = ", ".join(f"<code>{esc(c)}</code>" for c in group["checks"])
    return (
        f'<tr class="s-{esc(group["status"])}"><td>{badge(group["status"])} {esc(group["class"] or "")}'
        f"<div>{len(group['checks'])} checks: {checks}</div></td><td></td><td></td><td>{text}</td></tr>"
    )


GPU_HEAD = ("GPU, serial, bus id", "UUID", "VBIOS, InfoROM", "ECC corrected / uncorrected (volatile; aggregate)",
            "remapped rows (correctable / uncorrectable)", "named by")  # fmt: skip


def _gpu_table(node: dict) -> str:
    rows = inventory.gpu_rows(node)
    if not rows:
        return ""
    head = "".join(f"<th>{esc(title)}</th>" for title in GPU_HEAD)

    def cell(*parts) -> str:
        return "<td>" + "".join(f"<div>{esc(p)}</div>" for p in parts if p not in (None, "")) + "</td>"

    body = "".join(
        f'<tr data-gpu="{esc(r["index"])}">'
        + cell(f"GPU {r['index']}", f"SN {r['serial']}" if r["serial"] else None, r["pci_bus_id"])
        + cell(r["uuid"])
        + cell(r["vbios"], r["inforom"])
        + cell(r["ecc"])
        + cell(r["rows"])
        + cell(r["named"])
        + "</tr>"
        for r in rows
    )
    opened = " open" if node["verdict"] != schema.PASS else ""
    return (
        f"<details{opened}><summary>{len(rows)} GPU(s): serials, firmware, ECC and remapped rows</summary>"
        f'<table class="gpus"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></details>'
    )


def section(node: dict, anchor: str, report: dict) -> str:
    facts = []
    if node.get("reported_host"):
        facts.append(f"reports itself as {esc(node['reported_host'])}")
    if node.get("profile"):
        facts.append(f"profile <code>{esc(node['profile'])}</code>")
    if node_versions_text(node):
        facts.append(esc(node_versions_text(node)))
    if node.get("started"):
        secs = f" ({esc(fmt_scalar(node['seconds']))} s)" if node.get("seconds") is not None else ""
        facts.append(f"checked {esc(node['started'])}{secs}")
    if node.get("source"):
        facts.append(f"from <code>{esc(node['source'])}</code>")
    if (node.get("certificate") or {}).get("certified"):
        expired = "<strong>expired</strong>: " if node["certificate"]["expired"] else ""
        facts.append(expired + esc(node["certificate"]["text"]))
    out = [f'<section id="{anchor}"><h2>{esc(node["host"])} {badge(node["verdict"])}</h2>']
    if facts:
        out.append(f'<p class="meta">{"; ".join(facts)}</p>')
    said = causes_of.cause(node)  # its words are in the node table and in the findings below: here what to do
    out.append(
        f'<p class="act">what to do: {action_badge(said["action"])} <span class="why">{esc(said["action_why"])}</span></p>'
    )
    results = node["results"]
    unsure = [r for r in results if causes_of.shown_status(r) == causes_of.INCONCLUSIVE]
    bad = sorted(
        (r for r in results if r["status"] not in (schema.PASS, schema.INFO, schema.SKIP)),
        key=lambda r: -schema.severity(r["status"]),
    )
    # A reason several failing checks give is said once, with those checks; the other results one row each.
    shared = [g for g in node_causes(node) if len(g["checks"]) > 1]
    bad = [r for r in bad if not in_shared(r, shared)] + unsure
    if shared or bad:
        out.append(
            '<table class="results"><thead><tr><th>result</th><th>figure</th><th>limit</th>'
            "<th>reason, remedy, action, evidence</th></tr></thead><tbody>"
        )
        out += [_cause_row(g) for g in shared]
        out += [_finding_row(r, node.get("profile")) for r in bad]
        out.append("</tbody></table>")
    info = [r for r in information(results) if r not in unsure]
    if info:  # findings with no action: shown apart, open, and part of no verdict
        out.append(
            f"<details open><summary>{len(info)} {esc(INFO_TITLE[0].lower() + INFO_TITLE[1:])}</summary>"
            + plain_table(info)
            + "</details>"
        )
    out.append(_gpu_table(node))
    for title, rows in (
        (SKIPPED_TITLE, [r for r in results if r["status"] == schema.SKIP]),
        ("passed", [r for r in results if r["status"] == schema.PASS]),
    ):
        if rows:  # folded, counted
            out.append(f"<details><summary>{len(rows)} {esc(title)}</summary>{plain_table(rows)}</details>")
    pictures = _pictures(node, report)
    if pictures:
        out.append(pictures)
    out.append("</section>")
    return "\n".join(out)


SOAK_CAPTION = (
    "{title}: each GPU's figure per {window} s window, the limit dashed ({limit}% under the GPU's best windows), then "
    "what the sampler saw in each window: the hottest temperature against the slowdown temperature, the median power "
    "(ticks: the highest) against the power limit, the median SM clock (ticks: the lowest) and the clock-event "
    "reasons; the legend names every mark drawn"
)


def _pictures(node: dict, report: dict) -> str:
    """The node's pictures: each GPU beside its siblings and its past, the soak window by window, NCCL's busbw
    beside the baseline's."""
    out = []
    panels = chart_data.gpu_bars(node["results"], node.get("per_gpu"))
    if panels:
        out.append("<h3>Each GPU beside its siblings and its past</h3>")
        out.append('<div class="panels">')
        for panel in panels:
            caption = f"{panel['label']} per GPU ({panel['unit']})" + (
                f"; the siblings' limit {fmt_scalar(panel['sibling_limit_pct'])}% under what each GPU is held against"
                if panel["sibling_limit_pct"] is not None
                else ""
            )
            out.append(f"<figure>{svg.bars_svg(panel)}<figcaption>{esc(caption)}</figcaption></figure>")
        out.append("</div>")
    timelines = soak_data.soak_timelines(node["results"])
    if timelines:
        out.append('<h3>The soak, window by window</h3><div class="soak">')
        for t in timelines:
            caption = SOAK_CAPTION.format(
                title=t["title"], window=fmt_scalar(t["window_s"]), limit=fmt_scalar(t["limit_pct"])
            )
            out.append(f"<figure>{svg_soak.soak_svg(t)}<figcaption>{esc(caption)}</figcaption></figure>")
        out.append("</div>")
    charts = chart_data.nccl_charts(node, report)
    if charts:
        out.append("<h3>NCCL bus bandwidth</h3>")
    for chart in charts:
        notes = []
        if chart.get("backend") == "gloo":
            notes.append("on the CPU: a logic check, not a performance figure")
        if chart.get("baseline_run"):
            notes.append(f"dashed: baseline run {chart['baseline_run']}, at the largest size of each size band")
        caption = esc(chart["title"]) + "".join(f"; {esc(n)}" for n in notes)
        out.append(f"<figure>{svg.busbw_svg(chart)}<figcaption>{caption}</figcaption></figure>")
    return "\n".join(out)


def brief(node: dict, anchor: str) -> str:
    """One line for a node the page does not detail: its verdict, its counts, what failed or warned."""
    counts = ", ".join(f"{node['counts'][s]} {s}" for s in STATUS_ORDER if node["counts"][s])
    items, more = findings(node, limit=6)
    failing = f"; {', '.join(items)}{f' and {more} more' if more else ''}" if items else ""
    return (
        f'<section id="{anchor}" class="brief"><h4>{esc(node["host"])} {badge(node["verdict"])}</h4> '
        f'<span class="meta">{esc(counts)}; {esc(node.get("profile") or "")}{esc(failing)}</span></section>'
    )
