"""PCIe: ACS on the bridges between GPUs and NICs (peer-to-peer must not detour through the root complex), and
AER error counts of every GPU, HCA and bridge up to the root port."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.base.registry import registers
from gpufleet.checks.host_hygiene.readings import (
    BRINGUP,
    devices,
    host_readings,
    section,
)
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, WARN, result, worst

_ACS_ROW_KEYS = ("bdf", "status", "ctrl_hex", "acs_cap", "cap_offset", "config_path", "config_bytes", "reason", "below")
_NAMED_MAX = 4  # bridges named in a reason; the rest are in detail


def _redirects(bridge: dict) -> list[str]:
    bits = bridge.get("ctrl_bits") or {}
    return [b for b in ("p2p_request_redirect", "p2p_completion_redirect") if bits.get(b)]


@registers("host_hygiene.pcie_acs", "check")
def check_pcie_acs(readings: dict, profile: dict) -> dict:
    """PCIe ACS off on the bridges above the GPUs: a bridge that redirects peer-to-peer traffic up to the root
    complex fails, naming it and the devices below it; `error` where its config space needs root."""
    name = "pcie_acs"
    gpus = devices(readings, "gpu")
    if not gpus:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus, so no GPU peer-to-peer path to check")
    bridges, err = section(readings, name, "acs")
    if err:
        return err
    rows = [{k: b.get(k) for k in _ACS_ROW_KEYS} | {"redirect": _redirects(b)} for b in bridges]
    detail = {"bridges": rows, "is_root": host_readings(readings).get("is_root")}
    if not any(x["kind"] == "gpu" for b in bridges for x in b.get("below", [])):
        return result(
            name,
            SKIP,
            f"no PCIe bridge above any of the {len(gpus)} GPU(s): they sit on the root bus "
            "(a virtual machine's layout), so there is no ACS setting to check",
            detail=detail | {"gpus": [g["bdf"] for g in gpus]},
        )
    redirected = [b for b in bridges if _redirects(b)]
    unreadable = [b for b in bridges if b.get("status") in ("needs_root", "unreadable", "no_ext_config")]
    if redirected:
        said = "; ".join(
            f"{b['bdf']} ({', '.join(_redirects(b))}; ctrl {b['ctrl_hex']}) above "
            + ", ".join(f"{x['kind'].upper()} {x['bdf']}" for x in b["below"])
            for b in redirected[:_NAMED_MAX]
        )
        if len(redirected) > _NAMED_MAX:
            said += f"; and {len(redirected) - _NAMED_MAX} more (detail.bridges)"
        cmds = [f"setpci -s {b['bdf']} ECAP_ACS+6.w=0" for b in redirected]
        detail["remedy_commands"] = cmds
        shown = (
            "; ".join(cmds)
            if len(cmds) <= 3
            else f"{'; '.join(cmds[:2])}; ... (all {len(cmds)} in detail.remedy_commands)"
        )
        extra = f"; {len(unreadable)} more bridge(s) could not be read" if unreadable else ""
        return result(
            name,
            FAIL,
            f"ACS P2P redirect is on at {len(redirected)} bridge(s), so GPU and NIC peer-to-peer traffic is routed "
            f"through the root complex: {said}{extra}",
            value=len(redirected),
            unit="bridges",
            remedy=f"{BRINGUP}, or as root: {shown} (ACS control resets on reboot, so apply it at boot)",
            detail=detail,
        )
    if unreadable:
        needs_root = [b for b in unreadable if b["status"] == "needs_root"]
        first = unreadable[0]
        reason = (
            f"needs root to read PCIe extended config space: ACS of {len(needs_root)} bridge(s) unread "
            f"(e.g. {first['config_path']}, {first['config_bytes']} bytes)"
            if needs_root
            else f"ACS of {len(unreadable)} bridge(s) unread: {first['bdf']}: {first['reason']}"
        )
        return result(name, ERROR, reason, remedy="run the check as root (become: true)", detail=detail)
    no_acs = [b for b in bridges if b.get("status") == "no_acs"]
    return result(
        name,
        PASS,
        f"ACS P2P redirect off on all {len(bridges)} bridge(s) above GPUs and NICs"
        + (f" ({len(no_acs)} without an ACS capability)" if no_acs else ""),
        value=0,
        unit="bridges",
        detail=detail,
    )


# --- NUMA placement ------------------------------------------------------------------


def _aer_text(d: dict, severity: str) -> str:
    sev = d.get(severity) or {}
    names = ", ".join(f"{n} {c}" for n, c in (sev.get("names") or {}).items())
    where = (
        f"bridge {d['bdf']} (above {', '.join(d.get('below') or [])})"
        if d.get("role") == "bridge"
        else f"{d.get('role', '').upper()} {d['bdf']}"
    )
    return f"{where}: {sev.get('total')}" + (f" ({names})" if names else "")


@registers("host_hygiene.pcie_aer", "check")
def check_pcie_aer(readings: dict, profile: dict) -> dict:
    """The AER counts since boot of every GPU, HCA and bridge between each and its root port: fatal ones fail,
    non-fatal ones warn; correctable ones are named (their rate is judged by the fleet layer, fabric_*)."""
    name = "pcie_aer"
    aer, err = section(readings, name, "aer")
    if err:
        return err
    fatal_max = profiles.value(profile, "fabric_aer_fatal_max") or 0
    nonfatal_max = profiles.value(profile, "fabric_aer_nonfatal_max") or 0
    threshold = profiles.threshold(
        profile, "fabric_aer_fatal_max", fabric_aer_nonfatal_max=profiles.threshold(profile, "fabric_aer_nonfatal_max")
    )
    devices = aer.get("devices") or []
    if not aer.get("present"):
        return result(
            name,
            SKIP,
            f"no PCIe AER counts to read: {aer.get('reason')}",
            threshold=threshold,
            detail={"devices": len(devices), "reason": aer.get("reason")},
        )

    def total(d: dict, sev: str) -> int:
        return (d.get(sev) or {}).get("total") or 0

    counted = {sev: [d for d in devices if total(d, sev)] for sev in ("fatal", "nonfatal", "correctable")}
    sums = {sev: sum(total(d, sev) for d in devices) for sev in counted}
    detail = {
        "totals": sums,
        "devices_read": sum(1 for d in devices if d.get("correctable") is not None),
        "unreadable": {d["bdf"]: d["reason"] for d in devices if d.get("reason")},
        "counted": {
            sev: [{"bdf": d["bdf"], "role": d.get("role"), "below": d.get("below"), **(d.get(sev) or {})} for d in ds]
            for sev, ds in counted.items()
            if ds
        },
    }
    parts, status = [], PASS
    if sums["fatal"] > fatal_max:
        status = FAIL
        parts.append("fatal: " + "; ".join(_aer_text(d, "fatal") for d in counted["fatal"]))
    if sums["nonfatal"] > nonfatal_max:
        status = worst([status, WARN])
        parts.append("non-fatal uncorrectable: " + "; ".join(_aer_text(d, "nonfatal") for d in counted["nonfatal"]))
    corr = (
        (
            "; correctable since boot: "
            + "; ".join(_aer_text(d, "correctable") for d in counted["correctable"][:_NAMED_MAX])
            + (
                f" and {len(counted['correctable']) - _NAMED_MAX} more"
                if len(counted["correctable"]) > _NAMED_MAX
                else ""
            )
        )
        if counted["correctable"]
        else ""
    )
    scope = f"{detail['devices_read']} GPU(s), HCA(s) and bridge(s) above them"
    if status == PASS:
        return result(
            name,
            PASS,
            f"no uncorrectable AER error since boot on {scope}{corr or '; no correctable one either'}",
            value=0,
            unit="errors",
            threshold=threshold,
            detail=detail,
        )
    return result(
        name,
        status,
        f"AER errors since boot on {scope}: " + "; ".join(parts) + corr,
        value=sums["fatal"] + sums["nonfatal"],
        unit="errors",
        threshold=threshold,
        detail=detail,
        remedy="an uncorrectable PCIe error on that link: reseat the device (and its riser or cable), update the "
        "device's and the switch's firmware, check the kernel log for the AER lines; a fatal one needs the "
        "node drained and the link serviced before it is accepted",
    )
