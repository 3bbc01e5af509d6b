"""What each check said in the calibration table (tools/calibration_table.py): as the recorded run said it, and as
today's judges say of the same figures (REPLAYED: benchmarks.replay, then the fleet layer over each round); per check,
the false alarms on clean runs and the detections on disturbed ones."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from calibration_rows import condition
from gpufleet.base import profiles
from gpufleet.benchmarks import replay
from gpufleet.fleet import compare

NOT_PASSING = ("warn", "fail", "error")
# The fleet checks that hold a node against the store (its baseline, its past): the replay has no store, so today's
# columns say nothing of them ("-").
NEEDS_STORE = (
    "fleet.node_vs_baseline",
    "fleet.node_vs_baseline_fleet",
    "fleet.counters_since_previous_run",
    "fleet.fabric_since_previous_run",
    "fleet.returning_gpu",
)


def replay_round(members: list[dict], run_id: str, profile_dir: Path | None) -> dict[str, list[dict]]:
    """{node: today's results}: each node's benchmark figures judged again, then the fleet layer over the round."""
    nodes = {}
    for r in members:
        doc = r["document"]
        prof = doc.get("profile") or {}
        overrides = {
            k: e["value"]
            for k, e in (prof.get("thresholds") or {}).items()
            if isinstance(e, dict) and str(e.get("source", "")).startswith("inventory override")
        }
        try:
            profile = profiles.resolve(
                None, profile_name=prof.get("name") or profiles.GENERIC, overrides=overrides, profile_dir=profile_dir
            )
        except profiles.ProfileError:
            profile = profiles.resolve(None, profile_name=profiles.GENERIC, profile_dir=profile_dir)
        results = [x for x in replay.benchmark_results(doc.get("results") or [], profile) if x.get("group") != "fleet"]
        nodes[r["node"]] = {
            "results": results,
            "profile": {"name": profile["name"], "thresholds": profile["thresholds"]},
            "versions": doc.get("versions") or {},
        }
    fleet = compare.evaluate(run_id, nodes, store=None, store_note="replayed without the store of the calibration run")
    return {node: n["results"] + fleet["results"].get(node, []) for node, n in nodes.items()}


def recorded_statuses(row: dict) -> tuple[dict[str, str], set[str]]:
    """(each check's status as the run's report said it, the checks the report accepted that the node's document
    did not: a stable fact the baseline had accepted, held against the store and not warned again)."""
    out = {}
    for res in row["document"].get("results") or []:
        out[f"{res.get('group')}.{res.get('check')}"] = res.get("status")
    report = row.get("report") or {}
    listed = {f"{f.get('group')}.{f.get('check')}": f.get("status") for f in report.get("not_passing") or []}
    accepted = set()
    if "not_passing" in report:
        accepted = {check for check, status in out.items() if status in NOT_PASSING and check not in listed}
        out.update(dict.fromkeys(accepted, "info"))
    out.update(listed)
    return out, accepted


def verdict_of(statuses: dict) -> str:
    values = set(statuses.values())
    return "fail" if values & {"fail", "error"} else "warn" if "warn" in values else "pass"


def names_process(statuses: dict, results: list[dict] | None = None) -> bool:
    return any(k.endswith(("_processes", ".processes", "processes_after")) for k, s in statuses.items() if s == "fail")


def outcomes(rows: list[dict], today: dict) -> dict:
    """Per check: clean runs, false alarms, disturbed runs, detections (recorded, today); and the node verdicts."""
    table: dict = defaultdict(
        lambda: {
            "clean": 0,
            "fa_rec": 0,
            "fa_now": 0,
            "disturbed": 0,
            "det_rec": 0,
            "det_now": 0,
            "beside": 0,
            "beside_rec": 0,
            "beside_now": 0,
        }
    )
    for r in rows:
        cond = condition(r)
        rec, accepted = recorded_statuses(r)
        now = {f"{x.get('group')}.{x.get('check')}": x.get("status") for x in today.get((r["round"], r["node"]), [])}
        # The replay has no store: what the report accepted against it stays accepted where today judged it the same.
        doc = {f"{x.get('group')}.{x.get('check')}": x.get("status") for x in r["document"].get("results") or []}
        now.update({c: "info" for c in accepted if now.get(c) == doc.get(c)})
        rec["node verdict"] = (r.get("report") or {}).get("verdict") or verdict_of(rec)
        now["node verdict"] = verdict_of(now) if now else rec["node verdict"]
        rec["node not accepted, process named"] = (
            "fail" if rec["node verdict"] in ("fail", "error") and names_process(rec) else "pass"
        )
        now["node not accepted, process named"] = (
            "fail" if now["node verdict"] in ("fail", "error") and names_process(now) else "pass"
        )
        for check in set(rec) | set(now):
            t = table[check]
            bad_rec, bad_now = rec.get(check) in NOT_PASSING, now.get(check) in NOT_PASSING
            if cond == "clean":
                t["clean"] += 1
                t["fa_rec"] += bad_rec
                t["fa_now"] += bad_now
            elif cond == "disturbed":
                t["disturbed"] += 1
                t["det_rec"] += bad_rec
                t["det_now"] += bad_now
            else:
                t["beside"] += 1
                t["beside_rec"] += bad_rec
                t["beside_now"] += bad_now
    return table
