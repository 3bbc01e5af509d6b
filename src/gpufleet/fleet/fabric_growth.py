"""Fabric counter growth: every InfiniBand port's error counters and every PCIe device's AER counts (the GPUs, the
HCAs and the bridges between each and its root port), from the fabric snapshot before the benchmarks to the one
after, and since the node's latest snapshot of an earlier run (the store), over counter_table.FABRIC_COUNTERS; the
host's own counters beside them (EDAC's memory errors per DIMM, each NVMe drive's media errors) the same way.

A counter that stopped counting warns, named as such: read before and unreadable or gone now, back below its
earlier value without a reboot (cleared by hand or by a driver reload: counted from there), or at the maximum of its
IBTA PortCounters field (it counts no more until reset). Correctable AER errors go by checks.counter_rates' rule:
`info` with the rate below their limit, fail at or over it.
"""

from __future__ import annotations

from typing import Any

from gpufleet.base import schema
from gpufleet.checks.counter_rates import judge_rate, limit_text, rate_text
from gpufleet.fleet import figure_text
from gpufleet.fleet.counter_growth import hours_between, window_text
from gpufleet.fleet.counter_table import FABRIC_COUNTERS, FABRIC_PERSISTENT, PORT_COUNTER_BITS
from gpufleet.comparisons.findings import fleet_result, listed_text
from gpufleet.comparisons.thresholds import MIN_WINDOW, Thresholds
from gpufleet.base.judge import Limit, judge
from gpufleet.base.schema import FAIL, INFO, PASS, SKIP, WARN

_UNIT = {"count": "", "per_min": "/min", "per_h": "/h", "ber": ""}
_REMEDY = {
    FAIL: "a port that flapped, went down, broke the spec's bit error ratio or lost its lossless contract: check it "
    "with `mlxlink -d <hca> -p <port> -m -c -e` and the switch port beside it, reseat or replace the cable or "
    "transceiver; a fatal AER error, or correctable ones past DCGM's rate: reseat the device or its riser, update its "
    "firmware; an uncorrected memory error: replace the DIMM named (ras-mc-ctl --errors); NVMe media errors that "
    "grew: move the data off the drive and replace it; drain the node and run the checks again",
    WARN: "watch the rate in the next runs (gpufleet history); service the link or the PCIe path (reseat, cable, "
    "firmware) if it keeps growing; a DIMM correcting errors past mcelog's rate: replace it at the next maintenance; "
    "a counter that stopped counting needs a reset (perfquery -R) or a reboot to be judged again",
}


def _num(v: Any) -> str:
    """A figure in a sentence; a whole float without its .0 (720 per hour, not 720.0)."""
    whole = isinstance(v, (int, float)) and float(v).is_integer()
    return f"{int(v):,}" if whole and abs(v) >= 1000 else str(int(v)) if whole else figure_text(v)


def _devices(snap: dict | None) -> dict:
    return {d["id"]: d for d in (snap or {}).get("devices") or [] if isinstance(d, dict) and d.get("id")}


def _past(figure: float, limit: float) -> bool:
    return judge(figure, Limit("fabric", limit)).status != PASS


def _over(
    entry: dict, how: str, growth: int, hours: float | None, limit: float, rate_gbps: Any, thresholds: Thresholds
) -> bool:
    """Whether the growth is over the limit; records how it was judged in the entry."""
    if how == "count":
        entry.update(judged_by=f"more than {_num(limit)} in the window")
        return _past(growth, limit)
    if how == "per_min":
        if not hours:
            entry.update(judged_by=f"count: the window's length is unknown, more than {_num(limit)}")
            return _past(growth, limit)
        entry["per_min"] = round(growth / (hours * 60), 3)
        entry.update(judged_by=f"average over the window, more than {_num(limit)}/min")
        return _past(entry["per_min"], limit)
    per_h = limit
    if how == "ber":
        if not isinstance(rate_gbps, (int, float)):
            entry.update(judged_by="not judged: the port's rate is unknown")
            return False
        per_h = round(limit * rate_gbps * 1e9 * 3600, 6)
        entry["limit_per_h"] = per_h
        entry["arithmetic"] = f"{limit:g} x {rate_gbps:g}e9 b/s x 3600 s = {_num(per_h)} per hour"
    min_window = thresholds.value(MIN_WINDOW) or 1.0
    if hours:
        entry["per_h"] = round(growth / hours, 3)
    if hours is None or hours < min_window:
        allowed = per_h * min_window
        entry.update(
            allowed_count=allowed,
            judged_by=f"count: the window is too short to extrapolate, at most "
            f"{_num(allowed)} ({_num(per_h)}/h over {_num(min_window)} h)",
        )
        return _past(growth, allowed)
    entry.update(judged_by=f"rate, at most {_num(per_h)}/h")
    return _past(growth / hours, per_h)


