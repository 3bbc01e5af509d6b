"""How a run ended, from what its playbook left: each node's final verdict from report.json, the exit code, the
nodes not accepted with their failing checks (worst first), and the run's last lines."""

from __future__ import annotations

from pathlib import Path

from gpufleet.base import runs, schema
from gpufleet.report.formatting import check_id, ordered_results
from gpufleet.runner import record as rec
from gpufleet.runner.events import FleetState
from gpufleet.runner.invocation import (
    ACCEPTED,
    EXIT_ACCEPTED,
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_NOT_ACCEPTED,
    NOT_ACCEPTED,
    Invocation,
)

WHY_REASON_CHARS, WHY_MORE_CHECKS = 160, 5  # the end of a run: the first reason cut here, this many more checks named


def report_finals(run_dir: Path, hosts: list[str], since: float) -> tuple[dict | None, dict]:
    """report.json when this invocation wrote it, and per node: accepted or not accepted."""
    path = run_dir / "report.json"
    doc, _ = rec.read_json(path)
    if doc is None or path.stat().st_mtime < since - 1:
        return None, {}
    nodes = doc.get("nodes") or {}
    finals = {}
    for host in hosts:
        verdict = (nodes.get(host) or {}).get("verdict")
        if verdict is None:
            finals[host] = "not in the report"
        else:
            finals[host] = ACCEPTED if verdict != schema.FAIL else NOT_ACCEPTED
    return doc, finals


def not_accepted_why(report: dict | None, finals: dict) -> dict[str, list[dict]]:
    """For every node not accepted, its checks that failed or erred, worst first: [{check, status, reason}]."""
    nodes = (report or {}).get("nodes") or {}
    why = {}
    for host, final in finals.items():
        if final == NOT_ACCEPTED and host in nodes:
            bad, _ = ordered_results(nodes[host].get("results") or [])
            why[host] = [
                {"check": check_id(r), "status": r["status"], "reason": " ".join(str(r.get("reason") or "").split())}
                for r in bad
                if r["status"] in (schema.FAIL, schema.ERROR)
            ]
    return why


def ending_text(why: dict[str, list[dict]], message: str) -> str:
    """The last lines of a run: one per node not accepted (its worst cause with the reason, then the others), and
    the run's one-line ending last. A reason several checks give is said once, with how many checks gave it."""
    lines = []
    for host, bad in why.items():
        if not bad:
            lines.append(f"  {host}: not accepted, with no failing check in the report")
            continue
        groups = {}
        for b in bad:  # worst first already; the checks that give one reason together
            groups.setdefault(b["reason"] or f"\0{b['check']}", []).append(b)
        (first, *same), *rest = groups.values()
        reason = (
            first["reason"]
            if len(first["reason"]) <= WHY_REASON_CHARS
            else first["reason"][: WHY_REASON_CHARS - 3] + "..."
        )
        shared = f" and {len(same)} more check(s) with the same reason" if same else ""
        line = f"  {host}: {first['status']} {first['check']}{shared}: {reason or '(no reason given)'}"
        others = [
            f"{g[0]['check']} ({g[0]['status']}" + (f", {len(g)} checks with its reason)" if len(g) > 1 else ")")
            for g in rest[:WHY_MORE_CHECKS]
        ]
        if others:
            left = len(rest) - len(others)
            line += "; also " + ", ".join(others) + (f" and {left} more" if left else "")
        lines.append(line)
    return "\n".join([*lines, message])


def kept_note(kept: dict | str, inv: Invocation, *, killed: bool = False) -> str:
    """What the end of a run says of its node locks once it gave them back itself (release.yml): those it could not
    give back, and how to; `killed`: ansible-playbook was killed, so its own giving back never ran."""
    by_hand = (
        f"the next run on this controller takes them over, or `ansible-playbook release.yml -i {inv.inventory} -e "
        f"gpufleet_run_id={inv.run_id}` gives them back now"
    )
    if isinstance(kept, str):
        return f". Its node locks could not be given back ({kept}): {by_hand}"
    if kept:
        return f". Its node locks are still held on {', '.join(sorted(kept))}, which did not answer: {by_hand}"
    if killed:
        return ". ansible-playbook was killed before it gave its node locks back: they were given back (release.yml)"
    return ""


