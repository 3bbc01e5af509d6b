"""The fleet store (gpufleet.fleet.store): concurrent writers, rebuild against incremental indexing, documents
that cannot be read, files that are not a store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpufleet import report
from gpufleet.base import schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import document_writer, history_text
from gpufleet.fleet.store import Store

from waiting import wait_for

from test_fleet_synthetic import ecc_failure, gpus_of, node_doc, write_run
from test_fleet_synthetic import measured_twice

R1 = ("2026-11-20T10:00:00Z", "2026-11-20T10:15:00Z")
R2 = ("2026-11-21T10:00:00Z", "2026-11-21T10:15:00Z")

WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from gpufleet.fleet.store import Store
    db, run_id, doc_path, go = sys.argv[1:5]
    doc = json.loads(Path(doc_path).read_text())
    Path(go + "." + run_id).touch()  # ready
    while not Path(go).exists():
        time.sleep(0.005)
    with Store(db) as store:
        for i in range(25):
            store.index_document(run_id, f"node{i}", dict(doc, host=f"node{i}"), path=f"hosts/node{i}.json", raw=b"x")
            store.record_verdicts(run_id, "pass", {f"node{i}": "pass"})
    print("done")
""")


def test_two_processes_write_at_once(tmp_path):
    db, go = tmp_path / "gpufleet.db", tmp_path / "go"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(node_doc("node", 0, read_at=R1)))
    Store(db).close()  # both find the store made; creating it at once is covered by its own retry
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), run, str(doc), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in ("runA", "runB")
    ]
    # Both ready (imported, which takes a busy machine seconds) before either writes: they write at once.
    wait_for(
        lambda: all(Path(f"{go}.{run}").exists() for run in ("runA", "runB")),
        120,
        "both writers ready",
        interval_s=0.05,
    )
    go.touch()
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    with Store(db) as store:
        docs = store.conn.execute("SELECT run_id, COUNT(*) FROM documents GROUP BY run_id").fetchall()
        assert sorted(tuple(r) for r in docs) == [("runA", 25), ("runB", 25)]
        per_doc = store.conn.execute(
            "SELECT COUNT(*) FROM metrics WHERE run_id = 'runA' AND host = 'node0'"
        ).fetchone()[0]
        assert store.conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == 50 * per_doc > 0
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_indexing_a_document_twice_is_indexing_it_once(tmp_path):
    with Store(tmp_path / "gpufleet.db") as store:
        doc = node_doc("n0", 0, read_at=R1, extra=[ecc_failure(gpus_of(0)[2])])
        store.index_document("r", "n0", doc, path="hosts/n0.json", raw=b"1")
        once = store.dump()
        store.index_document("r", "n0", doc, path="hosts/n0.json", raw=b"1")
        assert store.dump() == once
        flags = store.conn.execute("SELECT gpu_index, check_id, status FROM gpu_flags").fetchall()
        assert [tuple(f) for f in flags] == [(2, "gpu_health.ecc", "fail")]
        assert store.conn.execute("SELECT COUNT(*) FROM counters WHERE phase = 'after'").fetchone()[0] == 8 * 14


def _two_runs(reports: Path) -> None:
    """r1 and r2 as a playbook makes them: each host document recorded as it arrives, then the report."""
    r1 = {f"n{i}": node_doc(f"n{i}", i, read_at=R1, started=R1[0]) for i in range(3)}
    r1["n2"]["results"].append(ecc_failure(gpus_of(2)[1]))
    r2 = {
        f"n{i}": node_doc(
            f"n{i}", i, read_at=R2, started=R2[0], factors={("hbm_copy_gbps", 0): 0.9} if i == 1 else None
        )
        for i in range(3)
    }
    for run_id, docs, at in (("r1", r1, R1), ("r2", r2, R2)):
        run_dir = write_run(reports, run_id, {}, started=at[0])
        (run_dir / "run.json").write_text(
            json.dumps({"run_id": run_id, "started": at[0], "hosts": sorted(docs), "attempts": []})
        )
        if run_id == "r2":
            measured_twice(run_dir, docs)  # each node's figures measured twice against r1, the baseline
        for host, doc in docs.items():
            done = document_writer.record(run_dir, host, doc)
            with Store(reports / "gpufleet.db") as store:
                raw = Path(done["path"]).read_bytes()
                store.index_document(run_id, host, schema.parse_host_doc(raw)[0], path=f"hosts/{host}.json", raw=raw)
        report.build(run_dir)
        if run_id == "r1":
            with Store(reports / "gpufleet.db") as store:
                store.set_baseline("r1")


def test_rebuild_equals_incremental(tmp_path):
    reports = tmp_path / "reports"
    _two_runs(reports)
    with Store(reports / "gpufleet.db") as incremental, Store(tmp_path / "rebuilt.db") as rebuilt:
        (tmp_path / "baseline.json").write_text((reports / "baseline.json").read_text())  # beside the other store
        summary = rebuilt.rebuild(reports)
        assert summary["runs"] == ["r1", "r2"] and summary["baseline"] == "r1"
        a, b = incremental.dump(), rebuilt.dump()
        for table in a:
            assert a[table] == b[table], table
        # Every fleet result of both runs' report.json is in the store, one for each check fleet.json names.
        fleet_results = sum(
            1
            for run_id in ("r1", "r2")
            for node in json.loads((reports / run_id / "report.json").read_text())["nodes"].values()
            for r in node["results"]
            if r["group"] == "fleet"
        )
        assert fleet_results == sum(
            len(node["fleet_checks"])
            for run_id in ("r1", "r2")
            for node in json.loads((reports / run_id / "fleet.json").read_text())["nodes"].values()
        )
        assert fleet_results >= 6 * 8
        assert (
            incremental.conn.execute("SELECT COUNT(*) FROM results WHERE group_name = 'fleet'").fetchone()[0]
            == fleet_results
        )


