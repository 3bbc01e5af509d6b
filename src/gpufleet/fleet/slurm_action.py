"""A run's verdict acted on in Slurm (`gpufleet slurm RUN_DIR`, the role's slurm_action.yml after the report).

    action none          nothing (the default: nothing is drained or resumed unless the operator asks)
           drain         every node not accepted is drained, its reason "gpufleet: <run> <class>: <first check>"
           drain_resume  that, and every node gpufleet itself drained (reason starting "gpufleet:") that is
                         accepted now is resumed

A node drained or down for a reason gpufleet did not write (an administrator's, Slurm's own) is never touched,
nor one held for repair or re-acceptance (reasons "gpufleet: RMA ...", "gpufleet: REACCEPT ..."); the record says so
for each. The breaker: one run drains at most `max_drain` nodes, a count ("2") or a share of
each partition a node to drain belongs to ("50%", at least one node); past it the run drains none, names the
nodes it would have drained and why, and fails. Resuming is never held back by it. With check mode nothing is
changed and the record says what would have been done.

The run folder keeps every action: slurm.json ({"actions": [...]}, one per call, with the time, the states
read back before and after), and report.json and report.md get a "slurm" section of the latest.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from gpufleet.base import paths, runs, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet import export, service_log
from gpufleet.fleet.run_files import put_md_section, read_json, read_md, read_report, read_run_info

ACTIONS = ("none", "drain", "drain_resume")
# NVSentinel's fault-quarantine circuit breaker quarantines at most 50% of the nodes by default
# (circuitBreaker.percentage: 50, docs/configuration/fault-quarantine.md); the same share of a partition here.
DEFAULT_MAX_DRAIN = "50%"
SLURM_FILE = "slurm.json"
MD_HEADING = "## Slurm"
_MAX_DRAIN = re.compile(r"(\d+)(%?)")
FAILING = (schema.FAIL, schema.ERROR)


def parse_action(value) -> str:
    if value not in ACTIONS:
        raise InputError(f"gpufleet_slurm_action is {value!r}; expected one of {', '.join(ACTIONS)}")
    return value


def parse_max_drain(value) -> tuple[int, bool]:
    """(number, is_percent) of gpufleet_slurm_max_drain: a count of nodes (0 or more) or a percent (1% to 100%)."""
    text = str(value).strip()
    parts = _MAX_DRAIN.fullmatch(text) if not isinstance(value, bool) else None
    if not parts or (parts.group(2) and not 0 < int(parts.group(1)) <= 100):
        raise InputError(
            f"gpufleet_slurm_max_drain is {value!r}; expected a count of nodes (e.g. 2) or a percent of a "
            "partition from 1% to 100% (e.g. 50%)"
        )
    return int(parts.group(1)), bool(parts.group(2))


def drain_reason(run_id: str, node: dict) -> str:
    """`gpufleet: <run> <class>: <first cause> +N more`, a cause being a failing check or the reason several share
    (causes.label), hardware first as in drain.txt."""
    named, classes = export.failing_causes(node)
    if not named:
        return slurm.reason(f"{run_id} not accepted")
    more = f" +{len(named) - 1} more" if len(named) > 1 else ""
    return slurm.reason(f"{run_id} {classes[0] or 'failed'}: {named[0]}{more}")


def _allowed(max_drain: tuple[int, bool], partition_size: int) -> int:
    number, percent = max_drain
    return max(1, math.floor(partition_size * number / 100)) if percent else number


def over_limit(taken_out: list[str], nodes: dict, max_drain: tuple[int, bool]) -> list[str]:
    """What is past the limit when these Slurm nodes are taken out of service now (nodes: slurm.show_nodes()): one
    sentence per partition over its share, or one for a count; empty when within it."""
    label = f"{max_drain[0]}{'%' * max_drain[1]}"
    if not max_drain[1]:
        return [f"{len(taken_out)} nodes, more than {max_drain[0]}"] if len(taken_out) > max_drain[0] else []
    over = []
    for part in sorted({p for n in taken_out for p in (nodes.get(n) or {}).get("partitions", [])}):
        size = sum(1 for n in nodes.values() if part in n["partitions"])
        count = sum(1 for n in taken_out if part in (nodes.get(n) or {}).get("partitions", []))
        if count > _allowed(max_drain, size):
            over.append(
                f"partition {part}: {count} of its {size} nodes, more than {label} ({_allowed(max_drain, size)} node(s))"
            )
    return over


def plan(report: dict, nodes: dict, action: str, max_drain: tuple[int, bool], names: dict | None = None) -> dict:
    """What to do for each node of the report, given Slurm's nodes now (slurm.show_nodes()); the breaker applied."""
    decisions = []
    for host, node in report["nodes"].items():
        name = export.slurm_name(host, names)
        now = nodes.get(name)
        accepted = node["verdict"] != schema.FAIL
        d = {
            "host": host,
            "slurm_node": name,
            "verdict": node["verdict"],
            "state": now and now["state"],
            "reason_before": now and now["reason"],
            "do": "nothing",
        }
        decisions.append(d)
        if now is None:
            d["why"] = "not a node of this Slurm cluster (scontrol show node does not list it)"
            continue
        own, out = slurm.is_own(now["reason"]), slurm.out_of_service(now)
        if out and not own:
            d["why"] = (
                f"left alone: {now['state']} for a reason gpufleet did not write ({now['reason'] or 'none given'})"
            )
        elif out and slurm.is_held(now["reason"]):
            d["why"] = (
                f"left alone: held for repair or re-acceptance ({now['reason']}); `gpufleet ladder --clear` or the "
                "replacement flow (`gpufleet fleet accept NODE --slurm`, which resumes it once accepted) clears it"
            )
        elif not accepted and export.held_elsewhere(node):
            d["why"] = "not measured: another gpufleet run held it (its node lock), which is not the node's fault"
        elif not accepted and not any(schema.confirmed(r) for r in node["results"] if r["status"] in FAILING):
            d["why"] = (
                "not drained: its failures are figures not confirmed (measured once, beside another process or never "
                "settled); the ladder proposes a re-test"
            )
        elif not accepted:
            d.update(
                do="drain",
                reason=drain_reason(report["run_id"], node),
                why="not accepted" + (" (already drained by gpufleet: reason renewed)" if out else ""),
            )
            d["new"] = not out  # a node already out of service takes nothing more from the partition
        elif own and out and action == "drain_resume":
            d.update(do="resume", why="accepted; gpufleet had drained it")
        elif own and out:
            d["why"] = "accepted; gpufleet had drained it, but resuming needs gpufleet_slurm_action: drain_resume"
        else:
            d["why"] = "accepted and in service"
    breaker = {"max_drain": f"{max_drain[0]}{'%' * max_drain[1]}", "tripped": False}
    new = [d for d in decisions if d["do"] == "drain" and d.get("new")]
    over = over_limit([d["slurm_node"] for d in new], nodes, max_drain)
    if over:
        would = [d["slurm_node"] for d in new]
        breaker.update(
            tripped=True,
            would_drain=would,
            why=f"gpufleet_slurm_max_drain {breaker['max_drain']}: this run would drain "
            + "; ".join(over)
            + ". Nothing was drained; look at why so many failed, then drain by hand or raise the limit",
        )
        for d in decisions:
            if d["do"] == "drain":
                d.update(do="nothing", would="drain", why=f"breaker tripped: would drain ({d['why']})")
    return {"decisions": decisions, "breaker": breaker}


