"""The fleet's memory: an SQLite store of every run, indexed by run, node, GPU uuid and serial, check and metric.

The run folders stay the record; the store is an index of them that `rebuild()` recreates (the baseline, which
only the store holds, is also kept in baseline.json beside it). One file, `<reports_dir>/gpufleet.db` by default,
in WAL mode so readers never wait on a writer. Every write is one `BEGIN IMMEDIATE` transaction with a busy
timeout: two runs (two controllers, two ansible-playbook processes) writing at once queue for the write lock
instead of failing or interleaving.

Tables (a null GPU index means a node-level row):

    gpufleet_meta  application, schema_version
    runs           run_id, run_dir, started, playbook, tier, attempts, hosts, baseline_ref (the run it was compared
                   with), finished, verdict (when reported), problem (why run.json could not be read)
    documents      run_id, host, role (node | peer), path, sha256, ok, reason (why unreadable or missing), started,
                   verdict (the document's own, then the node's in the report)
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

A damaged or foreign file at the store's path (garbage, a cut-short file, another application's SQLite) is
moved aside as <name>.damaged-<UTC time> and the store rebuilt from the run folders; a missing store is rebuilt
before a run indexes into it (fleet/repair.py: `open_for_run`, `repair`), so history and the baseline come back.

Schema version 2 added failure_class (failure_class.py: hardware, environment, configuration, software) to results
and gpu_flags, and the table sdc_hashes; a version 1 store is migrated when opened (rows indexed before carry
no class, and readers take the check's default).

Schema version 4 added the table events; a version 3 store gets it when opened, and its rows from the run
folders at the next report of each run or `gpufleet store rebuild`.

Indexing a host document replaces every row of that (run_id, host) in one transaction, so indexing twice is
the same as once, and a reader never sees half a document.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

from gpufleet import failure_class, runs, schema
from gpufleet.errors import InputError
from gpufleet.fleet import DB_NAME, GROUP, metrics, sdc, service_log
from gpufleet.fleet.counter_table import FABRIC_COUNTERS
from gpufleet.fleet.run_files import read_baseline_file, read_json, read_run_info, write_baseline_file

SCHEMA_VERSION = 4
APPLICATION = "gpufleet"
BUSY_TIMEOUT_S = 60.0  # a rebuild of a long history holds the write lock for seconds, not minutes
HOST_TABLES = ("documents", "gpus", "results", "metrics", "counters", "gpu_flags", "sdc_hashes")
ACCEPTED = (schema.PASS, schema.WARN)

_DDL = """
CREATE TABLE IF NOT EXISTS gpufleet_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, run_dir TEXT, started TEXT, playbook TEXT, tier TEXT, attempts INTEGER, hosts TEXT,
    baseline_ref TEXT, finished TEXT, verdict TEXT, problem TEXT);
CREATE TABLE IF NOT EXISTS documents (
    run_id TEXT NOT NULL, host TEXT NOT NULL, role TEXT NOT NULL, path TEXT, sha256 TEXT, ok INTEGER NOT NULL,
    reason TEXT, started TEXT, verdict TEXT, PRIMARY KEY (run_id, host));
CREATE TABLE IF NOT EXISTS gpus (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER NOT NULL, uuid TEXT, serial TEXT, pci_bus_id TEXT,
    name TEXT, visible INTEGER, PRIMARY KEY (run_id, host, gpu_index));
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL, group_name TEXT, check_name TEXT NOT NULL,
    status TEXT NOT NULL, value TEXT, unit TEXT, reason TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, metric TEXT NOT NULL,
    value REAL NOT NULL, unit TEXT, cpu INTEGER NOT NULL, context TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS counters (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, phase TEXT NOT NULL,
    read_at TEXT, boot_id TEXT, counter TEXT NOT NULL, value INTEGER);
CREATE TABLE IF NOT EXISTS gpu_flags (
    run_id TEXT NOT NULL, host TEXT NOT NULL, gpu_index INTEGER, uuid TEXT, serial TEXT, check_id TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT);
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


