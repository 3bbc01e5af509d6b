"""What the report proposes to drain in Slurm: for each node not accepted, which of its failures were confirmed,
and a drain line (drain.txt, the "Drain in Slurm" box) only for a node with a confirmed one.

A finding read from the node (a counter, a setting, an Xid, a check that could not run) stands as it is; a
performance figure stands only once measured again and still past its limit (schema.confirmed: trust
`confirmed`). A figure measured once, beside another process or never settled is named, not drained for: taking a
node out of service on one sample may take a healthy node out.
"""

from __future__ import annotations

from gpufleet.base import causes, schema
from gpufleet.fleet import component, export
from gpufleet.report.formatting import check_id, trust_text


def review(report: dict, slurm_names: dict | None = None) -> tuple[list[str], list[dict]]:
    """(the drain lines, one per node with a confirmed failure, in the report's order; per node not accepted:
    {"host", "confirmed": [its confirmed causes, causes.label], "components": [what each is about:
    component.of_cause], "unconfirmed": [{"check", "trust"}], "drain": its line or None}). A node that failed only because another run held it is neither (export.held_elsewhere)."""
    lines, rows = [], []
    for host, node in report["nodes"].items():
        if node["verdict"] != schema.FAIL or export.held_elsewhere(node):
            continue
        failing = [r for r in node["results"] if r["status"] in causes.FAILING]
        confirmed = [r for r in failing if schema.confirmed(r)]
        groups = causes.grouped(confirmed)
        line = None
        if confirmed:
            named, classes = export.failing_causes({"causes": groups})
            line = export.drain_line(report["run_id"], export.slurm_name(host, slurm_names), named, classes)
            lines.append(line)
        rows.append(
            {
                "host": host,
                "confirmed": [causes.label(g) for g in groups],
                "components": [component.of_cause(g, confirmed) for g in groups],
                "unconfirmed": [
                    {"check": check_id(r), "trust": trust_text(r)} for r in failing if not schema.confirmed(r)
                ],
                "drain": line,
            }
        )
    return lines, rows


NOT_CONFIRMED = (
    "not proposed: a figure stands only once measured again and still past its limit (trust confirmed); "
    "run the node's benchmarks again on an idle node"
)
