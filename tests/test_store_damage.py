"""The store comes back from any damage: random bytes over the middle of gpufleet.db, a file that is no database,
a table gone, a page that fails SQLite's own check. The next run moves it aside, rebuilds it from the run folders,
restores the baseline from baseline.json and names the repair in its report; `gpufleet store rebuild` does the
same and never crashes; history says what is wrong instead of a traceback. A full disk gets a message and exit 2."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import cli_cells
import file_faults
from gpufleet.base import layout
from gpufleet.commands.main import main as cli_main
from test_fleet_cli import _run
from test_fleet_synthetic import node_doc, write_run

R1, R2 = "2026-11-20T10:00:00Z", "2026-11-21T10:00:00Z"


def _settled_store(reports: Path, capsys=None) -> Path:
    """r0 and r1 reported, r1 the baseline, every page of the store in its main file (no -wal)."""
    from gpufleet.commands import main as cli

    for run_id, started in (("r0", "2026-11-19T10:00:00Z"), ("r1", R1)):
        run = write_run(reports, run_id, {f"n{i}": node_doc(f"n{i}", i, started=started) for i in range(3)})
        assert cli.main(["report", str(run)] + (["--set-baseline"] if run_id == "r1" else [])) == 0
    db = reports / "gpufleet.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")  # no -wal or -shm left to replay over the damage
    conn.close()
    if capsys is not None:
        capsys.readouterr()  # the reports' own lines
    return db


def _index_page(db: Path, index: str) -> int:
    conn = sqlite3.connect(db)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    return (root - 1) * size + size


def damage(db: Path, how: str) -> None:
    if how == "random bytes over the middle":
        raw = bytearray(db.read_bytes())
        rnd, mid = random.Random(32), len(raw) // 2
        raw[mid - 4096 : mid + 4096] = bytes(rnd.randrange(256) for _ in range(8192))
        db.write_bytes(bytes(raw))
    elif how == "random bytes over the last pages":
        raw = bytearray(db.read_bytes())
        rnd = random.Random(5)
        raw[-3 * 4096 :] = bytes(rnd.randrange(256) for _ in range(3 * 4096))
        db.write_bytes(bytes(raw))
    elif how == "emptied":  # `: > gpufleet.db`
        db.write_bytes(b"")
    elif how == "not a database":
        db.write_bytes(b"\x00\xffnot sqlite at all\x00" * 1000)
    elif how == "missing table":
        conn = sqlite3.connect(db)
        conn.execute("DROP TABLE metrics")
        conn.commit()
        conn.close()
    elif how == "failed integrity check":
        # Bytes flipped in the cells of an index page: the file opens, its tables read, SQLite's check fails.
        raw = bytearray(db.read_bytes())
        end = _index_page(db, "metrics_uuid")
        for i in range(end - 200, end - 100):
            raw[i] ^= 0x55
        db.write_bytes(bytes(raw))
    conn = None
    if how not in ("not a database", "emptied"):  # the damage is there: the store's own check says so
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA quick_check").fetchall() != [("ok",)] or how == "missing table"
        except sqlite3.DatabaseError:
            pass
        finally:
            conn.close()


DAMAGE = [
    "random bytes over the middle",
    "random bytes over the last pages",
    "emptied",
    "not a database",
    "missing table",
    "failed integrity check",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_the_next_run_moves_a_damaged_store_aside_and_rebuilds_it(capsys, monkeypatch, tmp_path, how):
    reports = tmp_path / "reports"
    db = _settled_store(reports, capsys)
    damage(db, how)
    damaged = db.read_bytes()
    # history does not crash: it names the store and what is wrong with it, exit 2 (or answers, where the damage
    # lies outside what it reads)
    rc, out, err = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports))
    assert rc in (0, 2) and "Traceback" not in err, err
    if rc == 2:
        assert f"{db} is not a gpufleet store" in err and "gpufleet store rebuild" in err, err
    # The next run as the playbook makes it: documents recorded as they come, then the report.
    r2 = write_run(reports, "r2", {}, started=R2)
    for i in range(3):
        rc, out, err = _run(
            capsys, monkeypatch, "record", str(r2), f"n{i}", stdin=json.dumps(node_doc(f"n{i}", i, started=R2)).encode()
        )
        assert rc == 0 and json.loads(out)["store"] == str(db), err
    rc, out, err = _run(capsys, monkeypatch, "report", str(r2), "--json")
    summary = json.loads(out)
    assert summary["store"] == str(db) and summary["baseline"] == "r1", summary  # judged against the baseline
    [problem] = summary["store_problems"]
    [aside] = sorted(reports.glob("gpufleet.db.damaged-*"))
    # Kept, not lost: whole (a page written before the damage was met may differ), or byte for byte when SQLite could
    # not open it at all.
    assert aside.stat().st_size >= len(damaged) and (how != "not a database" or aside.read_bytes() == damaged)
    assert f"{db} was not a gpufleet store" in problem and f"moved aside to {aside}" in problem, problem
    assert "baseline r1 restored from baseline.json" in problem and "3 run(s) re-indexed" in problem, problem
    assert "Store problem during this run:" in (r2 / "report.md").read_text()
    # The history is whole: every run, this one indexed too, with its verdict.
    rc, out, err = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")
    assert rc == 0, err
    assert [(r["run_id"], r["verdict"]) for r in json.loads(out)["runs"]] == [
        ("r0", "pass"),
        ("r1", "pass"),
        ("r2", "pass"),
    ]


@pytest.mark.parametrize("how", DAMAGE)
def test_store_rebuild_moves_any_damaged_store_aside(capsys, monkeypatch, tmp_path, how):
    reports = tmp_path / "reports"
    db = _settled_store(reports, capsys)
    damage(db, how)
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    [aside] = sorted(reports.glob("gpufleet.db.damaged-*"))
    assert summary["repair"]["what"] == "damaged" and summary["repair"]["moved_aside"] == str(aside)
    assert summary["runs"] == ["r0", "r1"] and summary["baseline"] == "r1"
    rc, out, err = _run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")
    assert rc == 0 and json.loads(out)["baseline"] == "r1", err


@pytest.mark.parametrize("how", [d for d in DAMAGE if d != "failed integrity check"])
def test_the_references_of_the_next_run_repair_a_damaged_store(capsys, monkeypatch, tmp_path, how):
    """`gpufleet references`, the first use of the store in a run (before the nodes' stage), meets the damage on
    opening or while reading, repairs the store as the run's records would, and hands the baseline on. (An index
    that fails SQLite's check, which it does not read, is found by the report's check of every page, above.)"""
    reports = tmp_path / "reports"
    db = _settled_store(reports, capsys)
    damage(db, how)
    r2 = write_run(reports, "r2", {f"n{i}": node_doc(f"n{i}", i, started=R2) for i in range(3)}, started=R2)
    rc, out, err = _run(capsys, monkeypatch, "references", str(r2), "--host", "n0", "--host", "n1")
    assert rc == 0 and "Traceback" not in err, err
    done = json.loads(out)
    assert done["baseline"] == "r1" and done["note"] is None and done["hosts"] == 2, done
    [aside] = sorted(reports.glob("gpufleet.db.damaged-*"))
    assert aside.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["ladder", "{reports}/r1"],
        ["evidence", "n0", "--reports-dir", "{reports}", "--out", "{tmp}/n0.tar.gz"],
    ],
    ids=["ladder", "evidence"],
)
def test_the_store_readers_name_a_damaged_store_and_the_repair(capsys, monkeypatch, tmp_path, argv):
    """Random bytes over the store's last pages, which these commands read: each ends with exit 2 and one line
    naming the store and `gpufleet store rebuild`, as history and baseline do; a run repairs it on its own (above),
    these only read."""
    reports = tmp_path / "reports"
    db = _settled_store(reports, capsys)
    damage(db, "random bytes over the last pages")
    rc, out, err = _run(capsys, monkeypatch, *(a.format(reports=reports, tmp=tmp_path) for a in argv))
    assert rc == 2 and "Traceback" not in err, err
    [line] = err.splitlines()
    assert line.startswith(f"gpufleet {argv[0]}: {db} is not a gpufleet store") and "gpufleet store rebuild" in line
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports))
    assert rc == 0, err
    rc, out, err = _run(capsys, monkeypatch, *(a.format(reports=reports, tmp=tmp_path) for a in argv))
    assert rc in (0, 1) and "is not a gpufleet store" not in err, err  # 1: the ladder's own verdict


@contextlib.contextmanager
def tiny_filesystem(folder: Path, size: str):
    """folder (made) as a tmpfs of `size` of its own, for the test's life; skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tiny filesystem")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "gpufleet-full", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def fill(ballast: Path) -> None:
    """Every block of ballast's file system taken."""
    with open(ballast, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass


def test_a_full_disk_is_said_with_exit_2(tmp_path):
    with tiny_filesystem(tmp_path / "full", "2m") as full:
        reports = full / "reports"
        _settled_store(reports)
        fill(full / "ballast")
        for argv in (["store", "rebuild"], ["history", "n0"]):
            done = subprocess.run(
                [sys.executable, "-m", "gpufleet", *argv, "--reports-dir", str(reports)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if argv[0] == "history" and done.returncode == 0:
                continue  # reading needs no room where its -shm fits
            assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr)
            assert f"the file system of {reports} is full" in done.stderr, (argv, done.stderr)
        # Nothing was lost: the store is still the one the runs made.
        conn = sqlite3.connect(reports / "gpufleet.db")
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
        conn.close()


@pytest.fixture(scope="module")
def every_file_and_later(every_file) -> Path:
    """every_file (conftest.py), and a later run of eight nodes, whose rows fill the store's last pages (the ladder of
    r1 reads none of them); the store checkpointed."""
    base = every_file
    later = write_run(base / "reports", "r2", {f"m{i}": node_doc(f"m{i}", i, started=R2) for i in range(8)})
    assert cli_main(["report", str(later)]) == 0
    conn = sqlite3.connect(base / "reports" / "gpufleet.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file, in WAL mode as a store always is
    conn.close()
    return base


# The commands that only read the store: they say the damage where they meet it, and answer where it lies outside
# what they read (docs/faults.md). Every other command that refuses a damaged store writes to it, and checks every
# page first.
READS_ONLY = ("history", "baseline show", "evidence")


@pytest.mark.parametrize(
    "command", [c for c, verb in layout.FILES[0].uses.items() if verb == layout.REFUSES], ids=lambda c: c
)
def test_a_command_that_refuses_a_damaged_store_writes_nothing_into_it(every_file_and_later, tmp_path, command):
    """Random bytes over the store's last pages: every command that writes to the store and refuses a damaged one
    (ladder, ladder --clear, slurm, baseline set and clear, slurm sweep --collect) ends with exit 2 and one line naming
    the store and `gpufleet store rebuild`; the store's file is byte for byte as it was after every such command."""
    assert layout.FILES[0].name == "gpufleet.db"
    base = tmp_path / "base"
    shutil.copytree(every_file_and_later, base, symlinks=True)
    db = base / "reports" / "gpufleet.db"
    damage(db, "random bytes over the last pages")
    damaged = db.read_bytes()
    done = cli_cells.run(
        file_faults.argv(command, base),
        cwd=file_faults.REPO,
        folder=tmp_path / "io",
        stdin=file_faults.stdin_of(command),
    )
    assert done.rc in ((0, 2) if command in READS_ONLY else (2,)) and "Traceback" not in done.err, done
    if done.rc == 2:
        [line] = done.err.splitlines()
        assert f"{db} is not a gpufleet store" in line and "gpufleet store rebuild" in line, line
    assert db.read_bytes() == damaged, "written into the damaged store"
