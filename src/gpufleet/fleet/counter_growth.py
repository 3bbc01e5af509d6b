"""Error counter growth: from the snapshot before the benchmarks to the one after, and since each GPU's
latest snapshot of an earlier run (the store). The NVLink and PCIe replay counters go by checks.counter_rates' rule
(a rate: `info` below its limit; NVLink replays and recoveries: any increase), the others by growth per hour.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpufleet.base import schema
from gpufleet.checks.counter_rates import (
    INCREASE,
    RATES,
    judge_increase,
    judge_rate,
    limit_text,
    link_growth,
    rate_text,
)
from gpufleet.fleet import flagged, gpu_text, figure_text
from gpufleet.fleet.counter_table import COUNTERS, PERSISTENT
from gpufleet.comparisons.findings import fleet_result, listed_text
from gpufleet.comparisons.thresholds import MIN_WINDOW, Thresholds
from gpufleet.base.judge import Limit, judge
from gpufleet.base.schema import FAIL, INFO, PASS, SKIP, WARN


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


def _growth(old: dict, new: dict, rebooted: bool, links: tuple = (None, None)) -> dict:
    """Growth of every logical counter from `old` to `new` (source counter -> value); `links`, the two readings'
    nvlink_links where both have them, gives the NVLink counters' growth per link."""
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
            "link_growth": link_growth(*links, name, rebooted),
        }
    return out


def _judge_growth(entry: dict, hours: float | None, thresholds: Thresholds, watched: bool) -> dict:
    """One counter's growth judged; `watched`: over a window gpufleet watched (the run), not since the previous run."""
    g, key, name = entry["growth"], entry["threshold_key"], entry["counter"]
    min_window = thresholds.value(MIN_WINDOW) or 1.0
    entry = dict(entry, window_h=None if hours is None else round(hours, 4), per_h=None, judged_by=None, status=PASS)
    if g is None:
        entry["status"] = SKIP
        return entry
    if hours is not None and hours > 0:
        entry["per_h"] = round(g / hours, 3)
    if name in RATES:
        rated = judge_rate(
            name, g, None if hours is None else hours * 3600, thresholds.value(key), entry["link_growth"]
        )
        entry.update(status=rated.pop("status"), judged_by=rated.pop("judged_by"), rated=rated)
        return entry
    if name in INCREASE:
        limit = thresholds.value(key)
        entry.update(
            status=judge_increase(g, limit, watched),
            judged_by=f"{key} {limit}: more fails during a run, warns since the previous run",
        )
        return entry
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
        "uncorrected ECC, rows remapped for uncorrectable errors and remap failures: any growth fails; NVLink CRC FLIT "
        "and data errors, each a GPU's links together, and PCIe replays: a rate over the window (checks.counter_rates), "
        "info below its limit, at or over it fail (CRC) or warn (PCIe replays); NVLink replays and recoveries: any "
        "increase fails during the run and warns since the previous run; the others: growth per hour against their "
        f"fleet_counter_*_per_h_max, and over a window shorter than {figure_text(min_window)} h (too short to "
        f"extrapolate) the count against what {figure_text(min_window)} h at that rate gives"
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
        for k in ("rated", "link_growth", "notes", "unreadable"):
            if e.get(k):
                keep[k] = e[k]
        out[name] = keep
    return out