def act(run_dir: Path, action: str, max_drain, *, names: dict | None = None, check: bool = False) -> dict:
    """Act on RUN_DIR/report.json in Slurm; the record (also appended to slurm.json, and in report.json/.md)."""
    action, limit = parse_action(action), parse_max_drain(max_drain)
    run_dir = Path(run_dir)
    report = read_report(run_dir, "to act on in Slurm")
    kept_actions(run_dir)
    info = read_run_info(run_dir, strict=True)  # its Slurm names: never guessed past a damaged record
    if names is None:
        names = info.get("slurm_node_names")
    record = {"run_id": report["run_id"], "action": action, "check_mode": check, "started": schema.utc_now()}
    if action == "none":
        record.update(decisions=[], breaker=None, note="gpufleet_slurm_action is none: nothing done in Slurm")
    else:
        record.update(plan(report, slurm.show_nodes(), action, limit, names if isinstance(names, dict) else None))
        for d in record["decisions"]:
            if d["do"] == "nothing" or check:
                continue
            try:
                slurm.drain(d["slurm_node"], d["reason"]) if d["do"] == "drain" else slurm.resume(d["slurm_node"])
                d["done"] = schema.utc_now()
            except InputError as exc:
                d["error"] = str(exc)
        if not check:
            after = slurm.show_nodes()
            for d in record["decisions"]:
                d["state_after"] = (after.get(d["slurm_node"]) or {}).get("state")
                d["reason_after"] = (after.get(d["slurm_node"]) or {}).get("reason")
    record["finished"] = schema.utc_now()
    record["ok"] = not (record.get("breaker") or {}).get("tripped") and not any(
        "error" in d for d in record["decisions"]
    )
    if not check:  # check mode changes nothing anywhere: the record is printed, not kept
        _keep(run_dir, record)
    return record


