"""What a node's figures are held against, in one value every comparison of registry.comparison_checks() reads:
on the controller, the run's fleet and the baseline from the store (fleet/compare.py); on the node, the references
its stage was handed (comparisons/node.py). Each comparison's function reads what it needs of it and says when
that is missing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Against:
    past: dict = field(default_factory=dict)  # (uuid, metric, context) -> the GPU's below_pct in earlier runs
    base_id: str | None = None  # the baseline run
    base_rows: list = field(default_factory=list)  # its figures, as the store keeps them (controller)
    base_index: tuple | None = None  # baseline.baseline_index(base_rows): None without a baseline's figures
    base_note: str | None = None  # why there is no baseline to compare with (controller)
    fleet_id: str | None = None  # the run of the baseline's fleet medians
    medians: dict = field(default_factory=dict)  # (metric, context) -> the baseline's fleet median
    groups: dict = field(default_factory=dict)  # this run's fleet: (metric, context) -> {host: figure} (controller)
    stats: dict = field(default_factory=dict)  # (metric, context) -> (median, MAD) of `groups`
