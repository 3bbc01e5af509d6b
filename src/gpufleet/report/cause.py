"""What the first screen says of a node: one sentence of its cause and what to do, and every figure past a limit.

    cause(node)             {"text": the figure (or the finding), how far and against what, which GPU (serial) or
                            process (pid); "class", "trust" in words, "action" and "action_why"
                            (fleet/remediation.py), "more": the node's other causes, "status": the status shown}
    failing_figures(node)   every figure of the node past a limit, whatever its kind (GPU, node, host): each
                            comparison row that did not pass and each benchmark figure past its own minimum, worst
                            first: {"what", "value", "unit", "against", "status", "trust", "check"}

A node not accepted is said by its first cause (causes.grouped: hardware first); a node accepted with warnings by its
first warning; an accepted node with a figure past a limit once only by that figure (a re-test); else what passed.
"""

from __future__ import annotations

import math
import re

from gpufleet.base import causes, schema
from gpufleet.comparisons import figure_text
from gpufleet.comparisons.metric_keys import describe
from gpufleet.fleet.component import component, figure_name, gpu_name, serials_of
from gpufleet.fleet.remediation import recommended
from gpufleet.report.formatting import check_id, class_text, decided_limit, fmt_scalar, row_limit

INCONCLUSIVE = "inconclusive"  # the status shown for information that is a figure past its limit once only
TRUST_WORDS = {
    schema.CONFIRMED: "confirmed (measured twice)",
    schema.CLEAN: "measured once, not confirmed",
    schema.DISTURBED: "measured beside another process",
    schema.INCONCLUSIVE: "past its limit in one measurement only",
    None: "read from the node",
}
# What each comparison holds a figure against, where its row does not say (detail.comparisons keeps rows short).
AGAINST = {
    "gpu_vs_node": "its siblings'",
    "node_vs_fleet": "the fleet median",
    "node_vs_baseline": "the baseline run's",
    "node_vs_baseline_fleet": "the baseline run's fleet median",
}
CLAUSE_CHARS = 260  # a reason quoted in the sentence is cut at a clause past this many characters


def shown_status(res: dict) -> str:
    """The status a result is drawn with: its own, but `inconclusive` for information that is a figure past its
    limit in one measurement only (it asks for a re-test, not nothing)."""
    if res.get("status") == schema.INFO and res.get("trust") == schema.INCONCLUSIVE:
        return INCONCLUSIVE
    return res["status"]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _clause(text: str) -> str:
    """The reason, cut at the end of a clause past CLAUSE_CHARS, else at a word (the report has it whole further
    down)."""
    text = " ".join(str(text or "").split())
    if len(text) <= CLAUSE_CHARS + 40:
        return text
    cut = text.find("; ", CLAUSE_CHARS, CLAUSE_CHARS + 40)
    return (text[:cut] if cut > 0 else text[: text.rfind(" ", 0, CLAUSE_CHARS + 40)]) + " ..."


# A foreign process's finding (node/measure.py, foreign_processes): "foreign process(es) on the GPUs or the host
# while STEP measured them: WHO ...". Its sentence starts with who, then the step.
FOREIGN = re.compile(r"^foreign process\(es\) on the GPUs or the host while (?P<step>.+?) measured them: (?P<who>.+)$")


def _row_figure(res: dict, row: dict, serials: dict) -> dict:
    serial = row.get("serial") or serials.get(row.get("uuid")) or serials.get(row.get("index"))
    gpu = row.get("index") is not None or row.get("uuid")
    who = gpu_name({**row, "serial": serial}) if gpu else figure_name(row["metric"])
    label = row.get("label") or describe(row["metric"])["label"]
    what = (
        f"{who}: {label}" if who != label and not label.startswith(who) and who != figure_name(row["metric"]) else who
    )
    limit = row_limit(res, row)
    below = -(row.get("deviation_pct") or 0.0)
    ref = row.get("reference_is") or AGAINST.get(res.get("check"), "its reference")
    against = f"{abs(below):.1f}% {'below' if below >= 0 else 'above'} {ref}"
    if _finite(row.get("reference")):
        against += f" {figure_text(row['reference'])}"
    if limit and _finite(limit.get("value")):
        against += f" (limit {figure_text(limit['value'])}%)"
    return {
        "what": what,
        "value": row.get("value"),
        "unit": row.get("unit") or describe(row["metric"])["unit"],
        "deviation_pct": row.get("deviation_pct"),
        "against": against,
        "status": INCONCLUSIVE if row.get("status") == INCONCLUSIVE else row.get("status"),
        "trust": res.get("trust"),
        "check": check_id(res),
    }


