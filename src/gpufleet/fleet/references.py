"""What each node's figures are held against, handed to its stage at the start of a run (comparisons/node.py).

    choose_baseline(run_dir, store, explicit)   the baseline run: --baseline, else run.json's, else the store's
    baseline_rows(store, store_note, base_id, run_id)   its figures, or why there are none
    write(run_dir, hosts, store, store_note, baseline)  RUN_DIR/references/<host>.json for each node
    write_for_run(run_dir, hosts, db, baseline)         the same, the store opened (or why not) and the baseline chosen

One file a node, written once on the controller before any node is touched (`gpufleet references`, play 1 of
validate.yml), so that each node's task reads its own and no node's worker opens the store: the baseline's
figures for this node and the GPUs it held then, the baseline's fleet medians, and each GPU's place among its
siblings in its node's latest accepted runs (comparisons/character.py). The report judges with the same store.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path

from gpufleet.base import paths, schema
from gpufleet.comparisons.baseline import baseline_medians
from gpufleet.comparisons.character import HISTORY_RUNS, deviations
from gpufleet.comparisons.node import FOLDER
from gpufleet.base.errors import InputError
from gpufleet.fleet.repair import open_for_run, use_for_run
from gpufleet.fleet.run_files import read_run_info
from gpufleet.fleet.store import default_path
from gpufleet.base.runs import run_id_of


def choose_baseline(run_dir: Path, store, explicit: str | None) -> dict | None:
    """The baseline this run is compared with: --baseline, else run.json's "baseline", else the store's."""
    if explicit:
        if store is not None and not store.run(explicit):
            raise InputError(
                f"--baseline {explicit!r}: no such run in the store {store.path}; expected a run it holds "
                "(gpufleet history, or gpufleet store rebuild when its folder exists)"
            )
        return {"run_id": explicit, "source": "--baseline"}
    info = read_run_info(run_dir)
    if isinstance(info.get("baseline"), str) and info["baseline"]:
        return {"run_id": info["baseline"], "source": "run.json"}
    current = store.baseline() if store is not None else None
    if current:
        return {"run_id": current["run_id"], "source": f"the store's baseline (set {current['set_at']})"}
    return None


def baseline_rows(store, store_note: str | None, base_id: str | None, run_id: str) -> tuple[list[dict], str | None]:
    """(the baseline run's figures, why there are none)."""
    if store is None:
        return [], f"no baseline to compare with: {store_note or 'no store'}"
    if not base_id:
        return [], "no baseline run set (gpufleet baseline set RUN_ID, or gpufleet_baseline for validate.yml)"
    if base_id == run_id:
        return [], f"this run ({run_id}) is the baseline"
    if not store.run(base_id):
        return [], f"baseline run {base_id} is not in the store {store.path}"
    rows = store.run_metrics(base_id)
    return rows, None if rows else f"baseline run {base_id} has no benchmark figures in the store"


def write(run_dir: Path, hosts: list[str], store, store_note: str | None, baseline: dict | None) -> dict:
    """RUN_DIR/references/<host>.json for each host (the module docstring); returns what was written."""
    run_id = run_id_of(run_dir)
    base_id = (baseline or {}).get("run_id")
    rows, note = baseline_rows(store, store_note, base_id, run_id)
    medians = [
        {"metric": k, "context": c, **{f: v[f] for f in ("value", "n", "cpu", "unit")}}
        for (k, c), v in baseline_medians(rows).items()
    ]
    by_host: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_host[r["host"]].append(
            {k: r.get(k) for k in ("host", "metric", "context", "value", "uuid", "gpu_index", "cpu", "unit")}
        )
    past = deviations(store.gpu_past(hosts, run_id, HISTORY_RUNS)) if store is not None else {}
    folder = paths.make_dir(run_dir / FOLDER)
    notes = [note] if note else []
    for host in hosts:
        paths.safe_name(host, "the host name")
        doc = {
            "run_id": run_id,
            "baseline": {"run_id": base_id, "source": (baseline or {}).get("source"), "rows": by_host.get(host, [])}
            if not note
            else None,
            "baseline_fleet": {"run_id": base_id, "medians": medians} if not note else None,
            "past": [
                {"uuid": u, "metric": m, "context": c, "below_pct": v} for (h, u, m, c), v in past.items() if h == host
            ],
            "notes": notes,
        }
        # Made again by the next run: no need to wait for the disk a node at a time.
        paths.write_atomic(folder / f"{host}.json", json.dumps(doc), durable=False)  # a link there replaced
    return {"run_id": run_id, "hosts": len(hosts), "baseline": base_id, "note": note, "folder": str(folder)}


def write_for_run(run_dir: Path, hosts: list[str], db: Path | None = None, baseline: str | None = None) -> dict:
    """write() for a run: its store (db, default RUN_DIR/../gpufleet.db) opened, repaired if damaged, or the reason
    there is none; its baseline chosen as the report chooses it."""
    run_dir, started = Path(run_dir), schema.utc_now()
    if not run_dir.is_dir():
        raise InputError(
            f"run directory {run_dir} does not exist; expected the run's folder (gpufleet run start makes it)"
        )
    try:
        store = open_for_run(db or default_path(run_dir.resolve().parent), run_dir)
    except (InputError, sqlite3.Error) as exc:
        return write(run_dir, hosts, None, f"no store: {exc}", choose_baseline(run_dir, None, baseline))
    try:  # damage met while the store is read is repaired, and the references made again from the new store
        store, done = use_for_run(
            store, run_dir, lambda s: write(run_dir, hosts, s, None, choose_baseline(run_dir, s, baseline))
        )
    except InputError as exc:  # busy past its timeout, a full disk: the node measures against what it has
        return write(run_dir, hosts, None, f"no store: {exc}", choose_baseline(run_dir, None, baseline))
    done["store_repairs"] = [r["note"] for r in store.repairs_since(started)]  # a store moved aside, named
    store.close()
    return done
