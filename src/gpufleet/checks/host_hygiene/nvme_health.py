"""Each local NVMe drive's own health log (collect.host.nvme): its critical warning, spare, wear, media errors and
temperature, as the drive reports them."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.base.registry import registers
from gpufleet.checks.host_hygiene.system_memory import own_section
from gpufleet.collect.host.nvme import CRITICAL_WARNING_BITS, drive_name
from gpufleet.base.schema import ERROR, FAIL, INFO, PASS, SKIP, WARN, result, worst

WEAR_KEY = "nvme_percentage_used_warn"
_FAIL_REMEDY = (
    "the drive says it is failing (its critical warning or spare below its threshold): drain the node, move what it "
    "holds off it and replace the drive; `nvme smart-log` and `nvme error-log` show what it reported"
)
_WEAR_REMEDY = (
    "the drive has used most of its rated endurance: plan its replacement in the next maintenance window, before it "
    "reaches 100% and its spare runs out (`nvme smart-log` shows the wear; the vendor's warranty names its limit)"
)


def _findings(d: dict, wear_warn) -> list[tuple[str, str]]:
    """(status, sentence) of one drive's log, worst first."""
    log, out = d["log"], []
    warning = log.get("critical_warning") or 0
    if warning:
        bits = [text for bit, text in CRITICAL_WARNING_BITS.items() if warning >> bit & 1]
        out.append((FAIL, f"critical warning 0x{warning:02x} ({', '.join(bits) or 'reserved bits'})"))
    spare, floor = log.get("available_spare_pct"), log.get("available_spare_threshold_pct")
    if isinstance(spare, int) and isinstance(floor, int) and spare < floor:
        out.append((FAIL, f"available spare {spare}% below its threshold {floor}%"))
    used = log.get("percentage_used")
    if wear_warn is not None and isinstance(used, int) and used >= wear_warn:
        out.append((WARN, f"{used}% of its rated endurance used (warn from {wear_warn:g}%)"))
    if log.get("media_errors"):
        out.append(
            (
                INFO,
                f"{log['media_errors']} media and data integrity error(s) over its life (their growth is "
                "judged by fleet.fabric_*)",
            )
        )
    return out


@registers("host_hygiene.nvme_health", "check")
def check_nvme_health(readings: dict, profile: dict) -> dict:
    """Every local NVMe drive's health log: a critical warning or spare under its threshold fails, wear at
    nvme_percentage_used_warn or more warns with the replacement to plan; a log that could not be read is an error."""
    name = "nvme_health"
    nvme, err = own_section(readings, name, "nvme")
    if err:
        return err
    threshold = profiles.threshold(profile, WEAR_KEY)
    if not nvme.get("present"):
        return result(name, SKIP, nvme.get("reason") or "no NVMe readings", threshold=threshold)
    drives = nvme.get("drives") or []
    unread = [d for d in drives if d.get("log") is None]
    wear_warn = profiles.value(profile, WEAR_KEY)
    status, parts, remedies = PASS, [], []
    for d in drives:
        if d.get("log") is None:
            continue
        for st, text in _findings(d, wear_warn):
            status = worst([status, st])
            parts.append(f"{drive_name(d)}: {text}")
            remedies += [_FAIL_REMEDY] if st == FAIL else [_WEAR_REMEDY] if st == WARN else []
    read = [d for d in drives if d.get("log") is not None]
    temps = ", ".join(
        f"{d['controller']} {d['log']['temperature_c']} C" for d in read if d["log"].get("temperature_c") is not None
    )
    detail = {"drives": drives}
    if status in (FAIL, WARN):
        return result(
            name,
            status,
            f"NVMe health: {'; '.join(parts)}" + (f"; {len(unread)} drive log(s) not read" if unread else ""),
            value=len([p for p in parts]),
            unit="findings",
            threshold=threshold,
            remedy="; ".join(dict.fromkeys(remedies)),
            detail=detail,
        )
    if unread:
        first = unread[0]
        return result(
            name,
            ERROR,
            f"the health log of {len(unread)} NVMe drive(s) not read: {drive_name(first)}: {first.get('reason')}",
            threshold=threshold,
            remedy="run the check as root (become: true), which a drive's admin commands need, or install nvme-cli",
            detail=detail,
        )
    wear = ", ".join(f"{d['controller']} {d['log'].get('percentage_used')}%" for d in read)
    said = (
        f"{len(read)} NVMe drive(s) healthy by their own log: no critical warning, spare above its threshold, "
        f"wear {wear}" + (f"; temperature {temps}" if temps else "")
    )
    if status == INFO:
        return result(
            name, INFO, f"{said}; {'; '.join(parts)}", value=0, unit="findings", threshold=threshold, detail=detail
        )
    return result(name, PASS, said, value=0, unit="findings", threshold=threshold, detail=detail)