def take_over(run_dir: Path, run_id: str, hosts: list[str], *, names: dict | None = None, check: bool = False) -> dict:
    """The replacement flow (`gpufleet fleet accept NEW --slurm`): before the run, drain each of `hosts` (its Slurm
    name from `names`, else the same) with a gpufleet reason, whatever drained or downed it before (kept in the
    reason and the record): the operator named these nodes, no job lands on them while they are tested, and the
    action after the report resumes them when accepted, or drains them with the run's reason when not."""
    kept_actions(Path(run_dir))
    now = slurm.show_nodes()
    pairs = [(host, export.slurm_name(host, names)) for host in hosts]
    unknown = [n for _, n in pairs if n not in now]
    if unknown:
        raise InputError(
            f"{', '.join(unknown)}: not a node of this Slurm cluster (scontrol show node does not list it); "
            "set gpufleet_slurm_node_name in the inventory when the Slurm name differs"
        )
    record = {
        "run_id": run_id,
        "action": "take_over",
        "check_mode": check,
        "started": schema.utc_now(),
        "breaker": None,
        "decisions": [],
    }
    for host, name in pairs:
        before = now[name]
        d = {
            "host": host,
            "slurm_node": name,
            "verdict": "under test",
            "state": before["state"],
            "reason_before": before["reason"],
            "do": "drain",
            "reason": slurm.reason(
                f"{run_id} accepting, was {before['state']}" + (f": {before['reason']}" if before["reason"] else "")
            ),
            "why": "named for acceptance: out of service while it is tested, resumed only when accepted",
        }
        record["decisions"].append(d)
        if not check:
            slurm.drain(name, d["reason"])
            d["done"] = schema.utc_now()
            d["state_after"] = slurm.show_nodes().get(name, {}).get("state")
    record["finished"] = schema.utc_now()
    record["ok"] = True
    if not check:
        _keep(Path(run_dir), record)
    return record


def seen_back(run_dir: Path, shown: dict, costs: dict) -> dict | None:
    """The nodes gpufleet counts out of service (`costs`: service_log.costs) that Slurm gives to jobs again
    (`shown`: slurm.show_nodes(); slurm.in_service), resumed by someone else (`scontrol update state=resume` by
    hand): each episode ends now, appended to RUN_DIR/slurm.json as a resume seen (action "seen"), which the
    costs and the metrics count as the return to service. The record, or None when no node came back so."""
    at = schema.utc_now()
    decisions = []
    for host, n in sorted(costs["nodes"].items()):
        name = (n["faults"][-1] if n["faults"] else {}).get("slurm_node") or host
        now = shown.get(name)
        if not n["out_of_service"] or now is None or not slurm.in_service(now):
            continue
        decisions.append(
            {
                "host": host,
                "slurm_node": name,
                "state": now["state"],
                "do": "resume",
                "done": at,
                "why": f"back in service in Slurm ({now['state']}), resumed by someone other than gpufleet: seen at {at}",
            }
        )
    if not decisions:
        return None
    record = {"run_id": runs.run_id_of(run_dir), "action": service_log.SEEN, "check_mode": False, "started": at}
    record.update(decisions=decisions, breaker=None, finished=at, ok=True)
    _append(run_dir, record)
    return record


def kept_actions(run_dir: Path) -> list[dict]:
    """The actions slurm.json keeps; InputError naming it when it is damaged, read before anything is done: what it
    holds would be lost under the next record, or (the ladder's breaker) miscounted. report.md, which gets the
    latest's section, is read too."""
    path = run_dir / SLURM_FILE
    doc, why = service_log.read_record(path)
    if why:
        raise InputError(
            f"{path} {why}: nothing was done, as its earlier records would be lost under this one; restore it, or "
            "move it aside (the store keeps what it indexed of it)"
        )
    read_md(run_dir / "report.md")
    return (doc or {}).get("actions") or []


def _append(run_dir: Path, record: dict) -> None:
    actions = kept_actions(run_dir)
    paths.write_atomic(run_dir / SLURM_FILE, json.dumps({"actions": [*actions, record]}, indent=1) + "\n")


def _keep(run_dir: Path, record: dict) -> None:
    """Append to slurm.json; the latest as report.json's "slurm" and report.md's Slurm section, once reported."""
    _append(run_dir, record)
    report_json = run_dir / "report.json"
    report = read_json(report_json)
    if not isinstance(report, dict):  # not reported yet (a take-over before the run)
        return
    report["slurm"] = record
    paths.write_atomic(report_json, json.dumps(report, default=str) + "\n")
    put_md_section(run_dir / "report.md", MD_HEADING, summary_lines(record))


def summary_lines(record: dict) -> list[str]:
    """The record in words: a heading, the breaker, then one line per node."""
    mode = " (check mode: nothing changed)" if record["check_mode"] else ""
    lines = [MD_HEADING, "", f"gpufleet_slurm_action {record['action']}{mode}, {record['started']}.", ""]
    if record.get("note"):
        return lines + [record["note"]]
    breaker = record["breaker"] or {}
    if breaker.get("tripped"):
        lines += [f"Breaker tripped: {breaker['why']}. Would have drained: {', '.join(breaker['would_drain'])}.", ""]
    for d in record["decisions"]:
        did = {
            "drain": "drained" if not record["check_mode"] else "would drain",
            "resume": "resumed" if not record["check_mode"] else "would resume",
        }.get(d["do"], "nothing done")
        if "error" in d:
            did = f"FAILED to {d['do']}: {d['error']}"
        reason = f' reason "{d["reason"]}"' if d["do"] == "drain" else ""
        after = f", now {d['state_after']}" if d.get("state_after") else ""
        lines.append(
            f"- {d['slurm_node']} ({d['host']}, {d['verdict']}, was {d['state'] or 'unknown'}): {did}{reason}; "
            f"{d['why']}{after}"
        )
    return lines
