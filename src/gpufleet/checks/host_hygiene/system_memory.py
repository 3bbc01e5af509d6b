"""The host's memory: errors the kernel counted (EDAC, per memory controller and DIMM), machine checks in the kernel
log (by bank and CPU), and the memory a job would get (a neighbour holding it is named)."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.base.registry import registers
from gpufleet.checks.counter_rates import EDAC_CE_KEY, judge_rate, limit_text, rate_text, seconds_text
from gpufleet.checks.host_hygiene.readings import host_readings
from gpufleet.collect.host.edac import error_places
from gpufleet.base.schema import ERROR, FAIL, INFO, PASS, SKIP, WARN, result, worst

UE_KEY = "host_edac_ue_max"
AVAILABLE_KEY = "host_memory_available_pct_min"
_NAMED_MAX = 6
_UE_REMEDY = (
    "an uncorrectable memory error happened on this boot: drain the node, find the DIMM by its label and location "
    "(`ras-mc-ctl --errors`, the BMC's event log, dmidecode -t memory) and replace it before the node takes jobs"
)


def own_section(readings: dict, check: str, key: str) -> tuple[dict | None, dict | None]:
    """(the host readings' section, None) or (None, a `skip`): every reading since the whole node's checks came
    holds it (a reader that fails says so inside it), so only a recording made before them lacks it."""
    sec = host_readings(readings).get(key)
    if sec is None:
        return None, result(check, SKIP, f"the readings hold no '{key}' section: recorded before gpufleet read it")
    return sec, None


_CE_REMEDY = (
    "a DIMM corrects errors faster than mcelog's per-DIMM limit: replace it at the next maintenance (its label and "
    "location name it; `ras-mc-ctl --errors` lists the addresses), and watch it in the next runs (gpufleet history)"
)


@registers("host_hygiene.memory_errors", "check")
def check_memory_errors(readings: dict, profile: dict) -> dict:
    """EDAC's counts since the driver loaded (this boot): uncorrected errors over host_edac_ue_max fail; corrected ones
    judged as a rate over the time since the counts were reset, against host_edac_ce_per_day_warn (a DIMM, or a
    controller's errors it placed on none)."""
    name = "memory_errors"
    edac, err = own_section(readings, name, "edac")
    if err:
        return err
    ue_max = profiles.value(profile, UE_KEY) or 0
    ce_limit = profiles.value(profile, EDAC_CE_KEY)
    threshold = profiles.threshold(profile, UE_KEY, **{EDAC_CE_KEY: profiles.threshold(profile, EDAC_CE_KEY)})
    if not edac.get("present"):
        return result(name, SKIP, edac.get("reason") or "no EDAC readings", threshold=threshold)
    controllers = edac.get("controllers") or []
    since = [mc["seconds_since_reset"] for mc in controllers if isinstance(mc.get("seconds_since_reset"), int)]
    window_s = min(since) if since else None
    places = [(p["name"], p["ce"], p["ue"]) for p in error_places(edac)]
    detail = {"controllers": controllers, "window_s": window_s}
    unread = [p for p, ce, ue in places if ce is None or ue is None]
    status, parts, remedies = PASS, [], []
    for place, ce, ue in places:
        if isinstance(ue, int) and ue > ue_max:
            status = FAIL
            parts.append(f"{place}: {ue} uncorrected")
            remedies.append(_UE_REMEDY)
        if isinstance(ce, int) and ce > 0:
            rated = judge_rate("edac_ce", ce, window_s, ce_limit)
            status = worst([status, rated["status"]])
            parts.append(f"{place}: {ce} corrected, {rate_text('edac_ce', rated)}")
            if rated["status"] == WARN:
                remedies.append(_CE_REMEDY)
    scope = f"{len(controllers)} memory controller(s), {sum(len(mc.get('dimms') or []) for mc in controllers)} DIMM(s)"
    window = f" in the {seconds_text(window_s)} since the counts were reset (boot)" if window_s else ""
    if unread and status == PASS:
        return result(
            name,
            ERROR,
            f"EDAC counts of {len(unread)} place(s) unreadable: {', '.join(unread[:_NAMED_MAX])}",
            threshold=threshold,
            remedy="check /sys/devices/system/edac/mc on the node (the driver's files) and run again",
            detail=detail,
        )
    if status == PASS:
        return result(
            name,
            PASS,
            f"no memory error on {scope}{window}",
            value=0,
            unit="errors",
            threshold=threshold,
            detail=detail,
        )
    shown = "; ".join(parts[:_NAMED_MAX]) + (f"; and {len(parts) - _NAMED_MAX} more" if len(parts) > _NAMED_MAX else "")
    return result(
        name,
        status,
        f"memory errors on {scope}{window}: {shown} ({limit_text('edac_ce', ce_limit)}; uncorrected: more than "
        f"{ue_max} fails)",
        value=sum(ue or 0 for _, _, ue in places),
        unit="uncorrected errors",
        threshold=threshold,
        remedy="; ".join(dict.fromkeys(remedies)) or None,
        detail=detail,
    )


@registers("host_hygiene.machine_checks", "check")
def check_machine_checks(readings: dict, profile: dict) -> dict:
    """Machine checks in this boot's kernel log (collect.machine_checks): an uncorrected one fails, named by CPU and
    bank; corrected ones are information (their memory errors are EDAC's, judged by memory_errors)."""
    name = "machine_checks"
    log = readings.get("kernel_log")
    if not isinstance(log, dict) or not log.get("readable"):
        why = (log or {}).get("error") if isinstance(log, dict) else "the readings hold no 'kernel_log' section"
        return result(
            name,
            ERROR,
            f"could not verify: {why or 'kernel log unreadable'}",
            remedy="run the check as root so /dev/kmsg can be read, or allow dmesg (sysctl kernel.dmesg_restrict=0)",
        )
    mce = log.get("machine_checks") or {"events": [], "logged_lines": 0}
    events = mce.get("events") or []
    detail = {
        "source": log.get("source"),
        "events": events[:50],
        "events_total": len(events),
        "logged_lines": mce.get("logged_lines"),
    }

    def text(e: dict) -> str:
        what = "uncorrected" + (", processor context corrupt" if e["context_corrupt"] else "")
        return f"CPU {e['cpu']} bank {e['bank']}: status {e['status']} ({what if e['uncorrected'] else 'corrected'})"

    bad = [e for e in events if e["uncorrected"]]
    if bad:
        return result(
            name,
            FAIL,
            f"{len(bad)} uncorrected machine check(s) in this boot's kernel log: "
            + "; ".join(map(text, bad[:_NAMED_MAX])),
            value=len(bad),
            unit="events",
            remedy="decode the bank's status (`mcelog --ascii` or `ras-mc-ctl --errors`): a memory bank points to a "
            "DIMM, a cache or interconnect bank to the CPU; drain the node and have the part replaced",
            detail=detail,
        )
    if events or mce.get("logged_lines"):
        said = "; ".join(map(text, events[:_NAMED_MAX]))
        logged = f"{mce['logged_lines']} 'Machine check events logged' line(s)" if mce.get("logged_lines") else ""
        return result(
            name,
            INFO,
            f"corrected machine checks in this boot's kernel log: {'; '.join(filter(None, [said, logged]))} "
            "(`mcelog --client` or `ras-mc-ctl --errors` shows them; memory errors among them are judged by "
            "host_hygiene.memory_errors)",
            value=len(events),
            unit="events",
            detail=detail,
        )
    return result(
        name,
        PASS,
        f"no machine check in the kernel log ({log.get('source')}, {log.get('lines')} lines)",
        value=0,
        unit="events",
        detail=detail,
    )


@registers("host_hygiene.memory_available", "check")
def check_memory_available(readings: dict, profile: dict) -> dict:
    """The memory a job would get: MemAvailable with the free huge pages, against host_memory_available_pct_min of
    MemTotal; the processes holding the most named."""
    name = "memory_available"
    info, err = own_section(readings, name, "meminfo")
    if err:
        return err
    threshold = profiles.threshold(profile, AVAILABLE_KEY)
    if info.get("reason"):
        return result(
            name,
            ERROR,
            f"memory not read: {info['reason']}",
            threshold=threshold,
            remedy="check /proc/meminfo on the node and run again",
        )
    minimum = profiles.value(profile, AVAILABLE_KEY)
    available = info["available_kib"] + (info.get("hugepages_free_kib") or 0)
    pct = round(100.0 * available / info["total_kib"], 1) if info["total_kib"] else 0.0
    gib = lambda kib: f"{kib / 2**20:.1f} GiB"  # noqa: E731
    top = [p for p in info.get("largest") or [] if "pid" in p]
    holders = ", ".join(f"pid {p['pid']} ({p['name']}, user {p['user']}) {gib(p['rss_kib'])}" for p in top[:3])
    text = f"{gib(available)} of {gib(info['total_kib'])} available ({pct:g}%)"
    detail = {**info, "available_pct": pct}
    if minimum is not None and pct < minimum:
        return result(
            name,
            FAIL,
            f"only {text}, under {minimum:g}%: a job would not get the node's memory; holding the most: {holders}",
            value=pct,
            unit="%",
            threshold=threshold,
            remedy="find what holds the memory (the processes named, `ps aux --sort=-rss`, /dev/shm, huge pages) and "
            "stop it, or keep the node out of the scheduler while it is validated; then run again",
            detail=detail,
        )
    return result(
        name,
        PASS,
        f"{text}; holding the most: {holders or 'not read'}",
        value=pct,
        unit="%",
        threshold=threshold,
        detail=detail,
    )