def _own_bound(res: dict, serials: dict) -> dict | None:
    """A benchmark figure past its own minimum or maximum (a floor every GPU is held against alone)."""
    threshold = res.get("threshold") if isinstance(res.get("threshold"), dict) else {}
    value = res.get("value")
    if not _finite(value):
        return None
    for bound, past in (("min", lambda v, b: v < b), ("max", lambda v, b: v > b)):
        b = threshold.get(bound)
        if _finite(b) and past(value, b):
            word = "under its minimum" if bound == "min" else "over its maximum"
            key = str(threshold.get("key") or "")
            metric = key.rsplit("_", 1)[0] if key.endswith(("_min", "_max")) else ""
            label = describe(metric)["label"] if metric and describe(metric)["unit"] else check_id(res)
            who = component(res, serials)
            return {
                "what": f"{who}: {label}" if who != check_id(res) else label,
                "value": value,
                "unit": res.get("unit"),
                "against": f"{word} {fmt_scalar(b)} ({key})",
                "status": shown_status(res),
                "trust": res.get("trust"),
                "check": check_id(res),
            }
    return None


def past_own_bound(res: dict) -> str | None:
    """`under its minimum 700` for a figure past its own limit, whatever its status says (a document whose result
    passed it anyway is shown so, never as a plain pass); None otherwise."""
    own = _own_bound(res, {})
    return own["against"].split(" (")[0] if own else None


def failing_figures(node: dict) -> list[dict]:
    """Every figure of the node past a limit (module docstring), worst first, each (figure, GPU) once."""
    seen: dict[tuple, dict] = {}
    serials = serials_of(node["results"])
    for res in node["results"]:
        detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
        for row in detail.get("comparisons") or []:
            if isinstance(row, dict) and row.get("metric") and row.get("status") not in (None, schema.PASS):
                key = (row["metric"], row.get("index"), row.get("uuid"))
                fig = _row_figure(res, row, serials)
                if key not in seen or _rank(fig) > _rank(seen[key]):
                    seen[key] = fig
        own = _own_bound(res, serials) if res.get("group") != "fleet" else None
        if own is not None:
            seen[(check_id(res), None, None)] = own
    return sorted(seen.values(), key=_rank, reverse=True)


def _rank(fig: dict) -> tuple:
    """Worst status first (inconclusive just under warn), then farthest below."""
    status = fig["status"]
    severity = schema.severity(status) if status in schema.STATUSES else schema.severity(schema.WARN) - 0.5
    return severity, -(fig.get("deviation_pct") or 0.0)


def figure_line(fig: dict) -> str:
    return f"{fig['what']} {figure_text(fig['value'])}{' ' + fig['unit'] if fig.get('unit') else ''}, {fig['against']}"


def _said(res: dict, results: list[dict]) -> str:
    """One result in a sentence: its figure past a limit where it has one, else its reason's first clauses."""
    figs = failing_figures({"results": [res, *[r for r in results if r.get("check") == "gpu_count"]]})
    if figs:
        return figure_line(figs[0]) + (f"; and {len(figs) - 1} more figure(s)" if len(figs) > 1 else "")
    reason = " ".join(str(res.get("reason") or "").split())
    beside = FOREIGN.match(reason)
    if beside:
        return _clause(f"{beside['who']}, while {beside['step']} measured")
    text = _clause(reason or check_id(res))
    who = component(res, serials_of(results))
    short = who.split(" SN ")[0]  # "GPU 2" of "GPU 2 SN 1652823074234"
    if who != short and text.startswith(f"{short}:"):  # the reason names the GPU: its serial beside it
        return who + text[len(short) :]
    return text if who == check_id(res) or who in text else f"{who}: {text}"


def cause(node: dict) -> dict:
    """The node's cause in one sentence and what to do (module docstring)."""
    results = node["results"]
    profile = node.get("profile")
    if node["verdict"] == schema.FAIL:
        groups = node.get("causes") if isinstance(node.get("causes"), list) else causes.grouped(results)
        members = causes.results_of(groups[0], results) if groups else []
        lead = next((r for r in members if failing_figures({"results": [r]})), members[0] if members else None)
        more = len(groups) - 1
    else:
        warned = [r for r in results if r["status"] == schema.WARN]
        unsure = [r for r in results if shown_status(r) == INCONCLUSIVE]
        lead, more = (warned or unsure or [None])[0], len(warned or unsure) - 1
    if lead is None:
        counts = node.get("counts") or {}
        told = ", ".join(f"{counts[s]} {s}" for s in (schema.PASS, schema.INFO, schema.SKIP) if counts.get(s))
        return {
            "text": f"every check passed ({told})" if told else "no check ran",
            "status": node["verdict"],
            "class": "",
            "trust": "",
            "action": "none",
            "action_why": "accepted",
            "more": 0,
        }
    act = recommended(lead, profile)
    return {
        "text": _said(lead, results),
        "status": shown_status(lead),
        "class": class_text(lead),
        "trust": TRUST_WORDS.get(lead.get("trust"), str(lead.get("trust"))),
        "action": act["action"],
        "action_why": act["why"],
        "more": max(0, more),
        "check": check_id(lead),
        "limit": decided_limit(lead),
    }


def sentence(node: dict) -> str:
    """cause() as one line of text (report.md's node table, the brief lines of a large fleet)."""
    c = cause(node)
    said = ", ".join(x for x in (c["class"], c["trust"]) if x)
    more = f" (+{c['more']} more cause(s))" if c["more"] else ""
    return f"{c['text']}{' [' + said + ']' if said else ''}; action: {c['action']}{more}"
