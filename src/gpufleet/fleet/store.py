"""The fleet's memory: an SQLite store of every run, indexed by run, node, GPU uuid and serial, check and metric.

The run folders stay the record; the store is an index of them that `rebuild()` recreates (the baseline, which
only the store holds, is also kept in baseline.json beside it). One file, `<reports_dir>/gpufleet.db` by default,
in WAL mode so readers never wait on a writer. Every write is one `BEGIN IMMEDIATE` transaction with a busy
timeout: two runs (two controllers, two ansible-playbook processes) writing at once queue for the write lock
instead of failing or interleaving.

    store.py          the connection, its transactions, a run's row and one host document indexed
    store_tables.py   the tables (schema version 3) and their migrations; what a SQLite error says of the file
    store_folders.py  run folders indexed, the store rebuilt from them, the log of repairs
    store_baseline.py the baseline run (also in baseline.json)
    store_queries.py  history and the questions the fleet judgement asks

A damaged or foreign file at the store's path (garbage, random bytes over its pages, a table gone, another
application's SQLite) is a DamagedStore, on opening it (`check=True` adds SQLite's check of every page) or on using
it (`store_tables.problem()` of the SQLite error); fleet/repair.py moves it aside as <name>.damaged-<UTC time> and
rebuilds the store from the run folders, as for a missing store, so history and the baseline come back.

Indexing a host document replaces every row of that (run_id, host) in one transaction, so indexing twice is
the same as once, and a reader never sees half a document.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from gpufleet.base import failure_class, paths, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import DB_NAME, GROUP, sdc_voters
from gpufleet.comparisons import metrics
from gpufleet.fleet.counter_table import FABRIC_COUNTERS
from gpufleet.fleet.store_baseline import Baseline
from gpufleet.fleet.store_folders import RunFolders
from gpufleet.fleet.store_queries import Queries
from gpufleet.fleet import store_tables
from gpufleet.fleet.store_tables import HOST_TABLES, SCHEMA_VERSION, DamagedStore

__all__ = ["SCHEMA_VERSION", "DamagedStore", "Store", "default_path", "errors_said"]

BUSY_TIMEOUT_S = 60.0  # a rebuild of a long history holds the write lock for seconds, not minutes


def default_path(reports_dir: Path | str) -> Path:
    return Path(reports_dir) / DB_NAME


def errors_said(store_path: Callable[[Any], Path]):
    """A command's decorator: a SQLite error met while it uses the store (store_path(args)) is said for what it
    means (the store damaged, with `gpufleet store rebuild` to repair it; busy; a full disk), naming the store:
    InputError, exit 2, never a traceback."""

    def wrap(cmd):
        @functools.wraps(cmd)
        def run(args) -> int:
            try:
                return cmd(args)
            except sqlite3.Error as exc:
                raise store_tables.problem(store_path(args), exc) from None

        return run

    return wrap


def _sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


_DOCUMENT_COLUMNS = "run_id, host, role, path, sha256, ok, reason, started, verdict, versions"
_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # json.dumps(v, sort_keys=True, default=str), made once


def _json(v: Any) -> str | None:
    return None if v is None else _ENCODER.encode(v)


class Store(RunFolders, Baseline, Queries):
    """One connection to the store; use as a context manager (`with Store(path) as store:`). `check`: SQLite's
    check of every page on opening (a run's report, `store rebuild`), so that damage is found before it is used."""

    def __init__(
        self, path: Path | str, *, create: bool = True, busy_timeout_s: float = BUSY_TIMEOUT_S, check: bool = False
    ):
        self.path = Path(path)
        odd = paths.not_a_file(self.path)
        if odd:  # never opened: SQLite would wait on a FIFO for good, and write through a link into another folder
            raise store_tables.damaged(self.path, f"it {odd.removeprefix('is ')}")
        if not self.path.exists():
            if not create:
                raise InputError(
                    f"store {self.path} does not exist; expected the file `gpufleet store rebuild` or a run makes "
                    "(--db PATH, or --reports-dir DIR holding gpufleet.db)"
                )
            if not self.path.parent.is_dir():
                raise InputError(
                    f"store {self.path}: the folder {self.path.parent} does not exist; expected an existing folder"
                )
            self._create()
        elif paths.read_denied(self.path):  # a run moves it aside as it would a damaged one: nothing is lost
            raise store_tables.damaged(self.path, "it cannot be read (permission denied)")
        elif self.path.stat().st_size == 0:  # emptied (`: > gpufleet.db`): said before SQLite writes a header to it
            raise store_tables.damaged(self.path, "it is empty (0 bytes)")
        self.busy_timeout_s = busy_timeout_s
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise store_tables.problem(self.path, exc) from None
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            with (
                self.write() as c
            ):  # before WAL: a file that is not a gpufleet store, or a damaged one, is never changed
                store_tables.create_or_migrate(c, self.path)
            if check:
                store_tables.check_pages(self.conn, self.path)
            self._wal()
        except sqlite3.Error as exc:
            self.conn.close()
            raise store_tables.problem(self.path, exc) from None
        except InputError:
            self.conn.close()
            raise

    # ------------------------------------------------------------ set-up

    def _create(self) -> None:
        """A new store, made beside its path with its tables and linked into place whole: a file at the store's
        path always has them, so one without any (emptied, `: > gpufleet.db`) is damage, never a store being made.
        Owner and group only, like the run folders' files; -wal and -shm inherit the mode. Another process that
        made it first wins; this one opens theirs."""
        new = self.path.with_name(f".{self.path.name}.new-{os.getpid()}")
        try:
            os.close(os.open(new, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o640))
            conn = sqlite3.connect(str(new), isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                store_tables.create_or_migrate(conn, self.path, new=True)
                conn.execute("COMMIT")
            finally:
                conn.close()
            try:
                os.link(new, self.path)
            except OSError as exc:  # a file system without hard links: renamed into place, unless one came first
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP) or self.path.exists():
                    raise
                os.rename(new, self.path)
        except FileExistsError:
            pass
        except (OSError, sqlite3.Error) as exc:
            full = paths.full_disk(self.path)
            raise InputError(
                f"cannot create the store {self.path}: {full or getattr(exc, 'strerror', None) or exc}; expected a "
                "writable folder with space left"
            ) from None
        finally:
            for leftover in (new, Path(f"{new}-journal")):
                leftover.unlink(missing_ok=True)

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
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise store_tables.problem(self.path, exc) from None
            raise InputError(
                f"store {self.path} stayed locked for {self.busy_timeout_s:g} s ({exc}); another process is "
                "writing to it: try again when it is done"
            ) from None
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
            "tier": info.get("tier")
            or next((a.get("tier") for a in reversed(attempts or []) if isinstance(a, dict) and a.get("tier")), None),
            "attempts": len(attempts) if isinstance(attempts, list) else None,
            "hosts": _json(info.get("hosts")) if isinstance(info.get("hosts"), list) else None,
            "baseline_ref": info.get("baseline"),
            "problem": info.get("problem"),
        }
        with self.write() as c:
            c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
            sets = ", ".join(f"{k} = COALESCE(?, {k})" for k in row if k != "run_id")
            c.execute(
                f"UPDATE runs SET {sets} WHERE run_id = ?", [*(v for k, v in row.items() if k != "run_id"), run_id]
            )
            if "problem" in info and info["problem"] is None:
                c.execute("UPDATE runs SET problem = NULL WHERE run_id = ?", (run_id,))

    def record_verdicts(
        self, run_id: str, verdict: str, node_verdicts: dict[str, str], finished: str | None = None
    ) -> None:
        """The report's verdicts: the run's, and each node's (its documents row), fleet results included."""
        with self.write() as c:
            c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
            c.execute(
                "UPDATE runs SET verdict = ?, finished = COALESCE(?, finished) WHERE run_id = ?",
                (verdict, finished, run_id),
            )
            for host, v in node_verdicts.items():
                c.execute("UPDATE documents SET verdict = ? WHERE run_id = ? AND host = ?", (v, run_id, host))

    # ------------------------------------------------------------ host documents

    def index_document(
        self,
        run_id: str,
        host: str,
        doc: dict | None,
        *,
        path: str | None,
        raw: bytes | None = None,
        problem: str | None = None,
        role: str = "node",
        node_metrics: dict | None = None,
        fresh: bool = False,
    ) -> None:
        """Replace every row of (run_id, host) with what `doc` holds; `doc` None records why (problem) instead.
        `node_metrics`: metrics.extract() of the document's readable results, when the caller has it already. `fresh`:
        the caller knows the run has a row in runs and none of the host's rows yet (nothing to delete)."""
        with self.write() as c:
            if not fresh:
                c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
                for table in HOST_TABLES:
                    c.execute(f"DELETE FROM {table} WHERE run_id = ? AND host = ?", (run_id, host))
            sha = _sha256(raw) if raw is not None else None
            if doc is None:
                c.execute(
                    f"INSERT INTO documents ({_DOCUMENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, 0, ?, NULL, ?, NULL)",
                    (run_id, host, role, path, sha, problem or "unreadable", schema.ERROR),
                )
                return
            results = [r for r in doc.get("results") or [] if schema.result_problem(r) is None]
            versions = doc.get("versions") if isinstance(doc.get("versions"), dict) else None
            c.execute(
                f"INSERT INTO documents ({_DOCUMENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, 1, NULL, ?, ?, ?)",
                (run_id, host, role, path, sha, doc.get("started"), schema.verdict(results), _json(versions)),
            )
            self._insert_node_rows(c, run_id, host, results, node_metrics)

    def _insert_node_rows(
        self, c: sqlite3.Connection, run_id: str, host: str, results: list[dict], node_metrics: dict | None = None
    ) -> None:
        node_metrics = node_metrics if node_metrics is not None else metrics.extract(results)
        gpus = node_metrics["gpus"]
        by_index = {g["index"]: g for g in gpus}
        c.executemany(
            "INSERT INTO gpus (run_id, host, gpu_index, uuid, serial, pci_bus_id, name, visible) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    host,
                    g["index"],
                    g.get("uuid"),
                    g.get("serial"),
                    g.get("pci_bus_id"),
                    g.get("name"),
                    None if g.get("visible") is None else int(g["visible"]),
                )
                for g in gpus
            ],
        )
        self._insert_results(c, run_id, host, results, by_index, start=0)
        c.executemany(
            "INSERT INTO metrics (run_id, host, gpu_index, uuid, serial, metric, value, unit, cpu, context, source) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    host,
                    m["index"],
                    m["uuid"],
                    m["serial"],
                    m["key"],
                    m["value"],
                    m["unit"],
                    int(m["cpu"]),
                    m["context"],
                    m["source"],
                )
                for m in node_metrics["metrics"]
            ],
        )
        # A later run compares its counters with each GPU's and fabric device's last snapshot of an earlier run, the
        # one after the benchmarks (previous_after); the one before them stays in the host document. Half the rows
        # of a fleet's run, which nothing read.
        phase, rows = "after", []
        snap = node_metrics["snapshots"].get(phase)
        for g in (snap or {}).get("gpus") or []:
            if not isinstance(g, dict):
                continue
            for name, value in (g.get("counters") or {}).items():
                rows.append(
                    (
                        run_id,
                        host,
                        g.get("index"),
                        g.get("uuid"),
                        g.get("serial"),
                        phase,
                        snap.get("read_at"),
                        snap.get("boot_id"),
                        name,
                        value if isinstance(value, int) and not isinstance(value, bool) else None,
                    )
                )
        judged = {row[0] for row in FABRIC_COUNTERS}
        snap = node_metrics["snapshots"]["fabric"].get(phase)
        for d in (snap or {}).get("devices") or []:
            if not isinstance(d, dict):
                continue
            for name, value in (d.get("counters") or {}).items():
                if name in judged:
                    rows.append(
                        (
                            run_id,
                            host,
                            None,
                            d.get("id"),
                            None,
                            phase,
                            snap.get("read_at"),
                            snap.get("boot_id"),
                            name,
                            value if isinstance(value, int) and not isinstance(value, bool) else None,
                        )
                    )
        c.executemany(
            "INSERT INTO counters (run_id, host, gpu_index, uuid, serial, phase, read_at, boot_id, counter, value) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        c.executemany(
            "INSERT INTO sdc_hashes (run_id, host, gpu_index, uuid, serial, comparable, computation, sha256) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    host,
                    h["index"],
                    h["uuid"],
                    h["serial"] or by_index.get(h["index"], {}).get("serial"),
                    h["comparable"],
                    h["computation"],
                    h["sha256"],
                )
                for h in sdc_voters.hash_rows(results)
            ],
        )

    def _insert_results(
        self, c: sqlite3.Connection, run_id: str, host: str, results: list[dict], by_index: dict, start: int
    ) -> None:
        c.executemany(
            "INSERT INTO results (run_id, host, seq, group_name, check_name, status, value, unit, reason, "
            "failure_class) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    host,
                    start + i,
                    r.get("group"),
                    r["check"],
                    r["status"],
                    _json(r.get("value")),
                    r.get("unit"),
                    r.get("reason"),
                    failure_class.of(r),
                )
                for i, r in enumerate(results)
            ],
        )
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
                flags.append(
                    (
                        run_id,
                        host,
                        f.get("index"),
                        uuid,
                        serial,
                        f"{r.get('group')}.{r['check']}" if r.get("group") else r["check"],
                        r["status"],
                        r.get("reason"),
                        failure_class.of(r),
                    )
                )
        c.executemany(
            "INSERT INTO gpu_flags (run_id, host, gpu_index, uuid, serial, check_id, status, reason, failure_class) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            flags,
        )

    def record_fleet(self, run_id: str, fleet_results: dict[str, list[dict]]) -> None:
        """The fleet layer's results of each node (group fleet), in place of any earlier ones of the run."""
        with self.write() as c:
            for host, results in fleet_results.items():
                c.execute("DELETE FROM results WHERE run_id = ? AND host = ? AND group_name = ?", (run_id, host, GROUP))
                c.execute(
                    "DELETE FROM gpu_flags WHERE run_id = ? AND host = ? AND check_id LIKE ?",
                    (run_id, host, f"{GROUP}.%"),
                )
                start = c.execute(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM results WHERE run_id = ? AND host = ?", (run_id, host)
                ).fetchone()[0]
                by_index = {
                    r["gpu_index"]: {"uuid": r["uuid"], "serial": r["serial"]}
                    for r in c.execute(
                        "SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ?", (run_id, host)
                    )
                }
                self._insert_results(
                    c, run_id, host, [r for r in results if schema.result_problem(r) is None], by_index, start
                )