def _judge(
    spec: tuple, old: dict, new: dict, rebooted: bool, hours: float | None, thresholds: Thresholds
) -> dict | None:
    """One counter of one device judged from old to new; None where it was not read either time."""
    name, label, kind, how, key, over_status = spec
    a, b = (old.get("counters") or {}).get(name), (new.get("counters") or {}).get(name)
    if a is None and b is None:
        return None
    e: dict = {
        "counter": name,
        "label": label,
        "before": a,
        "now": b,
        "growth": None,
        "status": PASS,
        "key": key,
        "notes": [],
    }
    if b is None:
        e.update(status=WARN, stopped=f"read before ({a}), unreadable or gone now")
        return e
    if a is None:
        e.update(status=SKIP, notes=["not read before: this reading is the reference for the next"])
        return e
    if rebooted and name not in FABRIC_PERSISTENT:
        growth = b
        e["notes"].append("counted since the reboot (boot id changed)")
    elif b < a:
        growth = b
        e.update(
            status=WARN,
            stopped=f"went back from {a} to {b} without a reboot (cleared by hand, perfquery -R, or "
            "a driver reload): counted from there",
        )
    else:
        growth = b - a
    bits = PORT_COUNTER_BITS.get(name) if kind == "ib_port" else None
    if bits and b >= 2**bits - 1:
        e.update(
            status=WARN,
            stopped=f"at {b}, the maximum of its {bits}-bit IBTA PortCounters field: it counts no more "
            "until reset (perfquery -R), so its growth is unknown",
        )
    e["growth"] = growth
    limit = thresholds.value(key)
    e["limit"] = limit
    if how == "rate":
        rated = judge_rate(name, growth, None if hours is None else hours * 3600, limit)
        e.update(status=schema.worst([e["status"], rated.pop("status")]), judged_by=rated.pop("judged_by"), rated=rated)
        e["over"] = e["status"] not in (PASS, INFO)
    elif limit is None:
        e["judged_by"] = f"not judged ({key} is null)"
    elif _over(e, how, growth, hours, limit, new.get("rate_gbps"), thresholds):
        e["status"] = schema.worst([e["status"], over_status])
        e["over"] = True
    return e


def _judge_devices(
    old_snap: dict,
    new_snap: dict,
    rebooted: bool,
    hours: float | None,
    thresholds: Thresholds,
    pairs: list[tuple[dict, dict]] | None = None,
) -> list[tuple[dict, list[dict]]]:
    """[(device, [judged counters])] over the devices of both snapshots (or the given (old, new) pairs)."""
    if pairs is None:
        olds = _devices(old_snap)
        pairs = [(olds[i], d) for i, d in _devices(new_snap).items() if i in olds]
        gone = [d for i, d in olds.items() if i not in _devices(new_snap)]
        pairs += [(d, {**d, "counters": {}}) for d in gone]  # a device gone since: every counter stopped
    out = []
    for old, new in pairs:
        entries = [
            e
            for spec in FABRIC_COUNTERS
            if spec[2] == new.get("kind")
            for e in [_judge(spec, old, new, rebooted, hours, thresholds)]
            if e is not None
        ]
        out.append((new, entries))
    return out


