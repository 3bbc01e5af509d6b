"""The store's tables and their migrations, and what a SQLite error says about the file.

Schema version 4. Tables (a null GPU index means a node-level row):

    gpufleet_meta  application, schema_version
    runs           run_id, run_dir, started, playbook, tier, attempts, hosts, baseline_ref (the run it was compared
                   with), finished, verdict (when reported), problem (why run.json could not be read)
    documents      run_id, host, role (node | peer), path, sha256, ok, reason (why unreadable or missing), started,
                   verdict (the document's own, then the node's in the report), versions (its software and firmware)
    gpus           run_id, host, gpu_index, uuid, serial, pci_bus_id, name, visible
    results        run_id, host, seq, group_name, check_name, status, value (JSON), unit, reason, failure_class
    metrics        run_id, host, gpu_index, uuid, serial, metric, value, unit, cpu, context, source
    counters       run_id, host, gpu_index, uuid, serial, phase, read_at, boot_id, counter, value
                   (a fabric device's rows: gpu_index and serial null, uuid its id in the node: ib:mlx5_0/1,
                   pcie:0000:33:00.0; only the counters fleet.counter_table.FABRIC_COUNTERS judges)
    gpu_flags      run_id, host, gpu_index, uuid, serial, check_id, status, reason, failure_class
    sdc_hashes     run_id, host, gpu_index, uuid, serial, comparable (JSON of what must be equal), computation, sha256
    baseline       run_id, set_at, cleared_at (the current baseline: the row not cleared)
    repairs        at, what (damaged | missing | rebuild), moved_aside, runs, baseline, note: each rebuild, so the
                   report of a run during which the store was repaired says so
    events         run_id, source (slurm.json | sweep.json | ladder.json), seq, at, host, slurm_node, kind, step,
                   done, detail (JSON): what keeping the fleet in service did (fleet/service_log.py)

Versions: 2 added failure_class (failure_class.py) to results and gpu_flags, and the table sdc_hashes; the table
repairs came while the store was at 2; 3 added documents.versions; 4 added the table events (made by the tables below; its
rows come from the run folders at the next report of each run or `gpufleet store rebuild`). An older store is migrated when opened (rows
indexed before carry no class, and readers take the check's default). A new store gets the same columns in the
same order from the tables below as a migrated one gets from ALTER TABLE, and every INSERT names its columns.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpufleet.base import paths
from gpufleet.base.errors import InputError

SCHEMA_VERSION = 4
APPLICATION = "gpufleet"
HOST_TABLES = ("documents", "gpus", "results", "metrics", "counters", "gpu_flags", "sdc_hashes")
# The columns a migration adds, at the end of their table, in this order: (table, column, schema version).
ADDED_COLUMNS = (("results", "failure_class", 2), ("gpu_flags", "failure_class", 2), ("documents", "versions", 3))
# The tables a store of each schema version holds for sure (the newer ones are created when it is opened).
TABLES_OF_VERSION = {
    1: ("gpufleet_meta", "runs", "documents", "gpus", "results", "metrics", "counters", "gpu_flags", "baseline"),
    2: ("sdc_hashes",),
    3: ("repairs",),
}

DDL = """
CREATE TABLE IF NOT EXISTS gpufleet_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, run_dir TEXT, started TEXT, playbook TEXT, tier TEXT, attempts INTEGER, hosts TEXT,
    baseline_ref TEXT, finished TEXT, verdict TEXT, problem TEXT);
