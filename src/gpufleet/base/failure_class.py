"""What kind of failure a result that is not pass or skip is: the key `class` of the one result schema.

    hardware       the board, its memory, its links or its cooling: follows the GPU (uuid, serial) from run to run
    environment    something beside the node's own state: another process on the GPU, the node lock, a full disk
    configuration  a setting of the node or the inventory (power limit, MIG, ACS, NCCL variables, thresholds)
    software       driver, firmware, packages, or the engine itself: a check that could not run

Only `hardware` follows a GPU: fleet.returning_gpu, the store's GPU history and the drain line lead with it, so
a GPU that failed only because another process held its memory is not "a GPU that failed before".

DEFAULTS is the class of each check when it warns or fails (its declaration in registry.py); a check that could
not run (`error`) is software unless its default is environment (the lock, processes: what stopped it is beside the node). A result made with
schema.result(..., failure_class=...) keeps its own class: that is where the cause is known (wrong data moved
by a copy is hardware, whatever the check).
"""

from __future__ import annotations

from gpufleet.base import registry
from gpufleet.base.registry import CLASSES, CONFIGURATION, ENVIRONMENT, HARDWARE, SOFTWARE

__all__ = ["CLASSES", "CONFIGURATION", "DEFAULTS", "ENVIRONMENT", "HARDWARE", "SOFTWARE", "default", "of"]

# check name (or group.check where a name is shared) -> class of its warn and fail: each check's declaration
DEFAULTS = registry.failure_classes()


def default(check: str, status: str, group: str | None = None) -> str | None:
    """The class of a `status` result of this check when nothing more is known; None for pass, skip and info."""
    if status in ("pass", "skip", "info"):
        return None
    cls = DEFAULTS.get(f"{group}.{check}") or DEFAULTS.get(check) or SOFTWARE
    return cls if status != "error" or cls == ENVIRONMENT else SOFTWARE


def of(res: dict) -> str | None:
    """The class of a result: its own where it has a valid one, else the default (documents made before results
    carried a class, or a status changed after the result was made)."""
    if res.get("status") in ("pass", "skip", "info"):
        return None
    own = res.get("class")
    return own if own in CLASSES else default(res.get("check") or "", res.get("status") or "", res.get("group"))
