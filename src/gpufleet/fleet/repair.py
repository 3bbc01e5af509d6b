"""A damaged or missing store repaired: a file that is not a gpufleet store moved aside (with its -wal and -shm)
and the store rebuilt from the run folders and baseline.json, the repair logged in the store. `open_for_run`, what
a run indexes into, repaired first under a lock on the reports folder; `use_for_run`, a use of it that meets damage
(a SQLite error that says so) done again on the repaired store.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

from gpufleet.base import paths, runs
from gpufleet.base.errors import InputError
from gpufleet.fleet import BASELINE_FILE
from gpufleet.fleet.store import DamagedStore, Store
from gpufleet.fleet.store_tables import problem


def _move_aside(path: Path, label: str) -> Path | None:
    """path (and its -wal and -shm) renamed to <name>.<label>-<UTC time>[-wal|-shm]; the new name of path, or of
    the first file moved when path itself is gone (a -wal left behind would be replayed into a new store)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, n = path.with_name(f"{path.name}.{label}-{stamp}"), 1
    while any(os.path.lexists(f"{aside}{s}") for s in ("", "-wal", "-shm")):
        aside, n = path.with_name(f"{path.name}.{label}-{stamp}-{n}"), n + 1
    first = None
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if os.path.lexists(src):  # a symbolic link too: the link is moved, never what it points at
            try:
                os.replace(src, Path(f"{aside}{suffix}"))
            except OSError as exc:
                raise InputError(
                    f"cannot move {src} aside to {aside}{suffix}: {exc.strerror}; expected a writable folder"
                ) from None
            first = first or Path(f"{aside}{suffix}")
    return first


def repair(
    path: Path | str,
    reports_dir: Path | str,
    damage: DamagedStore | None = None,
    *,
    by: str,
    own_run: str | None = None,
) -> dict:
    """Rebuild the store at path from the run folders under reports_dir. A damaged store (`damage`) is moved aside
    first; a missing one is created (any -wal or -shm left of it moved aside). The caller holds
    paths.folder_lock(path's folder). Returns rebuild()'s summary with "repair": the row logged in the store
    (None for the first store of a reports folder: a missing store with no run but `own_run` and no baseline.json)."""
    path = Path(path)
    missing = damage is None and not os.path.lexists(path)
    moved = _move_aside(path, "damaged" if damage else "orphan") if damage or missing else None
    with Store(path) as store:
        try:
            summary = store.rebuild(reports_dir)
        except sqlite3.Error as exc:  # a full disk, most likely: said so, the store left as it was
            raise problem(path, exc) from None
        others = [r for r in summary["runs"] if r != own_run]
        what = "damaged" if damage else "missing" if missing else "rebuild"
        base = summary["baseline"]
        rebuilt = (
            f"rebuilt by {by} from the run folders of {summary['reports_dir']}: {len(summary['runs'])} run(s) re-indexed, "
            + (
                f"baseline {base} restored from {BASELINE_FILE}"
                if base and what != "rebuild"
                else f"baseline {base or 'none'}"
            )
            + (f" ({summary['baseline_problem']})" if summary["baseline_problem"] else "")
        )
        if damage:
            note = f"{path} was not a gpufleet store ({damage.cause}): moved aside to {moved}; the store {rebuilt}"
        elif missing:
            note = (
                f"the store {path} did not exist{f' (its {moved.name} moved aside)' if moved else ''}; it was {rebuilt}"
            )
        else:
            note = f"the store {path} was {rebuilt}"
        first_store = missing and not others and not base and not summary["baseline_problem"]
        summary["repair"] = (
            None
            if first_store
            else store.log_repair(what, note, moved_aside=moved, runs=len(summary["runs"]), baseline=base)
        )
    return summary


def open_for_run(path: Path | str, run_dir: Path | str, *, check: bool = False) -> Store:
    """The store a run indexes into, repaired first: a damaged or foreign file is moved aside and a missing store
    rebuilt from the run folders beside run_dir (history and baseline back) before anything is indexed. The
    records of a run's nodes come at once: one process repairs, the others wait for it and use its store.
    `check`: SQLite's check of every page as well (the run's report, once a run), so damage that opening alone
    does not meet is found before the store is used."""
    path, run_dir = Path(path), Path(run_dir).resolve()
    if os.path.lexists(path) or not path.parent.is_dir():
        try:
            return Store(path, check=check)
        except DamagedStore:
            pass
    with paths.folder_lock(path.parent):
        damage = None
        if os.path.lexists(path):
            try:
                return Store(path, check=check)  # repaired by another process while this one waited
            except DamagedStore as exc:
                damage = exc
        _repair_for(path, run_dir, damage)
    return Store(path)


def use_for_run(store: Store, run_dir: Path | str, use: Callable[[Store], Any]) -> tuple[Store, Any]:
    """(store, use(store)); when use meets a SQLite error that says the file is damaged, the store is repaired as
    `open_for_run` repairs it (once, however many processes meet it) and use runs again on the new one. Any other
    SQLite error is an InputError naming the store (busy, a full disk). The store returned is open; the one given
    is closed when it was replaced."""
    try:
        return store, use(store)
    except sqlite3.Error as exc:
        hurt = problem(store.path, exc)
        damaged_identity = _identity(store.path)
        store.close()
        if not isinstance(hurt, DamagedStore):
            raise hurt from None
    path, run_dir = store.path, Path(run_dir).resolve()
    with paths.folder_lock(path.parent):
        if _identity(path) == damaged_identity:  # still the file found damaged: nobody repaired it meanwhile
            _repair_for(path, run_dir, hurt)
    store = Store(path)
    try:
        return store, use(store)
    except BaseException as exc:
        store.close()
        if isinstance(exc, sqlite3.Error):
            raise problem(path, exc) from None
        raise


def _repair_for(path: Path, run_dir: Path, damage: DamagedStore | None) -> None:
    own_run = runs.run_id_of(run_dir)
    repair(path, run_dir.parent, damage, by=f"run {own_run}", own_run=own_run)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
