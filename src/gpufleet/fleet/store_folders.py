"""The store's reading of run folders: a run folder indexed (run.json, hosts/*.json, peers/*.json), the whole store
rebuilt from every run folder under the reports folder (verdicts and fleet results from each report.json, the
baseline from baseline.json), and the log of those rebuilds (table repairs).

A mixin of fleet.store.Store: it uses the connection, the transactions and the indexing of one document there.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.base import paths, runs, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import GROUP, service_log
from gpufleet.fleet.run_files import read_baseline_file, read_run_info
from gpufleet.fleet.store_tables import HOST_TABLES


def run_folders(reports_dir: Path) -> list[Path]:
    """The run folders under reports_dir (a run record or host documents), in name order."""
    return [
        p
        for p in sorted(reports_dir.iterdir())
        if not p.is_symlink()  # a run folder is a folder of its own (paths.own_folder): linked_folders() names them
        and p.is_dir()
        and not p.name.startswith(".")
        and ((p / "run.json").exists() or (p / "hosts").is_dir())
    ]


def linked_folders(reports_dir: Path) -> list[dict]:
    """The symbolic links to folders under reports_dir, never taken for run folders: {"run_id", "file", "reason"}."""
    return [
        {"run_id": p.name, "file": p.name, "reason": f"{p.name} {paths.not_a_file(p)}: not a run folder, not indexed"}
        for p in sorted(reports_dir.iterdir())
        if p.is_symlink() and p.is_dir()
    ]


class RunFolders:
    """Indexing whole run folders, and the store rebuilt from them."""

    def index_run(
        self, run_dir: Path | str, *, expected_hosts: list[str] | None = None, read: dict | None = None
    ) -> dict:
        """Index one run folder: its run.json, every hosts/*.json and peers/*.json; a host named by run.json or
        expected but without a document is recorded as missing. One transaction. Returns what was indexed.
        `read`: files the caller has read and parsed already, so they are not read again: {"hosts/<host>.json":
        {"raw": bytes, "doc": schema.parse_host_doc's document or None, "why": its reason, "metrics": optional
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
        fresh = not any(
            self.conn.execute(f"SELECT 1 FROM {table} WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
            for table in HOST_TABLES
        )
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
                    raw, why = paths.read_bytes(path)
                    if raw is None:
                        why = f"{rel} {why}"
                        self.index_document(run_id, host, None, path=rel, problem=why, role=role, fresh=fresh)
                        done["unreadable"].append({"host": host, "reason": why})
                        continue
                    doc, why = schema.parse_host_doc(raw)
                if doc is None:
                    why = f"{rel} is unreadable: {why}"
                    done["unreadable"].append({"host": host, "reason": why})
                self.index_document(
                    run_id,
                    host,
                    doc,
                    path=rel,
                    raw=raw,
                    problem=why,
                    role=role,
                    node_metrics=(known or {}).get("metrics"),
                    fresh=fresh,
                )
                done["documents"] += doc is not None
        hosts = [h for h in (info.get("hosts") or []) if isinstance(h, str)] + expected
        for host in dict.fromkeys(hosts):
            if host not in seen:
                why = f"hosts/{host}.json does not exist: the node never reported (unreachable, or the run was interrupted)"
                self.index_document(run_id, host, None, path=f"hosts/{host}.json", problem=why, fresh=fresh)
                done["missing"].append(host)
                seen.add(host)
        if info.get("problem"):
            done["unreadable"].append({"file": runs.RUN_FILE, "reason": info["problem"]})
        for source, why in self._index_events(run_dir, run_id).items():
            done["unreadable"].append({"file": source, "reason": f"{source} {why}"})
        return done

    def rebuild(self, reports_dir: Path | str) -> dict:
        """Recreate the store from the run folders under reports_dir, in one transaction: readers see the old
        store until the new one is complete. Verdicts and the fleet results (group fleet) come from each run's
        report.json; the baseline from baseline.json beside the store when it names one of those runs (else the
        store's own, and `baseline_problem` says why the file was not taken)."""
        reports_dir = Path(reports_dir)
        if not reports_dir.is_dir():
            raise InputError(
                f"reports directory {reports_dir} does not exist; expected the folder holding the run folders "
                "(gpufleet_reports_dir, default ./reports)"
            )
        summary: dict = {
            "reports_dir": str(reports_dir),
            "store": str(self.path),
            "runs": [],
            "unreadable": [],
            "missing": [],
        }
        with self.write() as c:
            kept_baseline = [dict(r) for r in c.execute("SELECT * FROM baseline")]
            kept_events = c.execute(f"SELECT {', '.join(service_log.COLUMNS)} FROM events").fetchall()
            for table in ("runs", "baseline", "events", *HOST_TABLES):
                c.execute(f"DELETE FROM {table}")
            summary["unreadable"] += linked_folders(reports_dir)
            for run_dir in run_folders(reports_dir):
                done = self._index_run(run_dir, [])
                self._restore_report(run_dir, done)
                summary["runs"].append(done["run_id"])
                for u in done["unreadable"]:
                    if u.get("file") in service_log.SOURCES:  # an action record: the rows the store held of it stay
                        kept = [r for r in kept_events if r[0] == done["run_id"] and r[1] == u["file"]]
                        self._insert_events(c, kept)
                        u["reason"] += f"; the store keeps the {len(kept)} event(s) it held of it"
                    summary["unreadable"].append({"run_id": done["run_id"], **u})
                summary["missing"] += [{"run_id": done["run_id"], "host": h} for h in done["missing"]]
            saved, summary["baseline_problem"] = read_baseline_file(self.path.parent, summary["runs"])
            if saved:
                c.execute(
                    "INSERT INTO baseline (run_id, set_at, cleared_at) VALUES (?, ?, NULL)",
                    (saved["run_id"], saved.get("set_at") or schema.utc_now()),
                )
            else:
                c.executemany(
                    "INSERT INTO baseline (run_id, set_at, cleared_at) VALUES (?, ?, ?)",
                    [(b["run_id"], b["set_at"], b["cleared_at"]) for b in kept_baseline],
                )
        summary["baseline"] = (self.baseline() or {}).get("run_id")
        return summary

    def index_left_out(self, reports_dir: Path | str, but: str) -> list[str]:
        """Index the run folders under reports_dir the store holds nothing of, but run `but` and runs that may still
        be going (they index themselves): a run whose documents could not be indexed as they came (a full disk, a
        store busy past its timeout) and that was never reported reaches the history with the next report. Returns
        their run ids."""
        known = {r[0] for r in self.conn.execute("SELECT run_dir FROM runs WHERE run_dir IS NOT NULL")}
        ids = {r[0] for r in self.conn.execute("SELECT run_id FROM runs")}
        done = []
        for run_dir in run_folders(Path(reports_dir)):
            if str(run_dir.resolve()) in known or runs.going(run_dir):
                continue
            run_id = runs.run_id_of(run_dir)
            if run_id == but or run_id in ids:
                continue
            with self.write():
                self._restore_report(run_dir, self._index_run(run_dir, []))
            done.append(run_id)
        return done

    def _restore_report(self, run_dir: Path, done: dict) -> None:
        """Fleet results and verdicts of a run that was reported (report.json)."""
        run_id = done["run_id"]
        path = run_dir / "report.json"
        rep, why = paths.read_json(path) if os.path.lexists(path) else (None, None)
        if why or (rep is not None and not (isinstance(rep, dict) and isinstance(rep.get("nodes"), dict))):
            done["unreadable"].append(
                {
                    "file": "report.json",
                    "reason": f"report.json {why or 'is not a report'}: the run's verdicts are "
                    f"not restored; `gpufleet report {run_dir}` makes it again",
                }
            )
        if isinstance(rep, dict) and isinstance(rep.get("nodes"), dict):
            self.record_fleet(
                run_id,
                {
                    h: [r for r in n.get("results") or [] if isinstance(r, dict) and r.get("group") == GROUP]
                    for h, n in rep["nodes"].items()
                    if isinstance(n, dict)
                },
            )
            nodes = {
                h: n.get("verdict")
                for h, n in rep["nodes"].items()
                if isinstance(n, dict) and n.get("verdict") in schema.STATUSES
            }
            known = {r[0] for r in self.conn.execute("SELECT host FROM documents WHERE run_id = ?", (run_id,))}
            for host in nodes:
                if host not in known:  # in the report (an expected host that never reported), not in the folder
                    self.index_document(
                        run_id,
                        host,
                        None,
                        path=f"hosts/{host}.json",
                        problem=f"hosts/{host}.json does not exist: the report lists the node, which never reported",
                    )
                    done["missing"].append(host)
            if rep.get("verdict") in schema.STATUSES:
                self.record_verdicts(run_id, rep["verdict"], nodes, rep.get("generated"))

    # ------------------------------------------------------------ service events (fleet/service_log.py)

    def index_events(self, run_dir: Path | str) -> dict[str, str]:
        """The run folder's action records (slurm.json, sweep.json, ladder.json) indexed again, each in place of its rows."""
        with self.write():
            return self._index_events(Path(run_dir), runs.run_id_of(run_dir))

    def _index_events(self, run_dir: Path, run_id: str) -> dict[str, str]:
        """The run's action records indexed, each in place of its rows; a damaged one leaves its rows as they were.
        Returns {file: why} of the damaged ones."""
        rows_of, damaged = service_log.run_rows(run_dir, run_id)
        with self.write() as c:
            for source, rows in rows_of.items():
                c.execute("DELETE FROM events WHERE run_id = ? AND source = ?", (run_id, source))
                self._insert_events(c, rows)
        return damaged

    @staticmethod
    def _insert_events(c, rows) -> None:
        c.executemany(
            f"INSERT INTO events ({', '.join(service_log.COLUMNS)}) VALUES ({', '.join('?' * len(service_log.COLUMNS))})",
            rows,
        )

    def log_repair(self, what: str, note: str, *, moved_aside: Path | None, runs: int, baseline: str | None) -> dict:
        row = {
            "at": schema.utc_now(),
            "what": what,
            "moved_aside": str(moved_aside) if moved_aside else None,
            "runs": runs,
            "baseline": baseline,
            "note": note,
        }
        with self.write() as c:
            c.execute(
                "INSERT INTO repairs (at, what, moved_aside, runs, baseline, note) "
                "VALUES (:at, :what, :moved_aside, :runs, :baseline, :note)",
                row,
            )
        return row

    def repairs_since(self, since: str | None) -> list[dict]:
        """The store's repairs (damaged or missing, rebuilt) at or after `since` (a run's start), oldest first."""
        return [
            dict(r)
            for r in self.conn.execute(
                "SELECT * FROM repairs WHERE what <> 'rebuild' AND at >= ? ORDER BY at", (since or "",)
            )
        ]