class DamagedStore(InputError):
    """The file at the store's path is no gpufleet store: garbage, a cut-short file, another application's SQLite.
    `cause`: what was found, in a few words."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


# SQLite errors that say nothing about the file's content: the store is busy or cannot be reached, not damaged.
_NOT_DAMAGE = ("locked", "busy", "unable to open", "readonly", "disk i/o", "full")


def default_path(reports_dir: Path | str) -> Path:
    return Path(reports_dir) / DB_NAME


def _sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # json.dumps(v, sort_keys=True, default=str), made once


def _json(v: Any) -> str | None:
    return None if v is None else _ENCODER.encode(v)


class Store:
    """One connection to the store; use as a context manager (`with Store(path) as store:`)."""

    def __init__(self, path: Path | str, *, create: bool = True, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise InputError(f"store {self.path} does not exist; expected the file `gpufleet store rebuild` or a run makes "
                                 "(--db PATH, or --reports-dir DIR holding gpufleet.db)")
            if not self.path.parent.is_dir():
                raise InputError(f"store {self.path}: the folder {self.path.parent} does not exist; expected an existing folder")
            try:  # create it owner and group only, like the run folders' files; -wal and -shm inherit the mode
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o640))
            except OSError as exc:
                raise InputError(f"cannot create the store {self.path}: {exc.strerror}; expected a writable folder") from None
        elif self.path.is_dir():
            raise InputError(f"store {self.path} is a folder; expected an SQLite file (gpufleet.db)")
        self.busy_timeout_s = busy_timeout_s
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the store {self.path}: {exc}") from None
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._setup()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            if isinstance(exc, sqlite3.OperationalError) and any(w in str(exc).lower() for w in _NOT_DAMAGE):
                raise InputError(f"cannot use the store {self.path}: {exc}") from None
            raise DamagedStore(f"{self.path} is not a gpufleet store: {exc}; expected the SQLite file a run or "
                               "`gpufleet store rebuild` makes (both move a damaged one aside)", str(exc)) from None
        except InputError:
            self.conn.close()
            raise

    # ------------------------------------------------------------ set-up

    def _setup(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "gpufleet_meta" not in tables:
            held = ", ".join(sorted(tables)[:5])
            raise DamagedStore(f"{self.path} is an SQLite database but not a gpufleet store (no gpufleet_meta table; it holds "
                               f"{held}); expected the file a run or `gpufleet store rebuild` makes", f"another SQLite database, tables {held}")
        self._wal()
        with self.write() as c:
            for stmt in _DDL.strip().split(";"):
                if stmt.strip():
                    c.execute(stmt)
            meta = dict(c.execute("SELECT key, value FROM gpufleet_meta").fetchall())
            if not meta:
                c.execute("INSERT INTO gpufleet_meta VALUES ('application', ?), ('schema_version', ?)", (APPLICATION, str(SCHEMA_VERSION)))
                meta = {"application": APPLICATION, "schema_version": str(SCHEMA_VERSION)}
            if meta.get("application") == APPLICATION and str(meta.get("schema_version")).isdigit() \
                    and int(meta["schema_version"]) <= SCHEMA_VERSION:
                self._migrate(c)
                meta["schema_version"] = str(SCHEMA_VERSION)
        if meta.get("application") != APPLICATION:
            raise DamagedStore(f"{self.path} is not a gpufleet store (application {meta.get('application')!r} in gpufleet_meta)",
                               f"the store of application {meta.get('application')!r}")
        version = meta.get("schema_version")
        if not str(version).isdigit() or int(version) > SCHEMA_VERSION:
            raise InputError(f"store {self.path} has schema version {version}; this gpufleet reads version {SCHEMA_VERSION} "
                             "(a newer gpufleet wrote it: upgrade, or rebuild the store with this one into another file)")

    def _migrate(self, c: sqlite3.Connection) -> None:
        """Version 1 -> 2: the failure_class columns (sdc_hashes is created by the DDL). 2 -> 3: each document's
        versions (the software and firmware table reads them from here, not from the run folders). 3 -> 4: the
        table events, made by the DDL. Idempotent."""
        for table, column in (("results", "failure_class"), ("gpu_flags", "failure_class"), ("documents", "versions")):
            if column not in {r[1] for r in c.execute(f"PRAGMA table_info({table})")}:
                c.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
        c.execute("UPDATE gpufleet_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _wal(self) -> None:
        # Switching to WAL takes a short exclusive lock, which a second process creating the store at the same
        # moment may hold: retry within the busy timeout.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if str(mode).lower() != "wal":
            raise InputError(f"store {self.path}: SQLite refused WAL mode (got {mode}); expected a local file system")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout),
        so two writers never deadlock upgrading a read lock."""
        if self.conn.in_transaction:  # nested: part of the caller's transaction
            yield self.conn
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise InputError(f"store {self.path} stayed locked for {self.busy_timeout_s:g} s ({exc}); another process is "
                             "writing to it: try again when it is done") from None
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: the queries inside see one state of the store and take its lock once (a fleet's
        judgement asks tens of thousands of questions). Nothing inside may write."""
        if self.conn.in_transaction:
            yield self.conn
            return
        self.conn.execute("BEGIN")
        try:
            yield self.conn
        finally:
            self.conn.execute("COMMIT")

    # ------------------------------------------------------------ runs

    def upsert_run(self, run_id: str, run_dir: Path | str | None, info: dict | None = None) -> None:
        """The run's row from run.json (`info`), keeping what an earlier call knew when this one knows less."""
        info = info or {}
        attempts = info.get("attempts")
        row = {
            "run_id": run_id,
            "run_dir": str(run_dir) if run_dir is not None else None,
            "started": info.get("started"),
            "playbook": info.get("playbook"),
            "tier": info.get("tier") or next((a.get("tier") for a in reversed(attempts or []) if isinstance(a, dict) and a.get("tier")), None),
            "attempts": len(attempts) if isinstance(attempts, list) else None,
            "hosts": _json(info.get("hosts")) if isinstance(info.get("hosts"), list) else None,
            "baseline_ref": info.get("baseline"),
            "problem": info.get("problem"),
        }
        with self.write() as c:
            c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
            sets = ", ".join(f"{k} = COALESCE(?, {k})" for k in row if k != "run_id")
            c.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*(v for k, v in row.items() if k != "run_id"), run_id])
            if "problem" in info and info["problem"] is None:
                c.execute("UPDATE runs SET problem = NULL WHERE run_id = ?", (run_id,))

    def run(self, run_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return dict(row) if row else None

    def runs(self) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY started IS NULL, started, run_id")]

    def record_verdicts(self, run_id: str, verdict: str, node_verdicts: dict[str, str], finished: str | None = None) -> None:
        """The report's verdicts: the run's, and each node's (its documents row), fleet results included."""
        with self.write() as c:
            c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
            c.execute("UPDATE runs SET verdict = ?, finished = COALESCE(?, finished) WHERE run_id = ?", (verdict, finished, run_id))
            for host, v in node_verdicts.items():
                c.execute("UPDATE documents SET verdict = ? WHERE run_id = ? AND host = ?", (v, run_id, host))

    # ------------------------------------------------------------ host documents

    def index_document(self, run_id: str, host: str, doc: dict | None, *, path: str | None, raw: bytes | None = None,
                       problem: str | None = None, role: str = "node", found: dict | None = None, fresh: bool = False) -> None:
        """Replace every row of (run_id, host) with what `doc` holds; `doc` None records why (problem) instead.
        `found`: metrics.extract() of the document's readable results, when the caller has it already. `fresh`:
        the caller knows the run has a row in runs and none of the host's rows yet (nothing to delete)."""
        with self.write() as c:
            if not fresh:
                c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
                for table in HOST_TABLES:
                    c.execute(f"DELETE FROM {table} WHERE run_id = ? AND host = ?", (run_id, host))
            sha = _sha256(raw) if raw is not None else None
            if doc is None:
                c.execute("INSERT INTO documents VALUES (?, ?, ?, ?, ?, 0, ?, NULL, ?, NULL)",
                          (run_id, host, role, path, sha, problem or "unreadable", schema.ERROR))
                return
            results = [r for r in doc.get("results") or [] if schema.result_problem(r) is None]
            versions = doc.get("versions") if isinstance(doc.get("versions"), dict) else None
            c.execute("INSERT INTO documents VALUES (?, ?, ?, ?, ?, 1, NULL, ?, ?, ?)",
                      (run_id, host, role, path, sha, doc.get("started"), schema.verdict(results), _json(versions)))
            self._insert_node_rows(c, run_id, host, results, found)

    def _insert_node_rows(self, c: sqlite3.Connection, run_id: str, host: str, results: list[dict], found: dict | None = None) -> None:
        found = found if found is not None else metrics.extract(results)
        gpus = found["gpus"]
        by_index = {g["index"]: g for g in gpus}
        c.executemany("INSERT INTO gpus VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      [(run_id, host, g["index"], g.get("uuid"), g.get("serial"), g.get("pci_bus_id"), g.get("name"),
                        None if g.get("visible") is None else int(g["visible"])) for g in gpus])
        self._insert_results(c, run_id, host, results, by_index, start=0)
        c.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      [(run_id, host, m["index"], m["uuid"], m["serial"], m["key"], m["value"], m["unit"], int(m["cpu"]),
                        m["context"], m["source"]) for m in found["metrics"]])
        # A later run compares its counters with each GPU's and fabric device's last snapshot of an earlier run, the
        # one after the benchmarks (previous_after); the one before them stays in the host document. Half the rows
        # of a fleet's run, which nothing read.
        phase, rows = "after", []
        snap = found["snapshots"].get(phase)
        for g in (snap or {}).get("gpus") or []:
            if not isinstance(g, dict):
                continue
            for name, value in (g.get("counters") or {}).items():
                rows.append((run_id, host, g.get("index"), g.get("uuid"), g.get("serial"), phase, snap.get("read_at"),
                             snap.get("boot_id"), name, value if isinstance(value, int) and not isinstance(value, bool) else None))
        judged = {row[0] for row in FABRIC_COUNTERS}
        snap = found["snapshots"]["fabric"].get(phase)
        for d in (snap or {}).get("devices") or []:
            if not isinstance(d, dict):
                continue
            for name, value in (d.get("counters") or {}).items():
                if name in judged:
                    rows.append((run_id, host, None, d.get("id"), None, phase, snap.get("read_at"), snap.get("boot_id"),
                                 name, value if isinstance(value, int) and not isinstance(value, bool) else None))
        c.executemany("INSERT INTO counters VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        c.executemany("INSERT INTO sdc_hashes (run_id, host, gpu_index, uuid, serial, comparable, computation, sha256) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      [(run_id, host, h["index"], h["uuid"], h["serial"] or by_index.get(h["index"], {}).get("serial"),
                        h["comparable"], h["computation"], h["sha256"]) for h in sdc.hash_rows(results)])

    def _insert_results(self, c: sqlite3.Connection, run_id: str, host: str, results: list[dict], by_index: dict, start: int) -> None:
        c.executemany("INSERT INTO results (run_id, host, seq, group_name, check_name, status, value, unit, reason, "
                      "failure_class) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      [(run_id, host, start + i, r.get("group"), r["check"], r["status"], _json(r.get("value")), r.get("unit"),
                        r.get("reason"), failure_class.of(r)) for i, r in enumerate(results)])
        flags = []
        for r in results:
            if r["status"] not in (schema.WARN, schema.FAIL, schema.ERROR):
                continue
            named = (r.get("detail") or {}).get("flagged_gpus") if isinstance(r.get("detail"), dict) else None
            for f in named or []:
                if not isinstance(f, dict):
                    continue
                known = by_index.get(f.get("index"), {})
                uuid, serial = f.get("uuid") or known.get("uuid"), f.get("serial") or known.get("serial")
                flags.append((run_id, host, f.get("index"), uuid, serial, f"{r.get('group')}.{r['check']}" if r.get("group") else r["check"],
                              r["status"], r.get("reason"), failure_class.of(r)))
        c.executemany("INSERT INTO gpu_flags (run_id, host, gpu_index, uuid, serial, check_id, status, reason, failure_class) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", flags)

    def record_fleet(self, run_id: str, fleet_results: dict[str, list[dict]]) -> None:
        """The fleet layer's results of each node (group fleet), in place of any earlier ones of the run."""
        with self.write() as c:
            for host, results in fleet_results.items():
                c.execute("DELETE FROM results WHERE run_id = ? AND host = ? AND group_name = ?", (run_id, host, GROUP))
                c.execute("DELETE FROM gpu_flags WHERE run_id = ? AND host = ? AND check_id LIKE ?", (run_id, host, f"{GROUP}.%"))
                start = c.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM results WHERE run_id = ? AND host = ?", (run_id, host)).fetchone()[0]
                by_index = {r["gpu_index"]: {"uuid": r["uuid"], "serial": r["serial"]}
                            for r in c.execute("SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ?", (run_id, host))}
                self._insert_results(c, run_id, host, [r for r in results if schema.result_problem(r) is None], by_index, start)

    # ------------------------------------------------------------ run folders

    def index_run(self, run_dir: Path | str, *, expected_hosts: list[str] | None = None, read: dict | None = None) -> dict:
        """Index one run folder: its run.json, every hosts/*.json and peers/*.json; a host named by run.json or
        expected but without a document is recorded as missing. One transaction. Returns what was indexed.
        `read`: files the caller has read and parsed already, so they are not read again: {"hosts/<host>.json":
        {"raw": bytes, "doc": schema.parse_host_doc's document or None, "why": its reason, "found": optional
        metrics.extract() of the readable results}}."""
        run_dir = Path(run_dir)
        with self.write():
            return self._index_run(run_dir, expected_hosts or [], read or {})

    def _index_run(self, run_dir: Path, expected: list[str], read: dict | None = None) -> dict:
        run_id = runs.run_id_of(run_dir)
        info = read_run_info(run_dir)
        self.upsert_run(run_id, run_dir.resolve(), info)
        # A run the store holds no host row of (the report after records that wrote only the folder, a rebuild):
        # each document's rows go in without first deleting, for each of its tables, rows that are not there.
        fresh = not any(self.conn.execute(f"SELECT 1 FROM {table} WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
                        for table in HOST_TABLES)
        done: dict = {"run_id": run_id, "documents": 0, "unreadable": [], "missing": []}
        seen = set()
        for role, folder in (("node", "hosts"), ("peer", "peers")):
            base = run_dir / folder
            if not base.is_dir():
                continue
            for path in sorted(p for p in base.glob("*.json") if not p.name.startswith(".")):
                host = path.stem
                if host in seen:
                    continue  # a node that also joined as a peer: its own document is the one indexed
                seen.add(host)
                rel = f"{folder}/{path.name}"
                known = (read or {}).get(rel)
                if known is not None:
                    raw, doc, why = known["raw"], known["doc"], known["why"]
                else:
                    try:
                        raw = path.read_bytes()
                    except OSError as exc:
                        why = f"{rel} cannot be read: {exc.strerror or exc}"
                        self.index_document(run_id, host, None, path=rel, problem=why, role=role, fresh=fresh)
                        done["unreadable"].append({"host": host, "reason": why})
                        continue
                    doc, why = schema.parse_host_doc(raw)
                if doc is None:
                    why = f"{rel} is unreadable: {why}"
                    done["unreadable"].append({"host": host, "reason": why})
                self.index_document(run_id, host, doc, path=rel, raw=raw, problem=why, role=role,
                                    found=(known or {}).get("found"), fresh=fresh)
                done["documents"] += doc is not None
        hosts = [h for h in (info.get("hosts") or []) if isinstance(h, str)] + expected
        for host in dict.fromkeys(hosts):
            if host not in seen:
                why = f"hosts/{host}.json does not exist: the node never reported (unreachable, or the run was interrupted)"
                self.index_document(run_id, host, None, path=f"hosts/{host}.json", problem=why, fresh=fresh)
                done["missing"].append(host)
                seen.add(host)
        self._index_events(run_dir, run_id)
        return done

    def rebuild(self, reports_dir: Path | str) -> dict:
        """Recreate the store from the run folders under reports_dir, in one transaction: readers see the old
        store until the new one is complete. Verdicts and the fleet results (group fleet) come from each run's
        report.json; the baseline from baseline.json beside the store."""
        reports_dir = Path(reports_dir)
        if not reports_dir.is_dir():
            raise InputError(f"reports directory {reports_dir} does not exist; expected the folder holding the run folders "
                             "(gpufleet_reports_dir, default ./reports)")
        summary: dict = {"reports_dir": str(reports_dir), "store": str(self.path), "runs": [], "unreadable": [], "missing": []}
        with self.write() as c:
            kept_baseline = [dict(r) for r in c.execute("SELECT * FROM baseline")]
            for table in ("runs", "baseline", "events", *HOST_TABLES):
                c.execute(f"DELETE FROM {table}")
            for run_dir in sorted(p for p in reports_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if not ((run_dir / "run.json").exists() or (run_dir / "hosts").is_dir()):
                    continue
                done = self._index_run(run_dir, [])
                self._restore_report(run_dir, done)
                summary["runs"].append(done["run_id"])
                summary["unreadable"] += [{"run_id": done["run_id"], **u} for u in done["unreadable"]]
                summary["missing"] += [{"run_id": done["run_id"], "host": h} for h in done["missing"]]
            saved = read_baseline_file(self.path.parent)
            if saved:
                c.execute("INSERT INTO baseline VALUES (?, ?, NULL)", (saved["run_id"], saved.get("set_at") or schema.utc_now()))
            else:
                c.executemany("INSERT INTO baseline VALUES (?, ?, ?)", [(b["run_id"], b["set_at"], b["cleared_at"]) for b in kept_baseline])
        summary["baseline"] = (self.baseline() or {}).get("run_id")
        return summary

    def _restore_report(self, run_dir: Path, done: dict) -> None:
        """Fleet results and verdicts of a run that was reported (report.json)."""
        run_id = done["run_id"]
        rep = read_json(run_dir / "report.json")
        if isinstance(rep, dict) and isinstance(rep.get("nodes"), dict):
            self.record_fleet(run_id, {h: [r for r in n.get("results") or [] if isinstance(r, dict) and r.get("group") == GROUP]
                                       for h, n in rep["nodes"].items() if isinstance(n, dict)})
            nodes = {h: n.get("verdict") for h, n in rep["nodes"].items() if isinstance(n, dict) and n.get("verdict") in schema.STATUSES}
            known = {r[0] for r in self.conn.execute("SELECT host FROM documents WHERE run_id = ?", (run_id,))}
            for host in nodes:
                if host not in known:  # in the report (an expected host that never reported), not in the folder
                    self.index_document(run_id, host, None, path=f"hosts/{host}.json",
                                        problem=f"hosts/{host}.json does not exist: the report lists the node, which never reported")
                    done["missing"].append(host)
            if rep.get("verdict") in schema.STATUSES:
                self.record_verdicts(run_id, rep["verdict"], nodes, rep.get("generated"))

    # ------------------------------------------------------------ service events (fleet/service_log.py)

    def index_events(self, run_dir: Path | str) -> None:
        """The run folder's action records (slurm.json, sweep.json, ladder.json) indexed again, each in place of its rows."""
        with self.write():
            self._index_events(Path(run_dir), runs.run_id_of(run_dir))

    def _index_events(self, run_dir: Path, run_id: str) -> None:
        with self.write() as c:
            for source, rows in service_log.run_rows(run_dir, run_id).items():
                c.execute("DELETE FROM events WHERE run_id = ? AND source = ?", (run_id, source))
                c.executemany(f"INSERT INTO events VALUES ({', '.join('?' * len(service_log.COLUMNS))})", rows)

    def events(self, host: str | None = None, kind: str | None = None) -> list[dict]:
        """Events oldest first, of one node and of one kind when given."""
        where = " AND ".join(w for w, v in (("host = ?", host), ("kind = ?", kind)) if v is not None) or "1"
        return [service_log.as_event(r) for r in self.conn.execute(
            f"SELECT {', '.join(service_log.COLUMNS)} FROM events WHERE {where} ORDER BY at, run_id, source, seq",
            [v for v in (host, kind) if v is not None])]

    def gpus(self, run_id: str, host: str) -> list[dict]:
        """The node's GPUs in that run: [{"gpu_index", "uuid", "serial"}], by index."""
        return [dict(r) for r in self.conn.execute("SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ? "
                                                   "ORDER BY gpu_index", (run_id, host))]

    def node_runs(self, host: str) -> list[dict]:
        """The node's runs with a readable document, oldest first: {"run_id", "started", "verdict", "clean"} (clean:
        no result warned, failed or erred)."""
        return [{"run_id": r["run_id"], "started": r["started"], "verdict": r["verdict"], "clean": not r["bad"]}
                for r in self.conn.execute(
                    "SELECT d.run_id, COALESCE(r.started, d.started) AS started, d.verdict, EXISTS (SELECT 1 FROM results x "
                    "WHERE x.run_id = d.run_id AND x.host = d.host AND x.status IN ('warn', 'fail', 'error')) AS bad "
                    "FROM documents d JOIN runs r ON r.run_id = d.run_id WHERE d.host = ? AND d.role = 'node' AND d.ok = 1 "
                    "ORDER BY started, d.run_id", (host,))]

    def log_repair(self, what: str, note: str, *, moved_aside: Path | None, runs: int, baseline: str | None) -> dict:
        row = {"at": schema.utc_now(), "what": what, "moved_aside": str(moved_aside) if moved_aside else None,
               "runs": runs, "baseline": baseline, "note": note}
        with self.write() as c:
            c.execute("INSERT INTO repairs VALUES (:at, :what, :moved_aside, :runs, :baseline, :note)", row)
        return row

    def repairs_since(self, since: str | None) -> list[dict]:
        """The store's repairs (damaged or missing, rebuilt) at or after `since` (a run's start), oldest first."""
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM repairs WHERE what <> 'rebuild' AND at >= ? ORDER BY at", (since or "",))]

    # ------------------------------------------------------------ baseline

    def set_baseline(self, run_id: str) -> dict:
        if not self.run(run_id):
            known = [r["run_id"] for r in self.runs()][-8:]
            raise InputError(f"run {run_id!r} is not in the store {self.path}; expected one of its runs"
                             + (f" (latest: {', '.join(known)})" if known else " (the store holds no run yet)")
                             + "; if its folder exists, run `gpufleet store rebuild` first")
        now = schema.utc_now()
        with self.write() as c:
            c.execute("UPDATE baseline SET cleared_at = ? WHERE cleared_at IS NULL", (now,))
            c.execute("INSERT INTO baseline VALUES (?, ?, NULL)", (run_id, now))
        write_baseline_file(self.path.parent, {"run_id": run_id, "set_at": now})
        return self.baseline()

    def clear_baseline(self) -> dict | None:
        was = self.baseline()
        with self.write() as c:
            c.execute("UPDATE baseline SET cleared_at = ? WHERE cleared_at IS NULL", (schema.utc_now(),))
        write_baseline_file(self.path.parent, None)
        return was

    def baseline(self) -> dict | None:
        row = self.conn.execute("SELECT run_id, set_at FROM baseline WHERE cleared_at IS NULL ORDER BY set_at DESC LIMIT 1").fetchone()
        if not row:
            return None
        out = dict(row)
        run = self.run(out["run_id"]) or {}
        out.update(verdict=run.get("verdict"), started=run.get("started"), run_dir=run.get("run_dir"))
        return out

    # ------------------------------------------------------------ reading

    def run_metrics(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self.conn.execute(
            "SELECT m.* FROM metrics m JOIN documents d ON d.run_id = m.run_id AND d.host = m.host "
            "WHERE m.run_id = ? AND d.role = 'node' ORDER BY m.host, m.metric, m.gpu_index", (run_id,))]

    def documents(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM documents WHERE run_id = ? ORDER BY host", (run_id,))]

    def latest_document(self, host: str, not_run_id: str) -> dict | None:
        """The host's most recent readable node document of another run, with that run's folder, or None."""
        row = self.conn.execute(
            "SELECT d.*, r.run_dir FROM documents d JOIN runs r ON r.run_id = d.run_id WHERE d.host = ? AND d.role = 'node'"
            " AND d.ok = 1 AND d.path IS NOT NULL AND d.run_id != ? ORDER BY d.started DESC LIMIT 1", (host, not_run_id)).fetchone()
        return dict(row) if row else None

    def previous_after(self, uuid: str, run_id: str, before: str | None, host: str | None = None) -> dict | None:
        """The latest `after` snapshot of this GPU (or of this fabric device of node `host`) in an earlier run than
        run_id: {"run_id", "host", "read_at", "boot_id", "verdict", "counters": {name: value}}, or None."""
        query = "SELECT run_id, host, read_at, boot_id FROM counters WHERE uuid = ? AND phase = 'after' AND run_id <> ?"
        args: list = [uuid, run_id]
        if host is not None:
            query += " AND host = ?"
            args.append(host)
        if before:
            query += " AND read_at < ?"
            args.append(before)
        row = self.conn.execute(query + " ORDER BY read_at DESC LIMIT 1", args).fetchone()
        if not row:
            return None
        out = dict(row)
        out["counters"] = {r["counter"]: r["value"] for r in self.conn.execute(
            "SELECT counter, value FROM counters WHERE run_id = ? AND host = ? AND uuid = ? AND phase = 'after'",
            (out["run_id"], out["host"], uuid))}
        doc = self.conn.execute("SELECT verdict FROM documents WHERE run_id = ? AND host = ?", (out["run_id"], out["host"])).fetchone()
        out["verdict"] = doc["verdict"] if doc else None
        return out

    def gpu_failures(self, uuid: str | None, serial: str | None, run_id: str) -> list[dict]:
        """Earlier runs where this GPU (same uuid or same serial) was named by a failing result of class hardware,
        newest first, each with whether it was accepted since (a later run where its node was accepted and nothing
        failed on it). A failure of another class (a process on the GPU, the lock) is the node's, not the board's."""
        if not uuid and not serial:
            return []
        match = "(uuid = ? OR serial = ?)"
        ids = (uuid or "\0", serial or "\0")
        started = (self.run(run_id) or {}).get("started")
        fails = [dict(r) for r in self.conn.execute(
            f"SELECT f.run_id, f.host, f.gpu_index, f.uuid, f.serial, f.check_id, f.status, f.reason, f.failure_class, r.started "
            f"FROM gpu_flags f LEFT JOIN runs r ON r.run_id = f.run_id "
            f"WHERE {match.replace('uuid', 'f.uuid').replace('serial', 'f.serial')} AND f.status IN ('fail', 'error') AND f.run_id <> ? "
            f"ORDER BY r.started DESC, f.run_id DESC", (*ids, run_id))]
        if started:
            fails = [f for f in fails if not f["started"] or f["started"] <= started]
        fails = [f for f in map(_flag_row, fails) if f["class"] == failure_class.HARDWARE]
        if not fails:
            return []
        seen = [dict(r) for r in self.conn.execute(
            f"SELECT g.run_id, g.host, r.started, d.verdict FROM gpus g JOIN runs r ON r.run_id = g.run_id "
            f"JOIN documents d ON d.run_id = g.run_id AND d.host = g.host "
            f"WHERE {match.replace('uuid', 'g.uuid').replace('serial', 'g.serial')} AND g.run_id <> ?", (*ids, run_id))]
        failed_runs = {f["run_id"] for f in fails}
        for f in fails:
            later = [s for s in seen if s["started"] and f["started"] and f["started"] < s["started"]
                     and (not started or s["started"] < started) and s["verdict"] in ACCEPTED and s["run_id"] not in failed_runs]
            f["accepted_since"] = min(later, key=lambda s: s["started"]) if later else None
        return fails

    def sdc_hashes(self, comparable: str, computation: str, run_id: str) -> list[dict]:
        """The SDC hashes of every GPU with the same comparable keys, from runs other than run_id, newest first."""
        return [dict(r) for r in self.conn.execute(
            "SELECT h.*, r.started FROM sdc_hashes h LEFT JOIN runs r ON r.run_id = h.run_id "
            "WHERE h.comparable = ? AND h.computation = ? AND h.run_id <> ? ORDER BY r.started DESC, h.run_id DESC",
            (comparable, computation, run_id))]

    def resolve(self, key: str) -> tuple[str, str]:
        """What KEY names in `gpufleet history KEY`: ("gpu", uuid), ("serial", serial) or ("node", host)."""
        if key.upper().startswith("GPU-"):
            hit = self.conn.execute("SELECT uuid FROM gpus WHERE lower(uuid) = lower(?) LIMIT 1", (key,)).fetchone()
            if hit:
                return "gpu", hit[0]
        elif self.conn.execute("SELECT 1 FROM gpus WHERE serial = ? LIMIT 1", (key,)).fetchone():
            return "serial", key
        if self.conn.execute("SELECT 1 FROM documents WHERE host = ? LIMIT 1", (key,)).fetchone():
            return "node", key
        n = self.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        raise InputError(f"{key!r} is no node, GPU UUID or serial in the store {self.path} ({n} run(s)); expected an inventory "
                         "host name, a GPU UUID (GPU-...) or a GPU serial that a run recorded")

    def history(self, key: str) -> dict:
        """Figures and verdicts over time of a node, a GPU (uuid) or a serial, oldest run first."""
        kind, value = self.resolve(key)
        rows: list[dict] = []
        if kind == "node":
            for d in self.conn.execute(
                    "SELECT d.*, r.started AS run_started FROM documents d JOIN runs r ON r.run_id = d.run_id "
                    "WHERE d.host = ? ORDER BY r.started IS NULL, r.started, d.run_id", (value,)):
                d = dict(d)
                rows.append({
                    "run_id": d["run_id"], "started": d["run_started"] or d["started"], "node": value, "role": d["role"],
                    "verdict": d["verdict"], "document": "ok" if d["ok"] else d["reason"],
                    "metrics": self._metrics(d["run_id"], value, None),
                    "not_passing": self._not_passing(d["run_id"], value),
                    "gpus": [dict(g) for g in self.conn.execute(
                        "SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ? ORDER BY gpu_index", (d["run_id"], value))],
                })
        else:
            column = "uuid" if kind == "gpu" else "serial"
            for g in self.conn.execute(
                    f"SELECT g.*, r.started AS run_started, d.verdict FROM gpus g JOIN runs r ON r.run_id = g.run_id "
                    f"LEFT JOIN documents d ON d.run_id = g.run_id AND d.host = g.host "
                    f"WHERE g.{column} = ? ORDER BY r.started IS NULL, r.started, g.run_id", (value,)):
                g = dict(g)
                rows.append({
                    "run_id": g["run_id"], "started": g["run_started"], "node": g["host"], "index": g["gpu_index"],
                    "uuid": g["uuid"], "serial": g["serial"], "verdict": g["verdict"],
                    "metrics": self._metrics(g["run_id"], g["host"], g["gpu_index"]),
                    "flags": [_flag_row(f) for f in self.conn.execute(
                        "SELECT check_id, status, reason, failure_class FROM gpu_flags WHERE run_id = ? AND host = ? AND "
                        "(uuid = ? OR (uuid IS NULL AND gpu_index = ?))", (g["run_id"], g["host"], g["uuid"], g["gpu_index"]))],
                })
        out = {"kind": kind, "key": value, "store": str(self.path), "baseline": (self.baseline() or {}).get("run_id"), "runs": rows}
        if kind == "node":
            out["service"] = {"costs": service_log.costs(self, [value])["nodes"][value],
                              "ladder": [e["detail"] for e in self.events(value, "ladder")]}
        return out

    def _metrics(self, run_id: str, host: str, gpu_index: int | None) -> dict:
        where = "gpu_index IS NULL" if gpu_index is None else "gpu_index = ?"
        args = [run_id, host] + ([] if gpu_index is None else [gpu_index])
        return {r["metric"]: {"value": r["value"], "unit": r["unit"], "cpu": bool(r["cpu"])} for r in self.conn.execute(
            f"SELECT metric, value, unit, cpu FROM metrics WHERE run_id = ? AND host = ? AND {where}", args)}

    def _not_passing(self, run_id: str, host: str) -> list[dict]:
        return [{"check": f"{r['group_name']}.{r['check_name']}" if r["group_name"] else r["check_name"], "status": r["status"],
                 "class": r["failure_class"] or failure_class.default(r["check_name"], r["status"], r["group_name"])}
                for r in self.conn.execute("SELECT group_name, check_name, status, failure_class FROM results WHERE run_id = ? AND host = ? "
                                           "AND status IN ('warn', 'fail', 'error') ORDER BY seq", (run_id, host))]

    def dump(self) -> dict[str, list[tuple]]:
        """Every row of every indexed table, sorted: what two stores must share to be the same index."""
        out = {}
        for table in ("runs", "baseline", *HOST_TABLES):
            out[table] = sorted((tuple(r) for r in self.conn.execute(f"SELECT * FROM {table}")), key=repr)
        return out


def _flag_row(row) -> dict:
    """A gpu_flags row as a dict with its `class`: the stored one, or for rows indexed before results carried a
    class, the check's default."""
    f = dict(row)
    group, _, check = f["check_id"].rpartition(".")
    f["class"] = f.pop("failure_class") or failure_class.default(check, f["status"], group or None)
    return f
