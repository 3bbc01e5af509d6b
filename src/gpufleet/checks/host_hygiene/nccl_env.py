"""The NCCL environment: variables that would steer NCCL away from the fabric this node has."""

from __future__ import annotations

import re

from gpufleet.base.registry import registers
from gpufleet.checks.host_hygiene.infiniband import active_ib_ports
from gpufleet.checks.host_hygiene.readings import section
from gpufleet.base.schema import FAIL, PASS, WARN, result


def nccl_int(text: str | None) -> int:
    """An integer variable the way NCCL reads it (strtoll base 0: leading number, else 0)."""
    m = re.match(r"\s*([+-]?)(0x[0-9a-f]+|0[0-7]*|[1-9]\d*)", text or "", re.I)
    if not m:
        return 0
    sign = -1 if m.group(1) == "-" else 1
    digits = m.group(2)
    base = 16 if digits.lower().startswith("0x") else 8 if digits.startswith("0") and len(digits) > 1 else 10
    return sign * int(digits, base)


def socket_ifname_matches(spec: str, interfaces: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects.

    Syntax (NCCL docs): a comma list of name prefixes; a leading '^' excludes the
    listed ones instead; '=' (after any '^') makes the names exact. Each entry
    may carry ':port', which does not change the interface.
    """
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = [e.split(":", 1)[0] for e in spec.split(",") if e]

    def listed(ifname: str) -> bool:
        return any(ifname == e if exact else ifname.startswith(e) for e in entries)

    return [i for i in interfaces if listed(i) != exclude]


@registers("host_hygiene.nccl_env", "check")
def check_nccl_env(readings: dict, profile: dict) -> dict:
    """NCCL settings (the environment, nccl.conf) that turn off InfiniBand or peer-to-peer, or name interfaces the
    host lacks, fail; tuner overrides, a verbose NCCL_DEBUG and lines NCCL ignores warn."""
    name = "nccl_env"
    nccl, err = section(readings, name, "nccl")
    if err:
        return err
    eff = {k: v["value"] for k, v in (nccl.get("effective") or {}).items()}
    sources = {k: v["source"] for k, v in (nccl.get("effective") or {}).items()}
    interfaces = nccl.get("interfaces") or {}
    conf = nccl.get("conf") or {}
    fails, warns, remedies = [], [], []

    def where(var: str) -> str:
        return f"{var}={eff[var]} (from {sources[var]})"

    active_ib = active_ib_ports(readings)
    if nccl_int(eff.get("NCCL_IB_DISABLE")) and active_ib:
        fails.append(
            f"{where('NCCL_IB_DISABLE')} on a host with {len(active_ib)} active InfiniBand port(s): inter-node traffic falls back to TCP sockets"
        )
        remedies.append("unset NCCL_IB_DISABLE")
    if nccl_int(eff.get("NCCL_P2P_DISABLE")):
        fails.append(f"{where('NCCL_P2P_DISABLE')}: GPUs inside the node stop using NVLink/PCIe peer-to-peer")
        remedies.append("unset NCCL_P2P_DISABLE")
    ifname = eff.get("NCCL_SOCKET_IFNAME")
    if ifname is not None:
        chosen = socket_ifname_matches(ifname, sorted(interfaces))
        if len(ifname) <= 1:
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} is ignored by NCCL (values under 2 characters count as unset)")
        elif not chosen:
            fails.append(f"{where('NCCL_SOCKET_IFNAME')} selects none of this host's interfaces {sorted(interfaces)}")
            remedies.append("set NCCL_SOCKET_IFNAME to an existing interface (prefix, '=' for exact, '^' to exclude)")
        elif all(i == "lo" for i in chosen):
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} selects only the loopback interface")
            remedies.append("point NCCL_SOCKET_IFNAME at the interface other nodes can reach")
        elif all(interfaces.get(i) == "down" for i in chosen):
            warns.append(f"{where('NCCL_SOCKET_IFNAME')} selects only interfaces that are down: {chosen}")
            remedies.append("bring the interface up or point NCCL_SOCKET_IFNAME elsewhere")
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if eff.get(var):
            warns.append(f"{where(var)} overrides NCCL's tuner for every message size and topology")
            remedies.append(f"unset {var} unless a measurement backs it")
    if nccl_int(eff.get("NCCL_SHM_DISABLE")):
        warns.append(f"{where('NCCL_SHM_DISABLE')}: intra-node fallback traffic goes through the network")
        remedies.append("unset NCCL_SHM_DISABLE")
    if (eff.get("NCCL_DEBUG") or "").strip().upper() in ("INFO", "TRACE"):
        warns.append(f"{where('NCCL_DEBUG')} floods job logs and slows start-up")
        remedies.append("use NCCL_DEBUG=WARN for production jobs")
    for line in conf.get("ignored_lines") or []:
        warns.append(f"{conf.get('path')} line {line['line']} {line['text']!r} has no effect: {line['reason']}")
        remedies.append(f"fix {conf.get('path')} to plain NAME=VALUE lines")
    detail = {
        "effective": nccl.get("effective"),
        "conf_path": conf.get("path"),
        "conf_present": conf.get("present"),
        "interfaces": interfaces,
        "not_read": nccl.get("not_read"),
    }
    status = FAIL if fails else WARN if warns else PASS
    if status == PASS:
        reason = (
            f"NCCL environment sane: {', '.join(sorted(eff))} set"
            if eff
            else "no NCCL variables set; NCCL picks its own defaults"
        )
        return result(name, PASS, reason, detail=detail)
    return result(
        name,
        status,
        "; ".join(fails + warns),
        value=len(fails) + len(warns),
        unit="problems",
        remedy="; ".join(dict.fromkeys(remedies)) or "review the NCCL variables listed",
        detail=detail,
    )


# --- drift since bringup.yml ------------------------------------------------------------------