def judge_report(inv: Invocation, started: float, status: str, rc, fleet: FleetState) -> tuple[int, dict, str]:
    """The exit code from the verdicts of the report this invocation wrote; none written, or no node answered:
    could not run."""
    report, finals = report_finals(inv.run_dir, inv.hosts, started)
    if report is None:
        return (
            EXIT_COULD_NOT_RUN,
            {h: "no report" for h in inv.hosts},
            ending_line(inv, EXIT_COULD_NOT_RUN, status, rc, fleet, None),
        )
    silent = unreachable(report, inv.hosts)
    if inv.hosts and len(silent) == len(inv.hosts):
        named = "; ".join(f"{h}: {why}" for h, why in silent.items())
        return (
            EXIT_COULD_NOT_RUN,
            {h: "not reached" for h in inv.hosts},
            f"run {inv.run_id}: could not run: no node answered ({named[:600]}); report: {inv.run_dir / 'report.md'}",
        )
    fleet.finish(finals)
    code = EXIT_ACCEPTED if all(f == ACCEPTED for f in finals.values()) else EXIT_NOT_ACCEPTED
    return code, finals, ending_line(inv, code, status, rc, fleet, report)


def unreachable(report: dict, hosts: list[str]) -> dict[str, str]:
    """The nodes of `hosts` the run could not reach (their `connection.reachable` error), with its reason."""
    out = {}
    for host in hosts:
        for r in ((report.get("nodes") or {}).get(host) or {}).get("results") or []:
            if r.get("group") == "connection" and r.get("check") == "reachable" and r.get("status") == schema.ERROR:
                out[host] = " ".join(str(r.get("reason") or "").split())[:WHY_REASON_CHARS]
                break
    return out


def fleet_started_epoch(inv: Invocation) -> float:
    """When the latest invocation of this run started (runner.json)."""
    doc = rec.read_record(inv.run_dir) or {}
    invocations = doc.get("invocations") or [{}]
    return float(invocations[-1].get("started_epoch") or 0)


def ending_line(inv: Invocation, code: int, status: str, rc, fleet: FleetState, report: dict | None) -> str:
    run_dir = inv.run_dir
    if code == EXIT_INTERRUPTED:
        since = fleet_started_epoch(inv)
        written = [
            h
            for h in inv.hosts
            if (run_dir / "hosts" / f"{h}.json").exists() and (run_dir / "hosts" / f"{h}.json").stat().st_mtime >= since
        ]
        kept = (
            f"the documents of {', '.join(written)} are in {run_dir / 'hosts'}"
            if written
            else f"nothing finished ({run_dir})"
        )
        return (
            f"run {inv.run_id}: interrupted; {kept}. Go on with: gpufleet fleet resume {inv.run_id} "
            f"--reports-dir {inv.reports_dir}"
        )
    if code == EXIT_COULD_NOT_RUN:
        # The controller's own tasks first: a variable refused before any node, a report that could not be made.
        failed = sorted((f for f in fleet.failures if f.msg), key=lambda f: f.node_play)
        why = (
            "; ".join(f"{f.task}: {' '.join(f.msg.split())}" for f in failed[:3])
            or f"ansible-playbook ended {status} (rc {rc})"
        )
        if not (
            run_dir / runs.RUN_FILE
        ).exists():  # the run never started: its folder goes (invoke), nothing to point at
            return f"run {inv.run_id}: could not run: {why}"
        return f"run {inv.run_id}: could not run: {why}. ansible-runner's output: {rec.runner_dir(run_dir)}/artifacts"
    bad = [h for h in inv.hosts if fleet.nodes[h].final != ACCEPTED]
    files = (report or {}).get("files") or {}
    where = files.get("md") or str(run_dir / "report.md")
    if code == EXIT_ACCEPTED:
        return f"run {inv.run_id}: all {len(inv.hosts)} node(s) accepted; report: {where}"
    return f"run {inv.run_id}: {len(bad)} of {len(inv.hosts)} node(s) not accepted: {', '.join(bad)}; report: {where}"
