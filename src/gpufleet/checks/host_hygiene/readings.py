"""What every host hygiene check reads: the host readings (collect.host.read) and their sections."""

from __future__ import annotations

from gpufleet.base.schema import ERROR, result

BRINGUP = "run bringup.yml (role host_tuning)"


def host_readings(readings: dict) -> dict:
    """readings["host"], or nothing when it was not read."""
    return readings.get("host") or {}


def section(readings: dict, check: str, key: str) -> tuple[dict | list | None, dict | None]:
    """(section, None) or (None, an error result saying it was not recorded)."""
    sec = host_readings(readings).get(key)
    if sec is None:
        return None, result(
            check, ERROR, f"host readings have no '{key}' section; collect them with `gpufleet collect`"
        )
    return sec, None


def devices(readings: dict, kind: str) -> list[dict]:
    return [d for d in host_readings(readings).get("pci") or [] if d.get("kind") == kind]


def port_name(p: dict) -> str:
    return f"{p['hca']}/{p['port']}"


# --- PCIe ACS --------------------------------------------------------------------------