CREATE TABLE IF NOT EXISTS documents (
    run_id TEXT NOT NULL, host TEXT NOT NULL, role TEXT NOT NULL, path TEXT, sha256 TEXT, ok INTEGER NOT NULL,
    reason TEXT, started TEXT, verdict TEXT, versions TEXT, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS gpus (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER NOT NULL, uuid TEXT, serial TEXT, pci_bus_id TEXT,
    name TEXT, visible INTEGER, PRIMARY KEY (run_id, host, gpu_index));
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL, group_name TEXT, check_name TEXT NOT NULL,
    status TEXT NOT NULL, value TEXT, unit TEXT, reason TEXT, failure_class TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, metric TEXT NOT NULL,
    value REAL NOT NULL, unit TEXT, cpu INTEGER NOT NULL, context TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS counters (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, phase TEXT NOT NULL,
    read_at TEXT, boot_id TEXT, counter TEXT NOT NULL, value INTEGER);
CREATE TABLE IF NOT EXISTS gpu_flags (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, check_id TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, failure_class TEXT);
CREATE TABLE IF NOT EXISTS baseline (run_id TEXT NOT NULL, set_at TEXT NOT NULL, cleared_at TEXT);
CREATE TABLE IF NOT EXISTS sdc_hashes (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, comparable TEXT NOT NULL,
    computation TEXT NOT NULL, sha256 TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sdc_comparable ON sdc_hashes (comparable, computation);
CREATE TABLE IF NOT EXISTS repairs (
    at TEXT NOT NULL, what TEXT NOT NULL, moved_aside TEXT, runs INTEGER, baseline TEXT, note TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, source TEXT NOT NULL, seq INTEGER NOT NULL, at TEXT, host TEXT, slurm_node TEXT,
    kind TEXT NOT NULL, step TEXT, done INTEGER, detail TEXT);
CREATE INDEX IF NOT EXISTS events_host ON events (host, at);
CREATE INDEX IF NOT EXISTS documents_host ON documents (host);
CREATE INDEX IF NOT EXISTS results_run_host ON results (run_id, host);
CREATE INDEX IF NOT EXISTS gpus_uuid ON gpus (uuid);
CREATE INDEX IF NOT EXISTS gpus_serial ON gpus (serial);
CREATE INDEX IF NOT EXISTS metrics_run_host ON metrics (run_id, host);
CREATE INDEX IF NOT EXISTS metrics_uuid ON metrics (uuid);
CREATE INDEX IF NOT EXISTS counters_uuid ON counters (uuid, phase, read_at);
CREATE INDEX IF NOT EXISTS counters_run_host ON counters (run_id, host);
CREATE INDEX IF NOT EXISTS flags_uuid ON gpu_flags (uuid);
CREATE INDEX IF NOT EXISTS flags_serial ON gpu_flags (serial);
CREATE INDEX IF NOT EXISTS flags_run_host ON gpu_flags (run_id, host);
CREATE INDEX IF NOT EXISTS sdc_run_host ON sdc_hashes (run_id, host);
"""

# SQLite errors that say nothing about the file's content: the store is busy or cannot be reached, not damaged.
_NOT_DAMAGE = ("locked", "busy", "unable to open", "readonly", "disk i/o", "full", "interrupted")
# OperationalErrors that do: the file's tables are not what this gpufleet made.
_DAMAGE_WORDS = ("malformed", "no such table", "no such column", "corrupt", "not a database")


class DamagedStore(InputError):
    """The file at the store's path is no gpufleet store, or a damaged one: garbage, a cut-short file, another
    application's SQLite, a table missing, a page that fails SQLite's check. `cause`: what was found, in a few words."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


def damaged(path: Path, cause: str) -> DamagedStore:
    return DamagedStore(
        f"{path} is not a gpufleet store: {cause}; expected the SQLite file a run or `gpufleet store "
        "rebuild` makes (both move a damaged one aside and rebuild it from the run folders)",
        cause,
    )


def problem(path: Path, exc: sqlite3.Error) -> InputError:
    """What a SQLite error met on opening or using the store at `path` says: a DamagedStore when the file is
    damaged, else an InputError naming the store and why it cannot be used now (busy, unreachable, a full disk)."""
    text = str(exc)
    lower = text.lower()
    if (
        isinstance(exc, sqlite3.DatabaseError)
        and not isinstance(exc, (sqlite3.ProgrammingError, sqlite3.NotSupportedError))
        and (not isinstance(exc, sqlite3.OperationalError) or any(w in lower for w in _DAMAGE_WORDS))
        and not any(w in lower for w in _NOT_DAMAGE)
    ):
        return damaged(path, text)
    full = paths.full_disk(path)
    if full:
        return InputError(f"cannot use the store {path}: {full} (SQLite: {text}); make room there, then run this again")
    return InputError(f"cannot use the store {path}: {text}")


def create_or_migrate(conn: sqlite3.Connection, path: Path, *, new: bool = False) -> dict:
    """Within the caller's write transaction: check the tables an existing store must have, create the missing
    newer ones, migrate an older store to SCHEMA_VERSION; `new`: a store being made, its tables created. Returns
    gpufleet_meta as a dict. DamagedStore when the store has no table (emptied) or a table its version had is gone;
    InputError for a store a newer gpufleet wrote."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and not new:  # a store is made whole (Store._create): one without tables was emptied
        raise damaged(path, "it holds no table")
    if tables and "gpufleet_meta" not in tables:
        held = ", ".join(sorted(tables)[:5])
        raise DamagedStore(
            f"{path} is an SQLite database but not a gpufleet store (no gpufleet_meta table; it holds "
            f"{held}); expected the file a run or `gpufleet store rebuild` makes",
            f"another SQLite database, tables {held}",
        )
    meta = dict(conn.execute("SELECT key, value FROM gpufleet_meta").fetchall()) if tables else {}
    if meta and meta.get("application") != APPLICATION:
        raise DamagedStore(
            f"{path} is not a gpufleet store (application {meta.get('application')!r} in gpufleet_meta)",
            f"the store of application {meta.get('application')!r}",
        )
    version = meta.get("schema_version")
    if meta and (not str(version).isdigit() or int(version) > SCHEMA_VERSION):
        raise InputError(
            f"store {path} has schema version {version}; this gpufleet reads version {SCHEMA_VERSION} "
            "(a newer gpufleet wrote it: upgrade, or rebuild the store with this one into another file)"
        )
    if meta:
        lost = [t for v, names in TABLES_OF_VERSION.items() if v <= int(version) for t in names if t not in tables]
        if lost:
            raise damaged(path, f"table{'s' * (len(lost) > 1)} {', '.join(lost)} missing")
    for stmt in DDL.strip().split(";"):
        if stmt.strip():
            conn.execute(stmt)
    if not meta:
        conn.execute(
            "INSERT INTO gpufleet_meta (key, value) VALUES ('application', ?), ('schema_version', ?)",
            (APPLICATION, str(SCHEMA_VERSION)),
        )
        return {"application": APPLICATION, "schema_version": str(SCHEMA_VERSION)}
    if int(version) < SCHEMA_VERSION:  # a current store is not written to on opening
        _migrate(conn)
    return dict(meta, schema_version=str(SCHEMA_VERSION))


def _migrate(conn: sqlite3.Connection) -> None:
    """Each column an older version lacks, added at the end of its table (where the tables above have it too).
    Idempotent."""
    for table, column, _version in ADDED_COLUMNS:
        if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
    conn.execute("UPDATE gpufleet_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def check_pages(conn: sqlite3.Connection, path: Path) -> None:
    """SQLite's own check of every page (PRAGMA quick_check: the b-trees and their records, not the indexes'
    agreement with the tables); DamagedStore naming the first problem found."""
    try:
        rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.DatabaseError as exc:
        raise problem(path, exc) from None
    problems = [r[0] for r in rows if r[0] != "ok"]
    if problems:
        raise damaged(path, f"SQLite's check of its pages failed ({'; '.join(problems)[:300]})")
