"""The trust of a figure carried into every comparison it takes part in (its siblings, its own past, the baseline,
the fleet), so that no comparison makes a finding the figure cannot bear:

- a figure the judge called unstable (its samples fell in its last measurement: not yet the node's, checks.figures)
  is compared with nothing, and nothing is held against it: its row is `not_compared`, saying why, and changes no
  verdict; a figure measured beside another process (trust `disturbed`) is no figure at all (metrics.extract keeps
  its result `apart`, and the comparisons say so);
- a host figure (memory triad, drive, data loader) whose limit no calibration set from calibration.MIN_N healthy
  figures of its own (its model's or its topology's): its drop against its past, the baseline or the fleet is `info`,
  with the numbers, not a warning: how far such a figure moves from run to run is not known yet;
- a host figure of a virtual machine (DMI, the CPU's hypervisor flag or CPU steal said so: benchmarks.host) past its
  limit is class environment, the hypervisor's other guests sharing its CPUs and memory, unless the node's previous
  run read it past the same limit against the same reference too (`before`, fleet/compare.py): a drop that repeats
  over runs is the node's.

    judged(row, m, thresholds, warn, fail, held_against)   a comparison row with what its figures' trust allows
    compared(rows)                                          the rows whose figures were compared
    apart_text(rows, apart)                                 why figures were not compared, for a reason
"""

from __future__ import annotations

from gpufleet.base.registry import ENVIRONMENT
from gpufleet.base.schema import INFO
from gpufleet.comparisons import figure_text
from gpufleet.comparisons.confirm import BEYOND, NOT_COMPARED
from gpufleet.comparisons.metric_keys import HOST_METRICS
from gpufleet.comparisons.robust import judge
from gpufleet.comparisons.thresholds import Thresholds


def judged(row: dict, m: dict, thresholds: Thresholds, warn: str, fail: str, held_against: dict | None = None) -> dict:
    """The comparison row of figure m (held_against: the figure it is held against, where that is one of the node's,
    a sibling's) with what their trust allows (the module docstring)."""
    why = m.get("unstable") or (
        f"the figure it is held against is not the node's: {held_against['unstable']}"
        if (held_against or {}).get("unstable")
        else None
    )
    if why:
        out = {k: v for k, v in row.items() if k != "near"}
        return {**out, "status": NOT_COMPARED, "would_be": row["status"], "not_compared": why}
    if row["status"] not in BEYOND or m["key"] not in HOST_METRICS:
        return row
    if not thresholds.calibrated_own(warn, m["key"]):
        return {
            **{k: v for k, v in row.items() if k != "near"},
            "status": INFO,
            "would_be": row["status"],
            "information": "a host figure, whose run-to-run spread no calibration of this model has measured yet: "
            "information, not a warning (tools/calibration_table.py sets its limit from the machines' clean runs)",
        }
    if not m.get("virtual"):
        return row
    before = m.get("before")
    if before:
        status, deviation = judge(before["value"], row["reference"], thresholds.limit(warn, fail, m["key"]))
        if status in BEYOND:
            return {
                **row,
                "repeated": f"{figure_text(before['value'])} {row['unit']} in run {before['run_id']} too, "
                f"{-deviation:.1f}% below the same reference: it repeats over runs",
            }
    return {
        **row,
        "class": ENVIRONMENT,
        "environment": f"on a virtual machine ({m['virtual']}), whose hypervisor shares the host's CPUs and memory "
        f"with other guests, a host figure's drop is the environment's unless it repeats over runs; "
        + (
            f"in run {before['run_id']} it read {figure_text(before['value'])} {row['unit']}"
            if before
            else "the node's previous run did not read it"
        ),
    }


def compared(rows: list[dict]) -> list[dict]:
    """The rows whose figures were compared."""
    return [row for row in rows if row["status"] != NOT_COMPARED]


def apart_text(rows: list[dict], apart: list[dict] | None = None) -> str:
    """ "; not compared: ..." for the figures a comparison held against nothing, and why; "" when none."""
    parts = [
        f"{row['label']}{' of GPU ' + str(row['index']) if row.get('index') is not None else ''} "
        f"{figure_text(row['value'])} {row['unit']}: {row['not_compared']}"
        for row in rows
        if row["status"] == NOT_COMPARED
    ]
    parts += [f"{a['source']}: {a['why']}" for a in apart or []]
    return f"; not compared: {'; '.join(dict.fromkeys(parts))}" if parts else ""
