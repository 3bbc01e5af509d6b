"""A GPU (uuid or serial) that failed in an earlier run and is back, in any node."""

from __future__ import annotations

from typing import Any

from gpufleet.fleet import flagged, gpu_text
from gpufleet.comparisons.findings import fleet_result, listed_text
from gpufleet.base.schema import PASS, SKIP, WARN


def returning_gpu(host: str, run_id: str, node_metrics: dict, store: Any, store_note: str | None) -> dict:
    gpus = [g for g in node_metrics["gpus"] if g.get("uuid") or g.get("serial")]
    if store is None:
        return fleet_result("returning_gpu", SKIP, f"no history to look GPUs up in: {store_note or 'no store'}")
    if not gpus:
        return fleet_result(
            "returning_gpu", SKIP, "no GPU uuid or serial in this node's results (gpu_inventory did not run)"
        )
    back, cleared = [], []
    for g in gpus:
        fails = store.gpu_failures(g.get("uuid"), g.get("serial"), run_id)
        pending = [f for f in fails if not f["accepted_since"]]
        if pending:
            back.append((g, pending[0], fails))
        elif fails:
            cleared.append((g, fails[0]))
    if not back:
        reason = f"none of this node's {len(gpus)} GPU(s) failed in an earlier run"
        if cleared:
            reason = "no GPU of this node is back from a failure without an acceptance since; " + "; ".join(
                f"{gpu_text(g)} failed in run {f['run_id']} and was accepted in run {f['accepted_since']['run_id']}"
                for g, f in cleared
            )
        return fleet_result(
            "returning_gpu",
            PASS,
            reason,
            detail={
                "cleared": [
                    {**flagged(g), "failed_in": f["run_id"], "accepted_in": f["accepted_since"]["run_id"]}
                    for g, f in cleared
                ]
            },
        )
    parts = []
    for g, f, _ in back:
        by = "serial" if f.get("uuid") != g.get("uuid") else "uuid"
        where = "the same node" if f["host"] == host else f"node {f['host']}"
        parts.append(
            f"{gpu_text(g)} failed before: run {f['run_id']} ({f['started'] or 'start unknown'}) in {where} as GPU "
            f"{f['gpu_index']}, {f['check_id']} {f['status']} ({f['class']}); now in node {host} as GPU {g['index']} "
            f"(recognised by {by}; not accepted since)"
        )
    return fleet_result(
        "returning_gpu",
        WARN,
        listed_text(parts),
        remedy="a GPU that failed before is back: check that it was repaired (reset, RMA record), watch this run's "
        "health, counters and figures for it, and drain the node if it fails again",
        detail={
            "returning": [{**flagged(g), "failures": fails} for g, _, fails in back],
            "flagged_gpus": [flagged(g) for g, _, _ in back],
        },
    )