def _counter_findings(gpus: list[tuple[dict, dict]], thresholds: Thresholds) -> tuple[str, list[str], list[dict]]:
    """(status, finding sentences, flagged GPUs) over [(GPU, {counter: judged entry})]: a sentence for each counter of
    a GPU that warned or failed, then one for each counter whose growth is information, with every GPU's rate."""
    status, parts, flags, info = PASS, [], [], {}
    for g, entries in gpus:
        for e in entries.values():
            if e["status"] == INFO:
                info.setdefault(e["counter"], []).append((g, e))
        bad = [e for e in entries.values() if e["status"] in (WARN, FAIL)]
        if not bad:
            continue
        flags.append(flagged(g))
        for e in bad:
            status = schema.worst([status, e["status"]])
            rate = (
                f", {figure_text(e['per_h'])}/h" if e.get("per_h") is not None and e["counter"] not in INCREASE else ""
            )
            if e.get("rated"):
                parts.append(
                    f"{gpu_text(g)}: {e['label']} grew by {e['growth']} in {window_text(e['window_h'])}: "
                    f"{rate_text(e['counter'], e['rated'])} (now {e['total']}; {limit_text(e['counter'], e['rated']['limit'])})"
                )
                continue
            if e["counter"] in INCREASE:
                limit = e["judged_by"]
            elif e["threshold_key"] is None:
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
    for name, found in info.items():
        status = schema.worst([status, INFO])
        rates = ", ".join(
            f"GPU {g.get('index')} {rate_text(name, e['rated'])}"
            if e.get("rated")
            else f"GPU {g.get('index')} +{e['growth']}"
            for g, e in found
        )
        e = found[0][1]
        limit = limit_text(name, e["rated"]["limit"]) if e.get("rated") else e["judged_by"]
        parts.append(f"{e['label']} grew in {window_text(e['window_h'])}: {rates}; {limit}")
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
            n: _judge_growth(e, hours, thresholds, watched=True)
            for n, e in _growth(
                old.get("counters") or {},
                g.get("counters") or {},
                rebooted,
                (old.get("nvlink_links"), g.get("nvlink_links")),
            ).items()
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
        remedy=_remedy(judged, status),
        detail={
            "window": {"from": before.get("read_at"), "to": after.get("read_at"), "hours": hours, "rebooted": rebooted},
            "judged": _how_judged(thresholds),
            "per_gpu": [{**flagged(g), "counters": _counter_evidence(e)} for g, e in judged],
            "unreadable": {**(before.get("unreadable") or {}), **(after.get("unreadable") or {})},
            "flagged_gpus": flags,
        },
    )


_UNCORRECTABLE = (
    "an uncorrectable memory error happened on that GPU: drain the node, reset the GPU (row remapping needs it) and run "
    "the checks again; a GPU whose uncorrectable errors or remap failures keep growing needs an RMA"
)
_CORRECTED = (
    "the corrected memory errors of that GPU grow faster than a healthy one's: watch it in the next runs (gpufleet "
    "history GPU-UUID); a GPU whose corrected errors or remapped rows keep growing needs service"
)
_NVLINK = (
    "an NVLink of that GPU is past DCGM's limits: `nvidia-smi nvlink -e -i <index>` shows each link's counters; drain "
    "the node, reset the GPUs and run the checks again; a link that keeps erring needs the baseboard or NVSwitch tray "
    "serviced"
)
# What to do, by the counter that warned or failed.
_REMEDY = {
    "ecc_uncorrected": _UNCORRECTABLE,
    "row_remap_uncorrectable": _UNCORRECTABLE,
    "row_remap_failure": _UNCORRECTABLE,
    "ecc_corrected": _CORRECTED,
    "row_remap_correctable": _CORRECTED,
    "nvlink_crc_flit": _NVLINK,
    "nvlink_crc_data": _NVLINK,
    "nvlink_replay": _NVLINK,
    "nvlink_recovery": _NVLINK,
    "pcie_replay": "PCIe replays past DCGM's rate: reseat the GPU or its riser or cable, update the firmware, and watch "
    "it in the next runs (gpufleet history GPU-UUID)",
    "xid": "read the Xid in gpu_health.xid (NVIDIA's Xid catalog) and watch the GPU in the next runs",
}


def _remedy(judged: list[tuple[dict, dict]], status: str) -> str | None:
    """The remedies of the counters behind `status` (warn or fail), each once; None for the other statuses."""
    if status not in (WARN, FAIL):
        return None
    return "; ".join(
        dict.fromkeys(_REMEDY[n] for _, entries in judged for n, e in entries.items() if e["status"] == status)
    )


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
            n: _judge_growth(e, hours, thresholds, watched=False)
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
        remedy=_remedy(judged, status),
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
