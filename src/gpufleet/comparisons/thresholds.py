"""A node's thresholds for the fleet comparisons: the keys read, and their look-up in the node's profile."""

from __future__ import annotations

import functools
from typing import Any

from gpufleet.base import calibration, judge, profiles


# Keys of files/profiles/generic.yml this module reads.
GPU_WARN, GPU_FAIL = "fleet_gpu_below_node_warn_pct", "fleet_gpu_below_node_fail_pct"
NODE_WARN, NODE_FAIL = "fleet_node_below_fleet_warn_pct", "fleet_node_below_fleet_fail_pct"
BASE_WARN, BASE_FAIL = "fleet_below_baseline_warn_pct", "fleet_below_baseline_fail_pct"
MIN_NODES = "fleet_min_nodes"
SPREAD_RATIO, SPREAD_FLOOR = "fleet_sample_spread_ratio_max", "fleet_sample_spread_pct_floor"
MIN_WINDOW = "fleet_counter_min_window_h"
FABRIC_SHARE = "fleet_fabric_reference_share_min"
CONFIRM_MAX = "confirm_remeasure_max"
# Every key the comparisons read (the fleet layer reads its counters' too: fleet/compare.py KEYS_READ).
KEYS = (
    GPU_WARN,
    GPU_FAIL,
    NODE_WARN,
    NODE_FAIL,
    BASE_WARN,
    BASE_FAIL,
    MIN_NODES,
    SPREAD_RATIO,
    SPREAD_FLOOR,
    CONFIRM_MAX,
)


@functools.lru_cache(maxsize=16)
def _profile_thresholds(name: str | None) -> dict:
    try:
        return profiles.resolve(None, profile_name=name or profiles.GENERIC)["thresholds"]
    except profiles.ProfileError:
        return profiles.resolve(None, profile_name=profiles.GENERIC)["thresholds"]


def thresholds_for(profile: Any, needed: tuple[str, ...] = KEYS) -> dict:
    """A node's thresholds: the profile its document carries, resolved once on the node (its profile file, from
    its own --profile-dir, and the inventory's overrides), used as it is. This controller's generic.yml gives only
    the defaults of keys a document from before them lacks (of `needed`, the keys the caller reads). A profile name
    alone (no document) is resolved from this controller's files."""
    if not isinstance(profile, dict):
        return dict(_profile_thresholds(profile if isinstance(profile, str) else None))
    out = {
        key: {k: entry[k] for k in ("value", "source", "calibrated", "by_metric") if k in entry}
        for key, entry in (profile.get("thresholds") or {}).items()
        if isinstance(entry, dict) and "value" in entry
    }
    if any(key not in out for key in needed):
        out = {**_profile_thresholds(profiles.GENERIC), **out}
    return out


class Thresholds:
    """A node's thresholds; a calibrated key's limit is per metric (calibration.py): value(key, metric)."""

    def __init__(self, table: dict):
        self.table = table
        # Looked up hundreds of thousands of times in a fleet's judgement.
        self._values = {key: (entry or {}).get("value") for key, entry in table.items()}
        self._by_metric = {
            key: {m: e["value"] for m, e in entry["by_metric"].items()}
            for key, entry in table.items()
            if isinstance((entry or {}).get("by_metric"), dict)
        }
        self._figures = {
            key: {m: e.get("n") for m, e in entry["by_metric"].items()}
            for key, entry in table.items()
            if isinstance((entry or {}).get("by_metric"), dict)
        }

    def value(self, key: str, metric: str | None = None) -> Any:
        if metric is not None and key in self._by_metric:
            own = self._by_metric[key].get(metric)
            if own is not None:
                return own
        return self._values.get(key)

    def uncalibrated(self, key: str, metric: str | None = None) -> bool:
        """The model has no calibrated limit for this key and metric: the generic one stands, and is said so."""
        entry = self.table.get(key) or {}
        return entry.get("calibrated") is not None and not (metric and metric in self._by_metric.get(key, {}))

    def calibrated_own(self, key: str, metric: str) -> bool:
        """The metric's limit rests on calibration.MIN_N healthy figures of its own, its model's or its topology's:
        not the generic one, nor one a few figures widened. A document from before limits said how many took it as
        calibrated, as its limit said."""
        if metric not in self._by_metric.get(key, {}):
            return False
        n = self._figures[key].get(metric)
        return n is None or n >= calibration.MIN_N

    def limit(self, warn: str, fail: str, metric: str | None = None) -> judge.Limit:
        return judge.Limit(warn, self.value(warn, metric), fail=self.value(fail, metric))

    def field(self, key: str, **extra) -> dict:
        entry = self.table.get(key) or {}
        out = {"key": key, "value": entry.get("value"), "source": entry.get("source"), **extra}
        if entry.get("calibrated") is not None:
            out["calibrated"] = entry["calibrated"]
        if key in self._by_metric:
            out["by_metric"] = self._by_metric[key]
        return out

    def pair(self, warn: str, fail: str) -> dict:
        """The result's threshold: the warn key, with the fail key inside it."""
        return self.field(warn, fail=self.field(fail))
