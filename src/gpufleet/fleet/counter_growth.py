"""Error counter growth: from the snapshot before the benchmarks to the one after, and since each GPU's
latest snapshot of an earlier run (the store).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpufleet import schema
from gpufleet.fleet import flagged, gpu_text, figure_text
from gpufleet.fleet.counter_table import COUNTERS, PERSISTENT
from gpufleet.comparisons.findings import fleet_result, listed_text
from gpufleet.comparisons.thresholds import MIN_WINDOW, Thresholds
from gpufleet.judge import Limit, judge
from gpufleet.schema import FAIL, PASS, SKIP, WARN


def _time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def hours_between(a: Any, b: Any) -> float | None:
    ta, tb = _time(a), _time(b)
    return None if ta is None or tb is None else (tb - ta).total_seconds() / 3600


def window_text(hours: float | None) -> str:
    if hours is None:
        return "an unknown time"
    return f"{hours * 60:.0f} min" if hours < 2 else f"{hours:.1f} h"


def _growth(old: dict, new: dict, rebooted: bool) -> dict:
    """Growth of every logical counter from `old` to `new` (source counter -> value)."""
    out = {}
    for name, label, sources, combine, key in COUNTERS:
        growths, totals, notes, unreadable = [], [], [], []
        for src in sources:
            a, b = old.get(src), new.get(src)
            if not isinstance(b, int):
                unreadable.append(src)
                continue
            totals.append(b)
            if not isinstance(a, int):
                unreadable.append(src)
                continue
            if rebooted and src not in PERSISTENT:
                growths.append(b)
                notes.append(f"{src} counted since the reboot")
            elif b < a:
                growths.append(b)
                notes.append(
                    f"{src} went down from {a} to {b} (a driver reload or GPU reset cleared it): counted from the reset"
                )
            else:
                growths.append(b - a)
        out[name] = {
            "counter": name,
            "label": label,
            "threshold_key": key,
            "sources": list(sources),
            "total": combine(totals) if totals else None,
            "growth": combine(growths) if growths else None,
            "notes": notes,
            "unreadable": unreadable,
        }
    return out


def _judge_growth(entry: dict, hours: float | None, thresholds: Thresholds) -> dict:
    g, key = entry["growth"], entry["threshold_key"]
    min_window = thresholds.value(MIN_WINDOW) or 1.0
    entry = dict(entry, window_h=None if hours is None else round(hours, 4), per_h=None, judged_by=None, status=PASS)
    if g is None:
        entry["status"] = SKIP
        return entry
    if hours is not None and hours > 0:
        entry["per_h"] = round(g / hours, 3)
    if key is None:
        entry.update(status=FAIL if g > 0 else PASS, judged_by="any growth fails")
        return entry
    limit = thresholds.value(key)
    entry["limit_per_h"] = limit
    if limit is None:
        entry["judged_by"] = f"not judged ({key} is null)"
        return entry
    if hours is None or hours < min_window:
        # Too short to extrapolate: the growth against what min_window at the maximum rate gives.
        allowed = limit * min_window
        entry.update(status=judge(g, Limit(key, allowed, breach=WARN)).status, allowed_count=allowed, judged_by="count")
    else:
        entry.update(status=judge(g / hours, Limit(key, limit, breach=WARN)).status, judged_by="rate")
    return entry


def _how_judged(thresholds: Thresholds) -> str:
    min_window = thresholds.value(MIN_WINDOW) or 1.0
    return (
        f"uncorrected ECC, rows remapped for uncorrectable errors and remap failures: any growth fails; the others: growth "
        f"per hour against their fleet_counter_*_per_h_max, and over a window shorter than {figure_text(min_window)} h (too short "
        f"to extrapolate) the count against what {figure_text(min_window)} h at that rate gives"
    )


def _snap_gpus(snap: dict) -> dict:
    """uuid (or index) -> GPU of a snapshot, visible ones only."""
    out = {}
    for g in snap.get("gpus") or []:
        if isinstance(g, dict) and g.get("visible", True) is not False:
            out[g.get("uuid") or f"index-{g.get('index')}"] = g
    return out


def _counter_evidence(entries: dict) -> dict:
    """Per counter: the total, the growth and its rate; how it was judged only where it did not pass; notes when any."""
    out = {}
    for name, e in entries.items():
        keep = {k: e.get(k) for k in ("total", "growth", "per_h", "status", "judged_by")}
        for k in ("notes", "unreadable"):
            if e.get(k):
                keep[k] = e[k]
        out[name] = keep
    return out


def _counter_findings(gpus: list[tuple[dict, dict]], thresholds: Thresholds) -> tuple[str, list[str], list[dict]]:
    """(status, finding sentences, flagged GPUs) over [(GPU, {counter: judged entry})]."""
    status, parts, flags = PASS, [], []
    for g, entries in gpus:
        bad = [e for e in entries.values() if e["status"] in (WARN, FAIL)]
        if not bad:
            continue
        flags.append(flagged(g))
        for e in bad:
            status = schema.worst([status, e["status"]])
            rate = f", {figure_text(e['per_h'])}/h" if e.get("per_h") is not None else ""
            if e["threshold_key"] is None:
                limit = "any growth fails"
            elif e["judged_by"] == "count":
                limit = (
                    f"{e['threshold_key']} {figure_text(e.get('limit_per_h'))}/h; judged by count, the window being too short to "
                    f"extrapolate: at most {figure_text(e['allowed_count'])}"
                )
            else:
                limit = f"{e['threshold_key']} {figure_text(e.get('limit_per_h'))}/h; judged by rate"
            parts.append(
                f"{gpu_text(g)}: {e['label']} grew by {e['growth']} in {window_text(e['window_h'])}{rate} "
                f"(now {e['total']}; {limit})" + (f"; {'; '.join(e['notes'])}" if e["notes"] else "")
            )
    return status, parts, flags


def _totals_text(gpus: list[tuple[dict, dict]]) -> str:
    """The cumulative totals that are not zero, as evidence: 'NVLink CRC errors 216 (GPU 0), 262 (GPU 1)'."""
    by: dict[str, list[str]] = {}
    for g, entries in gpus:
        for e in entries.values():
            if e.get("total"):
                by.setdefault(e["label"], []).append(f"{e['total']} (GPU {g.get('index')})")
    return "; ".join(f"{label} {', '.join(v)}" for label, v in by.items())


def counters_during_run(host: str, node_metrics: dict, thresholds: Thresholds) -> dict:
    snaps = node_metrics["snapshots"]
    threshold = thresholds.field(MIN_WINDOW)
    before, after = snaps.get("before"), snaps.get("after")
    if not before or not after:
        problems = snaps.get("problems") or {}
        if problems:
            why = "; ".join(problems.values())
        elif before or after:
            why = f"only the {'before' if before else 'after'} snapshot is in this node's results (the run stopped between them?)"
        else:
            why = (
                "no counter snapshots in this node's results (gpufleet.cluster.gpu_counters did not run before and after "
                "the benchmarks; documents from before it existed have none)"
            )
        return fleet_result(
            "counters_during_run", SKIP, f"no growth during the run to judge: {why}", threshold=threshold
        )
    hours = hours_between(before.get("read_at"), after.get("read_at"))
    rebooted = bool(before.get("boot_id") and after.get("boot_id") and before["boot_id"] != after["boot_id"])
    b_gpus, judged = _snap_gpus(before), []
    for ident, g in _snap_gpus(after).items():
        old = b_gpus.get(ident)
        if old is None:
            continue
        entries = {
            n: _judge_growth(e, hours, thresholds)
            for n, e in _growth(old.get("counters") or {}, g.get("counters") or {}, rebooted).items()
        }
        judged.append((g, entries))
    if not judged:
        return fleet_result(
            "counters_during_run", SKIP, "the snapshots before and after name no GPU in common", threshold=threshold
        )
    status, parts, flags = _counter_findings(judged, thresholds)
    window = f"{before.get('read_at')} to {after.get('read_at')} ({window_text(hours)})"
    totals = _totals_text(judged)
    if parts:
        reason = f"during this run, {window}: " + listed_text(parts)
    else:
        reason = f"no counter grew beyond its limit during this run on {len(judged)} GPU(s), {window}"
        reason += f"; cumulative: {totals}" if totals else "; every counter at 0"
    if rebooted:
        reason += "; the node rebooted between the snapshots (boot id changed): counters that a reboot clears are counted since it"
    return fleet_result(
        "counters_during_run",
        status,
        reason,
        threshold=threshold,
        remedy=_COUNTER_REMEDY[status] if status != PASS else None,
        detail={
            "window": {"from": before.get("read_at"), "to": after.get("read_at"), "hours": hours, "rebooted": rebooted},
            "judged": _how_judged(thresholds),
            "per_gpu": [{**flagged(g), "counters": _counter_evidence(e)} for g, e in judged],
            "unreadable": {**(before.get("unreadable") or {}), **(after.get("unreadable") or {})},
            "flagged_gpus": flags,
        },
    )


_COUNTER_REMEDY = {
    FAIL: "an uncorrectable memory error happened on that GPU: drain the node, reset the GPU (row remapping needs it) and "
    "run the checks again; a GPU whose uncorrectable errors or remap failures keep growing needs an RMA",
    WARN: "the error rate of that GPU or link is over what a healthy one shows: watch it in the next runs (gpufleet history "
    "GPU-UUID); service the NVLink or PCIe path (reseat, firmware), or the GPU, if it keeps growing",
}


def counters_since_previous_run(
    host: str, run_id: str, node_metrics: dict, store: Any, store_note: str | None, thresholds: Thresholds
) -> dict:
    snaps = node_metrics["snapshots"]
    threshold = thresholds.field(MIN_WINDOW)
    now = snaps.get("before") or snaps.get("after")
    if not now:
        why = "; ".join((snaps.get("problems") or {}).values()) or (
            "no counter snapshots in this node's results (gpufleet.cluster.gpu_counters did not run; documents from "
            "before it existed have none)"
        )
        return fleet_result(
            "counters_since_previous_run",
            SKIP,
            f"no growth since the previous run to judge: {why}",
            threshold=threshold,
        )
    if store is None:
        return fleet_result(
            "counters_since_previous_run",
            SKIP,
            f"no growth since the previous run to judge: {store_note or 'no store'}",
            threshold=threshold,
        )
    judged, first, since = [], [], {}
    for g in _snap_gpus(now).values():
        prev = store.previous_after(g["uuid"], run_id, now.get("read_at")) if g.get("uuid") else None
        if prev is None:
            first.append(g)
            continue
        rebooted = bool(prev.get("boot_id") and now.get("boot_id") and prev["boot_id"] != now["boot_id"])
        hours = hours_between(prev["read_at"], now.get("read_at"))
        entries = {
            n: _judge_growth(e, hours, thresholds)
            for n, e in _growth(prev["counters"], g.get("counters") or {}, rebooted).items()
        }
        for e in entries.values():
            e.update(
                since_run=prev["run_id"], since_node=prev["host"], since_read_at=prev["read_at"], rebooted=rebooted
            )
        judged.append((g, entries))
        since[prev["run_id"]] = prev
    if not judged:
        return fleet_result(
            "counters_since_previous_run",
            SKIP,
            f"no earlier snapshot of this node's {len(first)} GPU(s) in the store: this is their first run with counter "
            "snapshots; this run's totals are the reference for the next",
            threshold=threshold,
            detail={"first_seen": [flagged(g) for g in first]},
        )
    status, parts, flags = _counter_findings(judged, thresholds)
    runs = ", ".join(
        f"run {r} (node {p['host']}, read {p['read_at']}, "
        f"{'accepted' if p.get('verdict') in ('pass', 'warn') else 'not accepted' if p.get('verdict') else 'not reported'})"
        for r, p in since.items()
    )
    totals = _totals_text(judged)
    if parts:
        reason = f"since {runs}: " + listed_text(parts)
    else:
        moved = any(
            e["growth"] for _, entries in judged for e in entries.values() if e["status"] == PASS and e.get("growth")
        )
        reason = (
            f"{'counters grew within their limits' if moved else 'no counter moved'} on {len(judged)} GPU(s) since {runs}"
            + (f"; cumulative: {totals}" if totals else "")
        )
    if any(e.get("rebooted") for _, entries in judged for e in entries.values()):
        reason += (
            "; the node rebooted since (boot id changed): counters that a reboot clears are counted since the reboot"
        )
    if first:
        reason += f"; first snapshot of {', '.join(gpu_text(g) for g in first)}"
    return fleet_result(
        "counters_since_previous_run",
        status,
        reason,
        threshold=threshold,
        remedy=_COUNTER_REMEDY[status] if status != PASS else None,
        detail={
            "since": {r: {k: p.get(k) for k in ("host", "read_at", "boot_id", "verdict")} for r, p in since.items()},
            "judged": _how_judged(thresholds),
            "per_gpu": [
                {
                    **flagged(g),
                    "since_run": next(iter(e.values()))["since_run"],
                    "window_h": next(iter(e.values()))["window_h"],
                    "counters": _counter_evidence(e),
                }
                for g, e in judged
            ],
            "first_seen": [flagged(g) for g in first],
            "flagged_gpus": flags,
        },
    )