def _sentence(dev: dict, e: dict, hours: float | None) -> str:
    if e.get("stopped") and not e.get("over"):
        return f"{dev.get('name')}: {e['label']} stopped counting: {e['stopped']}"
    names = dev.get("aer_names") or {}
    aer = (
        "; " + ", ".join(f"{sev} {n} {c}" for sev, counts in names.items() for n, c in counts.items()) if names else ""
    )
    if e.get("rated"):
        return (
            f"{dev.get('name')}: {e['label']} grew by {e['growth']} in {window_text(hours)}: "
            f"{rate_text(e['counter'], e['rated'])} (now {e['now']}; {limit_text(e['counter'], e['limit'])}{aer})"
        )
    rate = ""
    if e.get("per_min") is not None:
        rate = f", {_num(e['per_min'])}/min"
    elif e.get("per_h") is not None:
        rate = f", {_num(e['per_h'])}/h"
    flap = " (a flapping link)" if e["counter"] == "link_error_recovery" else ""
    text = (
        f"{dev.get('name')}: {e['label']} grew by {e['growth']} in {window_text(hours)}{rate}{flap} (now {e['now']}; "
        f"{e['key']} {_num(e['limit'])}; judged by {e['judged_by']}"
    )
    if e.get("arithmetic"):
        text += f": {e['arithmetic']}"
    if e.get("stopped"):
        text += f"; it also stopped counting: {e['stopped']}"
    return text + aer + ")"


def _findings(
    judged: list[tuple[dict, list[dict]]], hours_of: Any, thresholds: Thresholds
) -> tuple[str, list[str], dict, list]:
    """(status, sentences, {key: threshold field} of the keys named, evidence rows): the counters that warned or
    failed, then those whose rate is information."""
    status, parts, keys, evidence = PASS, [], {}, []
    for dev, entries in judged:
        bad = [e for e in entries if e["status"] in (WARN, FAIL, INFO)]
        moved = [e for e in entries if e.get("growth")]
        if bad or moved:
            evidence.append(
                {
                    "id": dev.get("id"),
                    "name": dev.get("name"),
                    "counters": {
                        e["counter"]: {
                            k: v for k, v in e.items() if k not in ("label", "counter") and v not in (None, [])
                        }
                        for e in bad + [m for m in moved if m not in bad]
                    },
                }
            )
        for e in bad:
            status = schema.worst([status, e["status"]])
            parts.append((schema.severity(e["status"]), _sentence(dev, e, hours_of(dev))))
            keys[e["key"]] = thresholds.field(e["key"])
    return status, [text for _, text in sorted(parts, key=lambda p: -p[0])], keys, evidence


def _threshold(keys: dict, thresholds: Thresholds) -> dict:
    return next(iter(keys.values())) if keys else thresholds.field("fabric_ib_ber_max")


def _no_snapshots(node_metrics: dict, during: bool) -> str | None:
    fab = node_metrics["snapshots"]["fabric"]
    have = fab.get("before") and fab.get("after") if during else fab.get("before") or fab.get("after")
    if have:
        return None
    if fab["skipped"]:
        return next(iter(fab["skipped"].values()))
    if fab["problems"]:
        return "; ".join(fab["problems"].values())
    if fab.get("before") or fab.get("after"):
        return f"only the {'before' if fab.get('before') else 'after'} fabric snapshot is in this node's results"
    return "no fabric snapshots in this node's results (documents from before them have none)"


