"""The fabric's error counters judged as rates, with their anchors' rules: one rule wherever they are judged (the
node stage and since the previous run on the controller, fleet.counter_growth and fleet.fabric_growth; during a
soak, benchmarks.soak.soak_error_events).

    rate = growth / the window's seconds, in the unit of the anchor's limit (a second, a minute); a window shorter
    than one unit counts as one (its count against the limit, as DCGM's health watch counts PCIe replays over its
    minute)

RATES: below the limit `info` with the rate (a finding that changes no verdict); at or over it the anchor's status
(DCGM fails from 100 CRC errors a second on, `perSec >= DCGM_LIMIT_MAX_NVLINK_CRC_ERROR`; mcelog runs its DIMM
trigger from 10 corrected memory errors a day on, `ce-error-threshold = 10 / 24h`). NVLink counts are a GPU's,
its links together, as DCGM reads them (the *_ERROR_TOTAL fields); each link's own rate is shown where the reading
has the links. INCREASE: NVLink replays and recoveries, any increase of which DCGM's health watch fails; gpufleet
fails one it watched happen (the node stage, a soak) and warns over a window it did not watch (since the previous
run: the node in service, resets and reboots in between). docs/checks.md has the anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.base.schema import FAIL, INFO, PASS, WARN


@dataclass(frozen=True)
class RateRule:
    label: str
    unit_s: float  # the anchor's unit: 1 (a second) or 60 (a minute)
    per: str  # "a second"
    of: str  # what one rate is of
    key: str  # the profile key of the limit
    at_limit: str  # the status at or over it
    anchor: str  # who set it, in a reason's words


CRC_KEY = "fleet_counter_nvlink_crc_per_s_fail"
PCIE_REPLAY_KEY = "fleet_counter_pcie_replay_per_min_warn"
AER_CORRECTABLE_KEY = "fabric_aer_correctable_per_min_fail"
REPLAY_RECOVERY_KEY = "fleet_counter_nvlink_replay_recovery_max"
EDAC_CE_KEY = "host_edac_ce_per_day_warn"
_CRC = dict(unit_s=1, per="a second", of="a GPU, its links together", key=CRC_KEY, at_limit=FAIL, anchor="DCGM")
RATES = {
    "nvlink_crc_flit": RateRule("NVLink CRC FLIT errors", **_CRC),
    "nvlink_crc_data": RateRule("NVLink CRC data errors", **_CRC),
    "pcie_replay": RateRule("PCIe replays", 60, "a minute", "a GPU", PCIE_REPLAY_KEY, WARN, "DCGM"),
    "aer_correctable": RateRule(
        "correctable AER errors", 60, "a minute", "a device", AER_CORRECTABLE_KEY, FAIL, "DCGM diag"
    ),
    # EDAC's corrected memory errors: mcelog's per-DIMM trigger (ce-error-threshold = 10 / 24h)
    "edac_ce": RateRule(
        "corrected memory errors (EDAC)",
        86400,
        "a day",
        "a DIMM, or a controller's errors on none",
        EDAC_CE_KEY,
        WARN,
        "mcelog",
    ),
}
INCREASE = {"nvlink_replay": "NVLink replays", "nvlink_recovery": "NVLink recoveries"}
# The per-link counters of a reading (collect.nvml.nvlinks.NVLINK_COUNTERS) by the counter a snapshot names.
LINK_FIELD = {
    "nvlink_crc_flit": "crc_flit",
    "nvlink_crc_data": "crc_data",
    "nvlink_replay": "replay",
    "nvlink_recovery": "recovery",
}


def number_text(v: float) -> str:
    """1,204; 17.2; 0.0031."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def seconds_text(s: float) -> str:
    return f"{s:.0f} s" if s < 600 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def link_growth(old: dict | None, new: dict | None, counter: str, rebooted: bool = False) -> dict | None:
    """{link: growth} of one counter over the links both readings have per link (collect.counters' nvlink_links);
    None where either has none. After a reboot, or back below, a count is counted from the reset."""
    field = LINK_FIELD.get(counter)
    if not field or not isinstance(old, dict) or not isinstance(new, dict):
        return None
    out = {}
    for link, now in new.items():
        a, b = (old.get(link) or {}).get(field), (now or {}).get(field)
        if isinstance(a, int) and isinstance(b, int):
            out[link] = b if rebooted or b < a else b - a
    return out or None


def judge_rate(
    counter: str, growth: int, seconds: float | None, limit: float | None, links: dict | None = None
) -> dict:
    """One counter's growth over a window judged by RATES[counter]: {"status", "rate", "per", "limit", "key",
    "window_s", "judged_by"} and, with its links' growth, "links": {"n", "worst", "worst_rate"}. `pass` when it did
    not grow, `info` below the limit, the rule's status at or over it; no limit (a null key): `info`, not judged."""
    rule = RATES[counter]
    units = max(seconds / rule.unit_s, 1.0) if seconds else 1.0
    rate = float(f"{growth / units:.4g}")
    out = {"rate": rate, "per": rule.per, "limit": limit, "key": rule.key, "window_s": seconds}
    out["judged_by"] = (
        f"rate over {seconds_text(seconds)}"
        if seconds and seconds >= rule.unit_s
        else f"count: the window ({'unknown' if not seconds else seconds_text(seconds)}) is shorter than {rule.per[2:]}"
    )
    if links:
        worst = max(links, key=lambda k: links[k])
        out["links"] = {"n": len(links), "worst": worst, "worst_rate": float(f"{links[worst] / units:.4g}")}
    if growth <= 0:
        out["status"] = PASS
    elif limit is None:
        out.update(status=INFO, judged_by=f"not judged ({rule.key} is null)")
    else:
        out["status"] = rule.at_limit if rate >= limit else INFO
    return out


def rate_text(counter: str, judged: dict) -> str:
    """'17.2 a second (18 links, most on link 7: 9.1 a second)'."""
    rule, links = RATES[counter], judged.get("links")
    where = (
        f" ({links['n']} links, most on link {links['worst']}: {number_text(links['worst_rate'])} {rule.per})"
        if links and links["n"] > 1
        else f" (link {links['worst']})"
        if links
        else ""
    )
    return f"{number_text(judged['rate'])} {rule.per}{where}"


def limit_text(counter: str, limit: float | None) -> str:
    """'limit 100 a second a GPU, its links together (DCGM)'."""
    rule = RATES[counter]
    if limit is None:
        return f"not judged ({rule.key} is null)"
    return f"limit {number_text(limit)} {rule.per} {rule.of} ({rule.anchor}, {rule.key})"


def judge_increase(growth: int, limit: float | None, watched: bool) -> str:
    """NVLink replays or recoveries: more than `limit` fails where gpufleet watched it happen, warns where not; a
    null limit judges nothing (`info`)."""
    if growth <= 0:
        return PASS
    if limit is None:
        return INFO
    return PASS if growth <= limit else FAIL if watched else WARN
