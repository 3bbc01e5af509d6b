"""gpufleet record | history | baseline | store, and report's store and baseline options: what they write and
print, and the messages bad input gets."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.commands import main as cli
from gpufleet.base import schema

from test_fleet_synthetic import measured_twice, gpus_of, node_doc, write_run

R1 = ("2026-11-20T10:00:00Z", "2026-11-20T10:15:00Z")


def _run(capsys, monkeypatch, *argv, stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _doc(group: str, check: str, host: str = "n0") -> dict:
    res = dict(
        schema.result(check, schema.PASS, f"{check} ran", group=group), started="2026-11-20T10:00:00Z", seconds=0.1
    )
    return {
        "schema_version": 1,
        "host": host,
        "engine_version": "0.1.0",
        "profile": {"name": "h100-sxm"},
        "versions": {},
        "started": "2026-11-20T10:00:00Z",
        "seconds": 1.0,
        "results": [res],
    }


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "reports" / "r1"
    (run / "hosts").mkdir(parents=True)
    return run


def test_record_writes_whole_or_merges_groups_and_indexes(capsys, monkeypatch, run_dir):
    rc, out, _ = _run(
        capsys, monkeypatch, "record", str(run_dir), "n0", stdin=json.dumps(node_doc("n0", 0, read_at=R1)).encode()
    )
    assert rc == 0
    first = json.loads(out)
    assert first["store"] == str(run_dir.parent / "gpufleet.db") and first["unreadable_kept"] is None
    assert oct(os.stat(first["path"]).st_mode & 0o777) == "0o640"
    add = ["record", str(run_dir), "n0", "--replace-group", "benchmark_multinode"]
    rc, out, _ = _run(
        capsys, monkeypatch, *add, stdin=json.dumps(_doc("benchmark_multinode", "nccl_all_reduce")).encode()
    )
    assert rc == 0 and json.loads(out)["replaced_groups"] == ["benchmark_multinode"]
    # Again: the group's earlier results are replaced, not added twice; the others are kept.
    _run(capsys, monkeypatch, *add, stdin=json.dumps(_doc("benchmark_multinode", "train_gpt2")).encode())
    doc = json.loads((run_dir / "hosts" / "n0.json").read_text())
    assert [r["check"] for r in doc["results"] if r["group"] == "benchmark_multinode"] == ["train_gpt2"]
    assert {"matmul_bf16", "snapshot_before", "snapshot_after"} <= {r["check"] for r in doc["results"]}
    rc, out, _ = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(run_dir.parent), "--json")
    assert rc == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == ["r1"]
    assert json.loads(out)["runs"][0]["metrics"]["matmul_bf16_tflops"]["value"] > 800
    # Without --replace-group the document is written whole: the node stage ran again.
    _run(
        capsys, monkeypatch, "record", str(run_dir), "n0", stdin=json.dumps(_doc("gpu_inventory", "gpu_count")).encode()
    )
    assert [r["check"] for r in json.loads((run_dir / "hosts" / "n0.json").read_text())["results"]] == ["gpu_count"]
    # A peer that only joined the run across nodes: peers/, indexed as a peer.
    rc, out, _ = _run(
        capsys,
        monkeypatch,
        "record",
        str(run_dir),
        "p0",
        "--folder",
        "peers",
        stdin=json.dumps(_doc("benchmark_multinode", "nccl_all_reduce", host="p0")).encode(),
    )
    assert json.loads(out)["path"] == str(run_dir / "peers" / "p0.json")
    from gpufleet.fleet.store import Store

    with Store(run_dir.parent / "gpufleet.db") as store:
        assert {d["host"]: d["role"] for d in store.documents("r1")} == {"n0": "node", "p0": "peer"}


def test_record_keeps_an_unreadable_document_aside(capsys, monkeypatch, run_dir):
    (run_dir / "hosts" / "n0.json").write_text("{truncated")
    rc, out, _ = _run(
        capsys,
        monkeypatch,
        "record",
        str(run_dir),
        "n0",
        "--no-store",
        stdin=json.dumps(_doc("benchmark_multinode", "nccl_all_reduce")).encode(),
    )
    assert rc == 0 and json.loads(out)["store"] is None
    assert (run_dir / "hosts" / "n0.json.unreadable").read_text() == "{truncated"
    doc = json.loads((run_dir / "hosts" / "n0.json").read_text())
    err = next(r for r in doc["results"] if r["check"] == "results_file")
    assert (
        err["status"] == "error" and "hosts/n0.json.unreadable" in err["reason"] and "not valid JSON" in err["reason"]
    )


def test_record_writes_the_document_even_when_the_store_cannot_take_it(capsys, monkeypatch, run_dir):
    db = run_dir.parent / "gpufleet.db"
    conn = sqlite3.connect(db)  # a store a newer gpufleet wrote: not damage, never moved aside
    conn.executescript(
        "CREATE TABLE gpufleet_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO gpufleet_meta VALUES ('application', 'gpufleet'), ('schema_version', '99');"
    )
    conn.close()
    rc, out, err = _run(capsys, monkeypatch, "record", str(run_dir), "n0", stdin=json.dumps(node_doc("n0", 0)).encode())
    assert rc == 0 and json.loads(out)["store"] is None
    assert "is written, but indexing it into" in json.loads(out)["store_error"] and "schema version 99" in err
    assert json.loads((run_dir / "hosts" / "n0.json").read_text())["host"] == "n0"


def test_a_folder_where_the_store_should_be_is_moved_aside_and_the_document_indexed(capsys, monkeypatch, run_dir):
    (run_dir.parent / "gpufleet.db").mkdir()
    (run_dir.parent / "gpufleet.db" / "kept.txt").write_text("whatever it held")
    rc, out, err = _run(capsys, monkeypatch, "record", str(run_dir), "n0", stdin=json.dumps(node_doc("n0", 0)).encode())
    assert rc == 0 and json.loads(out)["store"] == str(run_dir.parent / "gpufleet.db"), err
    [aside] = run_dir.parent.glob("gpufleet.db.damaged-*")
    assert (aside / "kept.txt").read_text() == "whatever it held"


@pytest.mark.parametrize(
    "argv,stdin,message",
    [
        (["record", "{run}", "n0"], b"[1, 2]", "stdin: the host document for n0 is unreadable: expected a JSON object"),
        (["record", "{run}", "../n0"], None, "the host name '../n0' is not a plain name"),
        (["record", "{run}/nope", "n0"], None, "run directory .*nope does not exist"),
        (["history", "n0", "--reports-dir", "{run}"], None, "store .*gpufleet.db does not exist"),
        (["baseline", "set", "r9", "--reports-dir", "{reports}"], None, "run 'r9' is not in the store"),
        (["store", "rebuild", "--reports-dir", "{run}/missing"], None, "reports directory .*missing does not exist"),
        (["report", "{run}", "--slurm-name", "n0"], None, "--slurm-name 'n0': expected HOST=SLURM_NAME"),
    ],
)
def test_bad_input_is_named(capsys, monkeypatch, run_dir, argv, stdin, message):
    import re

    (run_dir / "hosts" / "n0.json").write_text(json.dumps(node_doc("n0", 0)))
    if "baseline" in argv:
        from gpufleet.fleet.store import Store

        Store(run_dir.parent / "gpufleet.db").close()
    argv = [a.format(run=run_dir, reports=run_dir.parent) for a in argv]
    rc, _, err = _run(
        capsys, monkeypatch, *argv, stdin=stdin if stdin is not None else json.dumps(_doc("x", "y")).encode()
    )
    assert rc == 2 and re.search(message, err), err


def test_baseline_set_show_clear_and_rebuild(capsys, monkeypatch, tmp_path):
    reports = tmp_path / "reports"
    write_run(reports, "r1", {"n0": node_doc("n0", 0, started=R1[0])})
    rc, out, _ = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports))
    assert rc == 0 and "1 run(s)" in out
    rc, out, _ = _run(capsys, monkeypatch, "baseline", "set", "r1", "--reports-dir", str(reports))
    assert rc == 0 and out.startswith("baseline: run r1, set ") and "not reported" in out  # no report made yet
    assert json.loads((reports / "baseline.json").read_text())["run_id"] == "r1"
    rc, out, _ = _run(capsys, monkeypatch, "baseline", "show", "--reports-dir", str(reports), "--json")
    assert json.loads(out)["run_id"] == "r1" and json.loads(out)["nodes"] == {"n0": "pass"}
    # The store is an index: removed and rebuilt, it still knows the baseline.
    for suffix in ("", "-wal", "-shm"):
        Path(f"{reports / 'gpufleet.db'}{suffix}").unlink(missing_ok=True)
    rc, out, _ = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports))
    assert "baseline: r1" in out
    rc, out, _ = _run(capsys, monkeypatch, "baseline", "clear", "--reports-dir", str(reports))
    assert out.strip() == "baseline cleared (was run r1)" and not (reports / "baseline.json").exists()
    rc, out, _ = _run(capsys, monkeypatch, "baseline", "show", "--reports-dir", str(reports))
    assert out.startswith("no baseline set")


def test_report_compares_with_a_given_baseline_and_maps_slurm_names(capsys, monkeypatch, tmp_path):
    reports = tmp_path / "reports"
    r1 = write_run(reports, "r1", {f"n{i}": node_doc(f"n{i}", i, started=R1[0]) for i in range(3)})
    assert _run(capsys, monkeypatch, "report", str(r1))[0] == 0
    bad = node_doc("n1", 1, factors={("pcie_h2d_gbps", g): 0.5 for g in range(8)})
    bad["results"].append(
        dict(
            schema.result(
                "pcie_link",
                schema.FAIL,
                "GPU 0 at x8",
                group="gpu_health",
                detail={"flagged_gpus": [{"index": 0, "uuid": gpus_of(1)[0]["uuid"], "serial": None}]},
            )
        )
    )
    docs = {"n0": node_doc("n0", 0), "n1": bad, "n2": node_doc("n2", 2)}
    r2 = write_run(reports, "r2", docs)
    measured_twice(r2, docs, baseline="r1")  # n1's slow PCIe copies past the baseline's twice, on the node
    rc, out, _ = _run(
        capsys, monkeypatch, "report", str(r2), "--baseline", "r1", "--slurm-name", "n1=gpu-a[07]", "--json"
    )
    summary = json.loads(out)
    assert rc == 1 and summary["baseline"] == "r1"
    # What only this run's fleet shows (node_vs_fleet) is inconclusive: no drain reason.
    assert summary["drain"] == [
        "scontrol update 'NodeName=gpu-a[07]' State=DRAIN Reason=\"gpufleet: r2: hardware: gpu_health.pcie_link, "
        'fleet.node_vs_baseline, fleet.node_vs_baseline_fleet"'
    ]
    assert "fleet.node_vs_baseline" in summary["nodes"]["n1"]["failed_checks"]  # 50% under: past the 15% fail threshold
    assert (r2 / "drain.txt").read_text().splitlines()[1] == summary["drain"][0]
    rc, out, _ = _run(capsys, monkeypatch, "report", str(r2), "--no-store")
    assert "no store: the report was made with --no-store" in out


def test_record_reads_stdin_as_a_command(tmp_path):
    """The command as the playbook runs it: a host document piped in, a JSON line out."""
    run = tmp_path / "reports" / "r1"
    (run / "hosts").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "record", str(run), "n0"],
        input=json.dumps(node_doc("n0", 0)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"] == len(node_doc("n0", 0)["results"])


# ---------------------------------------------------------------- a damaged, foreign or missing store


def _reported_run_with_baseline(capsys, monkeypatch, reports: Path) -> None:
    """r1 reported and made the baseline, as a run with gpufleet_baseline_set leaves it."""
    r1 = write_run(reports, "r1", {f"n{i}": node_doc(f"n{i}", i, started=R1[0]) for i in range(2)})
    assert _run(capsys, monkeypatch, "report", str(r1), "--set-baseline")[0] == 0
    assert json.loads((reports / "baseline.json").read_text())["run_id"] == "r1"


def _aside(reports: Path) -> list[Path]:
    return sorted(p for p in reports.iterdir() if p.name.startswith("gpufleet.db.damaged-"))


def test_store_rebuild_moves_a_damaged_store_aside_and_brings_the_baseline_back(capsys, monkeypatch, tmp_path):
    reports = tmp_path / "reports"
    _reported_run_with_baseline(capsys, monkeypatch, reports)
    garbage = b"garbage written over the store " * 200
    (reports / "gpufleet.db").write_bytes(garbage)
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports))
    assert rc == 0, err
    [aside] = _aside(reports)
    assert aside.read_bytes() == garbage  # kept, not lost
    assert f"moved aside: {aside} (not a gpufleet store: file is not a database)" in out and "baseline: r1" in out
    rc, out, _ = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")
    hist = json.loads(out)
    assert (
        [r["run_id"] for r in hist["runs"]] == ["r1"]
        and hist["runs"][0]["verdict"] == "pass"
        and hist["baseline"] == "r1"
    )


def test_store_rebuild_moves_a_foreign_sqlite_file_aside(capsys, monkeypatch, tmp_path):
    import sqlite3

    reports = tmp_path / "reports"
    write_run(reports, "r1", {"n0": node_doc("n0", 0, started=R1[0])})
    conn = sqlite3.connect(reports / "gpufleet.db")
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    rc, out, _ = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports), "--json")
    summary = json.loads(out)
    assert rc == 0 and summary["runs"] == ["r1"] and summary["repair"]["what"] == "damaged"
    assert "was not a gpufleet store (another SQLite database, tables users)" in summary["repair"]["note"]
    [aside] = _aside(reports)
    assert summary["repair"]["moved_aside"] == str(aside)
    assert sqlite3.connect(aside).execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]


@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_the_next_run_repairs_the_store_and_its_report_says_so(capsys, monkeypatch, tmp_path, damage):
    reports = tmp_path / "reports"
    _reported_run_with_baseline(capsys, monkeypatch, reports)
    db = reports / "gpufleet.db"
    if damage == "garbage":
        db.write_bytes(b"\x00garbage\xff" * 500)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    else:  # deleted the way an operator would: the file alone, its -wal and -shm left behind
        db.unlink()
    # The next run as the playbook makes it: the node documents recorded as they come, then the report.
    r2 = write_run(reports, "r2", {}, started="2026-11-21T10:00:00Z")
    for i in range(2):
        rc, out, err = _run(
            capsys, monkeypatch, "record", str(r2), f"n{i}", stdin=json.dumps(node_doc(f"n{i}", i)).encode()
        )
        assert rc == 0 and json.loads(out)["store"] == str(db), err
    rc, out, _ = _run(capsys, monkeypatch, "report", str(r2), "--json")
    summary = json.loads(out)
    assert summary["baseline"] == "r1" and summary["store"] == str(db)  # the baseline is back, not "no baseline set"
    [problem] = summary["store_problems"]
    assert "rebuilt by run r2" in problem and "2 run(s) re-indexed" in problem and "baseline r1 restored" in problem
    if damage == "garbage":
        [aside] = _aside(reports)
        assert f"{db} was not a gpufleet store (file is not a database): moved aside to {aside}" in problem
    else:
        assert f"the store {db} did not exist" in problem and not _aside(reports)
    rep = json.loads((r2 / "report.json").read_text())
    assert rep["fleet"]["store"] == str(db) and rep["fleet"]["baseline"]["run_id"] == "r1"
    assert rep["fleet"]["store_problems"] == [problem]
    assert json.loads((r2 / "fleet.json").read_text())["store_problems"] == [problem]
    md = (r2 / "report.md").read_text()
    assert (
        f"store {db}" in md
        and "baseline run r1" in md
        and "Store problem during this run:" in md
        and "rebuilt by run r2" in md
    )
    assert "Store problem during this run:" in (r2 / "report.html").read_text()
    # The history is whole again: both runs, with their verdicts.
    rc, out, _ = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")
    assert [(r["run_id"], r["verdict"]) for r in json.loads(out)["runs"]] == [("r1", "pass"), ("r2", "pass")]
    # A later run on the sound store has nothing to report about it.
    r3 = write_run(reports, "r3", {"n0": node_doc("n0", 0)}, started="2099-01-01T00:00:00Z")
    rc, out, _ = _run(capsys, monkeypatch, "report", str(r3), "--json")
    assert json.loads(out)["store_problems"] == [] and json.loads(out)["baseline"] == "r1"


def test_the_first_run_of_a_reports_folder_has_no_store_problem(capsys, monkeypatch, tmp_path):
    r1 = write_run(tmp_path / "reports", "r1", {}, started=R1[0])
    rc, out, _ = _run(capsys, monkeypatch, "record", str(r1), "n0", stdin=json.dumps(node_doc("n0", 0)).encode())
    rc, out, _ = _run(capsys, monkeypatch, "report", str(r1), "--json")
    assert rc == 0 and json.loads(out)["store_problems"] == [] and json.loads(out)["baseline"] is None


@pytest.mark.slow
def test_concurrent_records_repair_a_damaged_store_once(tmp_path):
    """A run's nodes report at once: one `record` moves the damaged store aside and rebuilds it, the others use it."""
    from gpufleet.fleet.store import Store

    reports = tmp_path / "reports"
    write_run(reports, "r1", {"n0": node_doc("n0", 0, started=R1[0])})
    (reports / "gpufleet.db").write_bytes(b"not a store " * 400)
    r2 = write_run(reports, "r2", {}, started="2026-11-21T10:00:00Z")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "record", str(r2), f"n{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    for i, proc in enumerate(procs):
        out, err = proc.communicate(json.dumps(node_doc(f"n{i}", i)), timeout=120)
        assert proc.returncode == 0 and json.loads(out)["store"] == str(reports / "gpufleet.db"), err
    assert len(_aside(reports)) == 1
    with Store(reports / "gpufleet.db") as store:
        assert {d["host"] for d in store.documents("r2") if d["ok"]} == {f"n{i}" for i in range(6)}
        assert store.run("r1") and len(store.repairs_since(None)) == 1
