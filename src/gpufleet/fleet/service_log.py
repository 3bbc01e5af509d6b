"""What keeping the fleet in service did, and what it cost: the events of the run folders' action records, indexed
into the store's table `events`, and the costs read back from them.

The run folders stay the record; each of these files is indexed as a whole (its rows replaced), at the report,
after each action and by `gpufleet store rebuild`:

    slurm.json   `gpufleet slurm` (fleet/slurm_action.py): each drain and resume done, with its time
    sweep.json   `gpufleet slurm sweep` (service/sweep.py): each sweep job, its state, seconds and GPU-hours
    ladder.json  `gpufleet ladder` (service/ladder.py): each step proposed or taken, with its time and outcome

Costs, per node and for the fleet:

    fault_to_drain_s   from a fault's first sign to the node's drain by gpufleet: the first sign is the first of the
                       unbroken row of the node's runs not passing clean (a warn, fail or error) that ends with the
                       run whose verdict drained it, since the node was last back in service
    return_s           from that drain to the node's return to service, whoever resumed it: gpufleet's resume, or
                       Slurm seen giving the node to jobs again (a resume by hand, slurm.json's action "seen",
                       fleet/slurm_action.py seen_back); open while it is still out
    sweep_gpu_seconds  GPU-seconds the sweep jobs held the node (its GPUs x the job's seconds), in all and in the
                       last 7 days; sweep_gpu_hours the same in hours, rounded for people

An episode is one node's: from a drain of that node to that node's return, its events alone (store.events(host)).
"""

from __future__ import annotations

import calendar
import json
import os
import statistics
import time
from pathlib import Path

from gpufleet.base.paths import read_json

SOURCES = ("slurm.json", "sweep.json", "ladder.json")
WEEK_S = 7 * 24 * 3600
# Drains that take a node out for a fault (the run's verdict, the ladder's RMA); a take-over before an acceptance
# run is no fault of the node.
FAULT_DRAINS = ("drain", "drain_resume", "ladder")
SEEN = (
    "seen"  # slurm.json's action of a return to service gpufleet saw but did not make (fleet/slurm_action.py seen_back)
)
COLUMNS = ("run_id", "source", "seq", "at", "host", "slurm_node", "kind", "step", "done", "detail")


def epoch(text: str | None) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _slurm_rows(doc: dict) -> list[dict]:
    rows = []
    for record in doc.get("actions") or []:
        if not isinstance(record, dict) or record.get("check_mode"):
            continue
        for d in record.get("decisions") or []:
            if isinstance(d, dict) and d.get("do") in ("drain", "resume") and d.get("done"):
                rows.append(
                    {
                        "at": d["done"],
                        "host": d.get("host"),
                        "slurm_node": d.get("slurm_node"),
                        "kind": d["do"],
                        "step": record.get("action"),
                        "done": 1,
                        "detail": {"reason": d.get("reason"), "why": d.get("why"), "new": d.get("new")},
                    }
                )
    return rows


def _sweep_rows(doc: dict) -> list[dict]:
    return [
        {
            "at": j.get("end") or j.get("start") or doc.get("submitted"),
            "host": j.get("node"),
            "slurm_node": j.get("node"),
            "kind": "sweep_job",
            "step": j.get("state"),
            "done": int(bool(j.get("judged"))),
            "detail": {
                k: j.get(k)
                for k in ("job_id", "state", "start", "end", "elapsed_s", "gpus", "gpu_seconds", "gpu_hours", "note")
            },
        }
        for j in doc.get("jobs") or []
        if isinstance(j, dict)
    ]


def _ladder_rows(doc: dict) -> list[dict]:
    return [
        {
            "at": s.get("at"),
            "host": s.get("host"),
            "slurm_node": s.get("slurm_node"),
            "kind": "ladder",
            "step": s.get("step"),
            "done": int(bool(s.get("done"))),
            "detail": s,
        }
        for s in doc.get("steps") or []
        if isinstance(s, dict)
    ]


_READERS = {"slurm.json": _slurm_rows, "sweep.json": _sweep_rows, "ladder.json": _ladder_rows}
# The lists each record holds: a file without them is another file, not one of these records.
_LISTS = {"slurm.json": ("actions",), "sweep.json": ("jobs",), "ladder.json": ("judgements", "steps")}


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """One action record (slurm.json, sweep.json, ladder.json, by its name): (its document, None); (None, None) when
    there is none; (None, why it cannot be used) when it is damaged (paths.read_json's reasons) or of another shape."""
    path = Path(path)
    if not os.path.lexists(path):
        return None, None
    doc, why = read_json(path)
    lists = _LISTS[path.name]
    if why is None and not (isinstance(doc, dict) and all(isinstance(doc.get(k), list) for k in lists)):
        why = f"is not a {path.name} record (a JSON object with the list{'s' * (len(lists) > 1)} {' and '.join(lists)})"
    return (None, why) if why else (doc, None)


def run_rows(run_dir: Path, run_id: str) -> tuple[dict[str, list[tuple]], dict[str, str]]:
    """({source file: its event rows}, {source file: why it cannot be read}) of a run folder, as rows of the table
    `events`. A missing file has no rows (its source is still listed, so indexing it replaces what an earlier version
    held); a damaged one is left out of the rows and named: what the store holds of it is kept."""
    out, damaged = {}, {}
    for source in SOURCES:
        doc, why = read_record(Path(run_dir) / source)
        if why:
            damaged[source] = why
            continue
        rows = _READERS[source](doc) if doc is not None else []
        out[source] = [
            (
                run_id,
                source,
                i,
                r["at"],
                r["host"],
                r["slurm_node"],
                r["kind"],
                r["step"],
                r["done"],
                json.dumps(r["detail"], sort_keys=True, default=str),
            )
            for i, r in enumerate(rows)
        ]
    return out, damaged