def test_rebuild_records_a_corrupt_and_a_missing_document_and_keeps_the_run(tmp_path):
    reports = tmp_path / "reports"
    run = write_run(reports, "r1", {"n0": node_doc("n0", 0), "n1": node_doc("n1", 1)})
    (run / "hosts" / "n1.json").write_text('{"schema_version": 1, "host": "n1", "results": [')  # cut short
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(info, hosts=["n0", "n1", "n2"])))
    old = write_run(reports, "r0", {"n0": node_doc("n0", 0, started="2026-11-01T10:00:00Z")})
    (old / "run.json").unlink()  # a run from before run records
    with Store(reports / "gpufleet.db") as store:
        summary = store.rebuild(reports)
        assert summary["runs"] == ["r0", "r1"]
        assert summary["missing"] == [{"run_id": "r1", "host": "n2"}]
        assert summary["unreadable"][0]["host"] == "n1" and "not valid JSON" in summary["unreadable"][0]["reason"]
        docs = {d["host"]: d for d in store.documents("r1")}
        assert docs["n0"]["ok"] == 1 and docs["n1"]["ok"] == 0 and docs["n2"]["ok"] == 0
        assert "hosts/n1.json is unreadable: not valid JSON" in docs["n1"]["reason"] and docs["n1"]["sha256"]
        assert "never reported" in docs["n2"]["reason"]
        assert store.run("r0")["started"] == "2026-11-01T10:00:00Z"  # derived from its document
        hist = store.history("n1")
        assert hist["runs"][0]["verdict"] == "error" and "not valid JSON" in hist["runs"][0]["document"]


def test_a_file_that_is_not_a_store_is_refused(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("not a database at all, but long enough to have a header " * 20)
    with pytest.raises(InputError, match=r"notes.db is not a gpufleet store"):
        Store(text)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match=r"an SQLite database but not a gpufleet store .*users"):
        Store(other)
    newer = tmp_path / "newer.db"
    Store(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE gpufleet_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="schema version 99"):
        Store(newer)
    with pytest.raises(InputError, match="does not exist"):
        Store(tmp_path / "missing.db", create=False)


def test_history_of_a_node_a_gpu_and_a_serial(tmp_path):
    reports = tmp_path / "reports"
    _two_runs(reports)
    gpu = gpus_of(2)[1]
    with Store(reports / "gpufleet.db") as store:
        node = store.history("n1")
        assert [r["run_id"] for r in node["runs"]] == ["r1", "r2"] and node["baseline"] == "r1"
        assert (
            node["runs"][1]["metrics"]["hbm_copy_gbps"]["value"]
            < node["runs"][0]["metrics"]["hbm_copy_gbps"]["value"] * 0.92
        )
        assert ("fleet.node_vs_baseline", "warn") in {(x["check"], x["status"]) for x in node["runs"][1]["not_passing"]}
        by_uuid, by_serial = store.history(gpu["uuid"]), store.history(gpu["serial"])
        assert by_uuid["kind"] == "gpu" and by_serial["kind"] == "serial"
        assert [r["run_id"] for r in by_uuid["runs"]] == ["r1", "r2"]
        assert {"check_id": "gpu_health.ecc", "status": "fail"}.items() <= by_uuid["runs"][0]["flags"][0].items()
        text = history_text.history_text(by_uuid)
        assert "r1 *" in text and "gpu_health.ecc fail" in text and "n2" in text
        # The GPU failed in r1 and was back in r2 in the same node: said, with where and when.
        back = store.gpu_failures(gpu["uuid"], gpu["serial"], "r2")
        assert back[0]["run_id"] == "r1" and back[0]["accepted_since"] is None


def test_a_renamed_run_folder_keeps_the_run_id_run_json_holds(tmp_path):
    """The run id is read from run.json everywhere: the report, the store, a recorded document, a resume plan."""
    from gpufleet.base import runs
    from gpufleet.runner import record as runner_record, resume

    reports = tmp_path / "reports"
    first = write_run(reports, "first-id", {"node0": node_doc("node0", 0, read_at=R1)})
    run_dir = first.rename(reports / "renamed")
    assert runs.run_id_of(run_dir) == "first-id"
    summary = report.build(run_dir)
    assert summary["run_id"] == "first-id"
    assert json.loads((run_dir / "report.json").read_text())["run_id"] == "first-id"
    with Store(reports / "gpufleet.db") as store:
        assert [r[0] for r in store.conn.execute("SELECT run_id FROM runs")] == ["first-id"]
        assert store.conn.execute("SELECT COUNT(*) FROM documents WHERE run_id = 'renamed'").fetchone()[0] == 0
    done = document_writer.record(run_dir, "node1", node_doc("node1", 1, read_at=R1))
    assert done["run_id"] == "first-id"
    assert resume.plan(runner_record.load_run_folder(run_dir)).run_id == "first-id"
    # A folder without run.json (a run from before run records) is known by its name.
    (run_dir / "run.json").unlink()
    assert runs.run_id_of(run_dir) == "renamed"


def test_a_run_started_without_an_id_gets_one_minted_and_recorded(tmp_path):
    from gpufleet.base import runs

    started = runs.start(str(tmp_path), None, playbook="validate", hosts=["node0"])
    run_dir = Path(started["run_dir"])
    assert run_dir.name == started["run_id"] and len(started["run_id"]) == len("20261121T100000Z")
    assert runs.read_run(run_dir)["run_id"] == runs.run_id_of(run_dir) == started["run_id"]