def fabric_during_run(host: str, node_metrics: dict, thresholds: Thresholds) -> dict:
    check = "fabric_during_run"
    why = _no_snapshots(node_metrics, during=True)
    if why:
        return fleet_result(
            check,
            SKIP,
            f"no fabric counter growth during the run to judge: {why}",
            threshold=thresholds.field("fabric_ib_ber_max"),
        )
    fab = node_metrics["snapshots"]["fabric"]
    before, after = fab["before"], fab["after"]
    hours = hours_between(before.get("read_at"), after.get("read_at"))
    rebooted = bool(before.get("boot_id") and after.get("boot_id") and before["boot_id"] != after["boot_id"])
    judged = _judge_devices(before, after, rebooted, hours, thresholds)
    status, parts, keys, evidence = _findings(judged, lambda d: hours, thresholds)
    window = f"{before.get('read_at')} to {after.get('read_at')} ({window_text(hours)})"
    kinds = [d.get("kind") for d, _ in judged]
    scope = f"{kinds.count('ib_port')} InfiniBand port(s) and {kinds.count('pcie')} PCIe device(s)"
    if "edac" in kinds or "nvme" in kinds:  # the host's own counters beside the fabric's
        scope += f", {kinds.count('edac')} EDAC DIMM(s) or controller(s) and {kinds.count('nvme')} NVMe drive(s)"
    if parts:
        reason = f"during this run, {window}: " + listed_text(parts)
    else:
        moved = [f"{d.get('name')} {e['label']} +{e['growth']}" for d, es in judged for e in es if e.get("growth")]
        reason = f"no fabric counter grew beyond its limit on {scope} during this run, {window}" + (
            f"; grew within limits: {', '.join(moved[:6])}" if moved else "; none moved"
        )
    if rebooted:
        reason += "; the node rebooted between the snapshots: counted since the reboot"
    for what, why in (
        ("no InfiniBand", after.get("infiniband")),
        ("no AER counts", after.get("aer")),
        ("no EDAC", after.get("edac")),
        ("no NVMe health log", after.get("nvme")),
    ):
        if why:
            reason += f"; {what} ({why})"
    return fleet_result(
        check,
        status,
        reason,
        threshold=_threshold(keys, thresholds),
        remedy=_REMEDY.get(status),
        detail={
            "window": {"from": before.get("read_at"), "to": after.get("read_at"), "hours": hours, "rebooted": rebooted},
            "judged": scope,
            "thresholds": keys,
            "devices": evidence,
            "no_infiniband": after.get("infiniband"),
            "no_aer": after.get("aer"),
            "unreadable": {**(before.get("unreadable") or {}), **(after.get("unreadable") or {})},
        },
    )


def fabric_since_previous_run(
    host: str, run_id: str, node_metrics: dict, store: Any, store_note: str | None, thresholds: Thresholds
) -> dict:
    check = "fabric_since_previous_run"
    why = _no_snapshots(node_metrics, during=False)
    if why is None and store is None:
        why = store_note or "no store"
    if why:
        return fleet_result(
            check,
            SKIP,
            f"no fabric counter growth since the previous run to judge: {why}",
            threshold=thresholds.field("fabric_ib_ber_max"),
        )
    fab = node_metrics["snapshots"]["fabric"]
    now = fab.get("before") or fab.get("after")
    pairs, since, first, hours_by = [], {}, [], {}
    for ident, dev in _devices(now).items():
        prev = store.previous_after(ident, run_id, now.get("read_at"), host=host)
        if prev is None:
            first.append(dev.get("name"))
            continue
        rebooted = bool(prev.get("boot_id") and now.get("boot_id") and prev["boot_id"] != now["boot_id"])
        hours = hours_between(prev["read_at"], now.get("read_at"))
        old = {**dev, "counters": prev["counters"]}
        for d, entries in _judge_devices({}, {}, rebooted, hours, thresholds, pairs=[(old, dev)]):
            pairs.append((d, entries))
        hours_by[ident] = hours
        since[prev["run_id"]] = prev
    if not pairs:
        return fleet_result(
            check,
            SKIP,
            f"no earlier fabric snapshot of this node's {len(first)} device(s) in the store: "
            "this run's counts are the reference for the next",
            threshold=thresholds.field("fabric_ib_ber_max"),
        )
    status, parts, keys, evidence = _findings(pairs, lambda d: hours_by.get(d.get("id")), thresholds)
    runs = ", ".join(f"run {r} (read {p['read_at']})" for r, p in since.items())
    reason = (
        (f"since {runs}: " + listed_text(parts))
        if parts
        else (f"no fabric counter grew beyond its limit on {len(pairs)} device(s) since {runs}")
    )
    if first:
        reason += f"; first snapshot of {len(first)} device(s)"
    return fleet_result(
        check,
        status,
        reason,
        threshold=_threshold(keys, thresholds),
        remedy=_REMEDY.get(status),
        detail={
            "since": {r: {k: p.get(k) for k in ("host", "read_at", "boot_id", "verdict")} for r, p in since.items()},
            "thresholds": keys,
            "devices": evidence,
            "first_seen": first,
        },
    )
