"""The fleet's baseline in the store (table baseline: the row not cleared is the current one), kept also in
baseline.json beside the store so that a rebuild brings it back. A mixin of fleet.store.Store."""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.base.errors import InputError
from gpufleet.fleet.run_files import write_baseline_file


class Baseline:
    """Set, clear and read the baseline run."""

    def set_baseline(self, run_id: str) -> dict:
        if not self.run(run_id):
            known = [r["run_id"] for r in self.runs()][-8:]
            raise InputError(
                f"run {run_id!r} is not in the store {self.path}; expected one of its runs"
                + (f" (latest: {', '.join(known)})" if known else " (the store holds no run yet)")
                + "; if its folder exists, run `gpufleet store rebuild` first"
            )
        now = schema.utc_now()
        with self.write() as c:
            c.execute("UPDATE baseline SET cleared_at = ? WHERE cleared_at IS NULL", (now,))
            c.execute("INSERT INTO baseline (run_id, set_at, cleared_at) VALUES (?, ?, NULL)", (run_id, now))
        write_baseline_file(self.path.parent, {"run_id": run_id, "set_at": now})
        return self.baseline()

    def clear_baseline(self) -> dict | None:
        was = self.baseline()
        with self.write() as c:
            c.execute("UPDATE baseline SET cleared_at = ? WHERE cleared_at IS NULL", (schema.utc_now(),))
        write_baseline_file(self.path.parent, None)
        return was

    def baseline(self) -> dict | None:
        row = self.conn.execute(
            "SELECT run_id, set_at FROM baseline WHERE cleared_at IS NULL ORDER BY set_at DESC LIMIT 1"
        ).fetchone()
        if not row:
            return None
        out = dict(row)
        run = self.run(out["run_id"]) or {}
        out.update(verdict=run.get("verdict"), started=run.get("started"), run_dir=run.get("run_dir"))
        return out