def as_event(row) -> dict:
    event = dict(zip(COLUMNS, tuple(row)))
    event["detail"] = json.loads(event["detail"] or "{}")
    return event


# ---------------------------------------------------------------- costs


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def node_costs(host: str, events: list[dict], runs: list[dict], now_s: float | None = None) -> dict:
    """One node's costs from its events (oldest first) and its runs ({"run_id", "started", "clean"}, oldest first)."""
    now_s = time.time() if now_s is None else now_s
    sweeps = [e for e in events if e["kind"] == "sweep_job"]
    spent = [(gpu_seconds(e["detail"]), epoch(e["at"]) or 0) for e in sweeps]
    faults, out_since, back_at = [], None, None
    for e in events:
        if e["kind"] == "resume" and out_since is not None:
            out_since["resumed_at"] = back_at = e["at"]
            out_since["resumed_by"] = "gpufleet" if e["step"] != SEEN else "someone else (seen back in service)"
            out_since["return_s"] = _between(out_since["drained_at"], e["at"])
            out_since = None
        drained = (e["kind"] == "drain" and e["step"] in FAULT_DRAINS) or (
            e["kind"] == "ladder" and e["step"] == "rma" and e["done"]
        )
        if drained and out_since is None:
            sign = first_sign(runs, e["run_id"], back_at)
            out_since = {
                "run_id": e["run_id"],
                "slurm_node": e.get("slurm_node"),
                "first_sign": sign and sign["started"],
                "first_sign_run": sign and sign["run_id"],
                "drained_at": e["at"],
                "fault_to_drain_s": _between(sign and sign["started"], e["at"]),
                "resumed_at": None,
                "return_s": None,
            }
            faults.append(out_since)
    return {
        "node": host,
        "sweeps": len(sweeps),
        "sweeps_judged": sum(e["done"] for e in sweeps),
        **_spent(sum(s for s, _ in spent), sum(s for s, at in spent if at >= now_s - WEEK_S)),
        "faults": faults,
        "out_of_service": out_since is not None,
        "out_for_s": max(0.0, now_s - (epoch(out_since["drained_at"]) or now_s)) if out_since else None,
    }


def gpu_seconds(detail: dict) -> float:
    """A sweep job's GPU-seconds; from its GPU-hours for a record made before sweep.json kept the seconds."""
    seconds = detail.get("gpu_seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else float(detail.get("gpu_hours") or 0.0) * 3600


def _spent(seconds: float, seconds_7d: float) -> dict:
    return {
        "sweep_gpu_seconds": seconds,
        "sweep_gpu_seconds_7d": seconds_7d,
        "sweep_gpu_hours": round(seconds / 3600, 4),
        "sweep_gpu_hours_7d": round(seconds_7d / 3600, 4),
    }


def first_sign(runs: list[dict], run_id: str, back_at: str | None = None) -> dict | None:
    """The first run of the unbroken row of runs not clean that ends with run_id, none of them before the node was
    last back in service (`back_at`: a repaired GPU that warns as returning is no sign of the next fault)."""
    ids = [r["run_id"] for r in runs]
    if run_id not in ids:
        return None
    i = ids.index(run_id)
    # Strictly after the return: the run whose report brought the node back starts before it, often in its second.
    while i > 0 and not runs[i - 1]["clean"] and (back_at is None or (runs[i - 1]["started"] or "") > back_at):
        i -= 1
    return runs[i]


def _between(start: str | None, end: str | None) -> float | None:
    a, b = epoch(start), epoch(end)
    return None if a is None or b is None else max(0.0, b - a)


def fleet_costs(per_node: list[dict]) -> dict:
    """The fleet's: sweeps and their GPU-hours summed, the medians of the times, the nodes out of service now."""
    to_drain = [f["fault_to_drain_s"] for n in per_node for f in n["faults"] if f["fault_to_drain_s"] is not None]
    back = [f["return_s"] for n in per_node for f in n["faults"] if f["return_s"] is not None]
    return {
        "nodes": len(per_node),
        "sweeps": sum(n["sweeps"] for n in per_node),
        **_spent(sum(n["sweep_gpu_seconds"] for n in per_node), sum(n["sweep_gpu_seconds_7d"] for n in per_node)),
        "faults": sum(len(n["faults"]) for n in per_node),
        "fault_to_drain_s_median": _median(to_drain),
        "return_s_median": _median(back),
        "out_of_service": sorted(n["node"] for n in per_node if n["out_of_service"]),
    }


def costs(store, hosts: list[str] | None = None) -> dict:
    """{"nodes": {host: node_costs}, "fleet": fleet_costs} from a Store, of `hosts` or of every node with an event."""
    names = hosts if hosts is not None else sorted({e["host"] for e in store.events() if e["host"]})
    with store.reading():
        per = {h: node_costs(h, store.events(h), store.node_runs(h)) for h in names}
    return {"nodes": per, "fleet": fleet_costs(list(per.values()))}
