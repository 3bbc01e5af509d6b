"""The store's questions: a run's rows, a node's, a GPU's or a serial's history, a GPU's earlier failures and counter
snapshots, the SDC hashes of the same comparable keys. A mixin of fleet.store.Store; nothing here writes."""

from __future__ import annotations

import json

from gpufleet.base import failure_class, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import service_log
from gpufleet.fleet.store_tables import HOST_TABLES

ACCEPTED = (schema.PASS, schema.WARN)


class Queries:
    """Reading the store."""

    def run(self, run_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return dict(row) if row else None

    def runs(self) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY started IS NULL, started, run_id")]

    def run_metrics(self, run_id: str) -> list[dict]:
        return [
            dict(r)
            for r in self.conn.execute(
                "SELECT m.* FROM metrics m JOIN documents d ON d.run_id = m.run_id AND d.host = m.host "
                "WHERE m.run_id = ? AND d.role = 'node' ORDER BY m.host, m.metric, m.gpu_index",
                (run_id,),
            )
        ]

    def gpu_past(self, hosts: list[str], run_id: str, runs: int) -> list[dict]:
        """The per-GPU figures of each of these nodes' latest `runs` runs other than run_id in which it was accepted
        (pass or warn): {"run_id", "host", "uuid", "metric", "context", "value"}, newest run first, so that
        comparisons/character.py holds a GPU against its own place among its siblings. At most `runs` documents a node."""
        if not hosts:
            return []
        return [
            dict(r)
            for r in self.conn.execute(
                "WITH recent AS (SELECT run_id, host, started FROM (SELECT d.run_id, d.host, r.started, ROW_NUMBER() OVER "
                "(PARTITION BY d.host ORDER BY r.started DESC, d.run_id DESC) AS k FROM documents d JOIN runs r ON r.run_id = d.run_id "
                "WHERE d.role = 'node' AND d.verdict IN ('pass', 'warn') AND d.run_id <> ? AND d.host IN (SELECT value FROM json_each(?))) "
                "WHERE k <= ?) "
                "SELECT m.run_id, m.host, m.uuid, m.metric, m.context, m.value FROM recent JOIN metrics m "
                "ON m.run_id = recent.run_id AND m.host = recent.host WHERE m.uuid IS NOT NULL AND m.cpu = 0 "
                "ORDER BY recent.started DESC, m.run_id DESC",
                (run_id, json.dumps(sorted(set(hosts))), runs),
            )
        ]

    def node_figures_before(self, hosts: list[str], run_id: str, metrics: list[str]) -> dict[tuple, dict]:
        """Each node's latest figure of each of these node-level metrics from a run that started before run_id
        (any verdict): {(host, metric, context): {"run_id", "value"}}, so that a drop is known to repeat over runs
        (comparisons/trusted.py)."""
        if not hosts:
            return {}
        started = (self.run(run_id) or {}).get("started")
        rows = self.conn.execute(
            "SELECT host, metric, context, run_id, value FROM (SELECT m.host, m.metric, m.context, m.run_id, m.value, "
            "ROW_NUMBER() OVER (PARTITION BY m.host, m.metric, m.context ORDER BY r.started DESC, m.run_id DESC) AS k "
            "FROM metrics m JOIN runs r ON r.run_id = m.run_id JOIN documents d ON d.run_id = m.run_id AND "
            "d.host = m.host WHERE d.role = 'node' AND m.gpu_index IS NULL AND m.cpu = 0 AND m.run_id <> ? "
            "AND m.host IN (SELECT value FROM json_each(?)) AND m.metric IN (SELECT value FROM json_each(?)) "
            "AND (? IS NULL OR r.started < ?)) WHERE k = 1",
            (run_id, json.dumps(sorted(set(hosts))), json.dumps(sorted(set(metrics))), started, started),
        )
        return {(r["host"], r["metric"], r["context"]): {"run_id": r["run_id"], "value": r["value"]} for r in rows}

    def events(self, host: str | None = None, kind: str | None = None) -> list[dict]:
        """Events oldest first, of one node and of one kind when given."""
        where = " AND ".join(w for w, v in (("host = ?", host), ("kind = ?", kind)) if v is not None) or "1"
        return [
            service_log.as_event(r)
            for r in self.conn.execute(
                f"SELECT {', '.join(service_log.COLUMNS)} FROM events WHERE {where} ORDER BY at, run_id, source, seq",
                [v for v in (host, kind) if v is not None],
            )
        ]

    def gpus(self, run_id: str, host: str) -> list[dict]:
        """The node's GPUs in that run: [{"gpu_index", "uuid", "serial"}], by index."""
        return [
            dict(r)
            for r in self.conn.execute(
                "SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ? ORDER BY gpu_index",
                (run_id, host),
            )
        ]

    def node_runs(self, host: str) -> list[dict]:
        """The node's runs with a readable document, oldest first: {"run_id", "started", "verdict", "clean"} (clean:
        no result warned, failed or erred)."""
        return [
            {"run_id": r["run_id"], "started": r["started"], "verdict": r["verdict"], "clean": not r["bad"]}
            for r in self.conn.execute(
                "SELECT d.run_id, COALESCE(r.started, d.started) AS started, d.verdict, EXISTS (SELECT 1 FROM results x "
                "WHERE x.run_id = d.run_id AND x.host = d.host AND x.status IN ('warn', 'fail', 'error')) AS bad "
                "FROM documents d JOIN runs r ON r.run_id = d.run_id WHERE d.host = ? AND d.role = 'node' AND d.ok = 1 "
                "ORDER BY started, d.run_id",
                (host,),
            )
        ]

    def documents(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM documents WHERE run_id = ? ORDER BY host", (run_id,))]

    def latest_document(self, host: str, not_run_id: str) -> dict | None:
        """The host's most recent readable node document of another run, with that run's folder, or None."""
        row = self.conn.execute(
            "SELECT d.*, r.run_dir FROM documents d JOIN runs r ON r.run_id = d.run_id WHERE d.host = ? AND d.role = 'node'"
            " AND d.ok = 1 AND d.path IS NOT NULL AND d.run_id != ? ORDER BY d.started DESC LIMIT 1",
            (host, not_run_id),
        ).fetchone()
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
        out["counters"] = {
            r["counter"]: r["value"]
            for r in self.conn.execute(
                "SELECT counter, value FROM counters WHERE run_id = ? AND host = ? AND uuid = ? AND phase = 'after'",
                (out["run_id"], out["host"], uuid),
            )
        }
        doc = self.conn.execute(
            "SELECT verdict FROM documents WHERE run_id = ? AND host = ?", (out["run_id"], out["host"])
        ).fetchone()
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
        fails = [
            dict(r)
            for r in self.conn.execute(
                f"SELECT f.run_id, f.host, f.gpu_index, f.uuid, f.serial, f.check_id, f.status, f.reason, f.failure_class, r.started "
                f"FROM gpu_flags f LEFT JOIN runs r ON r.run_id = f.run_id "
                f"WHERE {match.replace('uuid', 'f.uuid').replace('serial', 'f.serial')} AND f.status IN ('fail', 'error') AND f.run_id <> ? "
                f"ORDER BY r.started DESC, f.run_id DESC",
                (*ids, run_id),
            )
        ]
        if started:
            fails = [f for f in fails if not f["started"] or f["started"] <= started]
        fails = [f for f in map(_flag_row, fails) if f["class"] == failure_class.HARDWARE]
        if not fails:
            return []
        seen = [
            dict(r)
            for r in self.conn.execute(
                f"SELECT g.run_id, g.host, r.started, d.verdict FROM gpus g JOIN runs r ON r.run_id = g.run_id "
                f"JOIN documents d ON d.run_id = g.run_id AND d.host = g.host "
                f"WHERE {match.replace('uuid', 'g.uuid').replace('serial', 'g.serial')} AND g.run_id <> ?",
                (*ids, run_id),
            )
        ]
        failed_runs = {f["run_id"] for f in fails}
        for f in fails:
            later = [
                s
                for s in seen
                if s["started"]
                and f["started"]
                and f["started"] < s["started"]
                and (not started or s["started"] < started)
                and s["verdict"] in ACCEPTED
                and s["run_id"] not in failed_runs
            ]
            f["accepted_since"] = min(later, key=lambda s: s["started"]) if later else None
        return fails

    def sdc_hashes(self, comparable: str, computation: str, run_id: str) -> list[dict]:
        """The SDC hashes of every GPU with the same comparable keys, from runs other than run_id, newest first."""
        return [
            dict(r)
            for r in self.conn.execute(
                "SELECT h.*, r.started FROM sdc_hashes h LEFT JOIN runs r ON r.run_id = h.run_id "
                "WHERE h.comparable = ? AND h.computation = ? AND h.run_id <> ? ORDER BY r.started DESC, h.run_id DESC",
                (comparable, computation, run_id),
            )
        ]

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
        raise InputError(
            f"{key!r} is no node, GPU UUID or serial in the store {self.path} ({n} run(s)); expected an inventory "
            "host name, a GPU UUID (GPU-...) or a GPU serial that a run recorded"
        )

    def history(self, key: str) -> dict:
        """Figures and verdicts over time of a node, a GPU (uuid) or a serial, oldest run first."""
        kind, value = self.resolve(key)
        rows: list[dict] = []
        if kind == "node":
            for d in self.conn.execute(
                "SELECT d.*, r.started AS run_started FROM documents d JOIN runs r ON r.run_id = d.run_id "
                "WHERE d.host = ? ORDER BY r.started IS NULL, r.started, d.run_id",
                (value,),
            ):
                d = dict(d)
                rows.append(
                    {
                        "run_id": d["run_id"],
                        "started": d["run_started"] or d["started"],
                        "node": value,
                        "role": d["role"],
                        "verdict": d["verdict"],
                        "document": "ok" if d["ok"] else d["reason"],
                        "metrics": self._metrics(d["run_id"], value, None),
                        "not_passing": self._not_passing(d["run_id"], value),
                        "gpus": [
                            dict(g)
                            for g in self.conn.execute(
                                "SELECT gpu_index, uuid, serial FROM gpus WHERE run_id = ? AND host = ? ORDER BY gpu_index",
                                (d["run_id"], value),
                            )
                        ],
                    }
                )
        else:
            column = "uuid" if kind == "gpu" else "serial"
            for g in self.conn.execute(
                f"SELECT g.*, r.started AS run_started, d.verdict FROM gpus g JOIN runs r ON r.run_id = g.run_id "
                f"LEFT JOIN documents d ON d.run_id = g.run_id AND d.host = g.host "
                f"WHERE g.{column} = ? ORDER BY r.started IS NULL, r.started, g.run_id",
                (value,),
            ):
                g = dict(g)
                rows.append(
                    {
                        "run_id": g["run_id"],
                        "started": g["run_started"],
                        "node": g["host"],
                        "index": g["gpu_index"],
                        "uuid": g["uuid"],
                        "serial": g["serial"],
                        "verdict": g["verdict"],
                        "metrics": self._metrics(g["run_id"], g["host"], g["gpu_index"]),
                        "flags": [
                            _flag_row(f)
                            for f in self.conn.execute(
                                "SELECT check_id, status, reason, failure_class FROM gpu_flags WHERE run_id = ? AND host = ? AND "
                                "(uuid = ? OR (uuid IS NULL AND gpu_index = ?))",
                                (g["run_id"], g["host"], g["uuid"], g["gpu_index"]),
                            )
                        ],
                    }
                )
        out = {
            "kind": kind,
            "key": value,
            "store": str(self.path),
            "baseline": (self.baseline() or {}).get("run_id"),
            "runs": rows,
        }
        if kind == "node":
            out["service"] = {
                "costs": service_log.costs(self, [value])["nodes"][value],
                "ladder": [e["detail"] for e in self.events(value, "ladder")],
            }
        return out

    def _metrics(self, run_id: str, host: str, gpu_index: int | None) -> dict:
        where = "gpu_index IS NULL" if gpu_index is None else "gpu_index = ?"
        args = [run_id, host] + ([] if gpu_index is None else [gpu_index])
        return {
            r["metric"]: {"value": r["value"], "unit": r["unit"], "cpu": bool(r["cpu"])}
            for r in self.conn.execute(
                f"SELECT metric, value, unit, cpu FROM metrics WHERE run_id = ? AND host = ? AND {where}", args
            )
        }

    def _not_passing(self, run_id: str, host: str) -> list[dict]:
        return [
            {
                "check": f"{r['group_name']}.{r['check_name']}" if r["group_name"] else r["check_name"],
                "status": r["status"],
                "class": r["failure_class"] or failure_class.default(r["check_name"], r["status"], r["group_name"]),
            }
            for r in self.conn.execute(
                "SELECT group_name, check_name, status, failure_class FROM results WHERE run_id = ? AND host = ? "
                "AND status IN ('warn', 'fail', 'error') ORDER BY seq",
                (run_id, host),
            )
        ]

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
