"""Damaged files in a reports folder or on a node: each is named with what to do, exit 2 and one line, never a
traceback, and what can be kept is kept (the other runs, the baseline, the node).

- run.json of an old run overwritten with random bytes: later runs in that reports folder go on; `gpufleet report`
  on that run names the file;
- report.json of another shape: `gpufleet slurm RUN_DIR` and `gpufleet ladder RUN_DIR` name it;
- a node lock of bytes that are no UTF-8 text: taken over as an empty or garbled one is, the node measured;
- baseline.json naming no run of the folder, a path, or garbage: `store rebuild` says so and does not take it;
- a symbolic link planted at reports/<run-id>: refused before anything is written through it.
(The store's own damage, emptied or random bytes over its pages: tests/test_store_damage.py.)

The fleet runs are real runs of validate.yml through ansible-runner on this machine (inventory/local, no GPU: the
node is measured and not accepted, exit 1).
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import cli_cells
from gpufleet.base import layout
from playbooks import playbook_env, run_playbook
from test_fleet_cli import _run
from test_fleet_synthetic import ecc_failure, gpus_of, node_doc, write_run

pytest.importorskip("ansible_runner")

from test_exit_cases import fleet_run  # noqa: E402  (after the skip: it needs ansible-runner too)

REPO = Path(__file__).resolve().parents[1]
NOT_UTF8 = b"\xff\xfe\x00" + bytes(random.Random(40).randrange(256) for _ in range(297))


def gpufleet(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def one_line(done: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints on stderr (exit 2), never a traceback."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-3000:])
    [line] = done.stderr.splitlines()
    return line


@pytest.mark.slow
def test_an_old_run_json_of_random_bytes_stops_no_later_run_and_its_report_names_it(tmp_path):
    reports = tmp_path / "reports"
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "old", "-e", '{"gpufleet_benchmarks": []}')
    assert proc.returncode == 1, line
    (reports / "old" / "run.json").write_bytes(NOT_UTF8)
    # The next run in that reports folder runs, is reported, and reaches the history beside the old one.
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "new", "-e", '{"gpufleet_benchmarks": []}')
    assert proc.returncode == 1 and line["nodes"] == {"localhost": "not accepted"}, (line, proc.stderr[-3000:])
    assert (reports / "new" / "report.json").is_file()
    history = gpufleet("history", "localhost", "--reports-dir", str(reports), "--json")
    assert [r["run_id"] for r in json.loads(history.stdout)["runs"]] == ["old", "new"], history.stderr
    # The report of the damaged run: the file named, and what to do, before anything is written.
    reported = (reports / "old" / "report.json").stat().st_mtime_ns
    line = one_line(gpufleet("report", str(reports / "old")))
    assert (reports / "old" / "report.json").stat().st_mtime_ns == reported
    assert line.startswith(f"gpufleet report: {reports / 'old' / 'run.json'} is not UTF-8 text"), line
    assert "restore it, or move it aside" in line, line
    assert (reports / "old" / "run.json").read_bytes() == NOT_UTF8  # left as it was
    # Moved aside, the run is reported from its host documents, known by its folder's name.
    (reports / "old" / "run.json").rename(tmp_path / "old-run.json")
    done = gpufleet("report", str(reports / "old"), "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["run_id"] == "old", done.stderr[-3000:]


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b"{}",
        b'{"run_id": "r1", "nodes": {"n0": []}}',
        b'{"run_id": "r1", "nodes": {"n0": {"verdict": "fail"}}}',
        NOT_UTF8,
    ],
    ids=["list", "empty object", "node not an object", "node without results", "random bytes"],
)
def test_a_report_json_of_another_shape_is_named_by_the_commands_that_act_on_it(capsys, monkeypatch, tmp_path, content):
    run = write_run(tmp_path / "reports", "r1", {"n0": node_doc("n0", 0)})
    assert _run(capsys, monkeypatch, "report", str(run))[0] == 0
    (run / "report.json").write_bytes(content)
    for argv in (["slurm", str(run), "--action", "drain", "--check"], ["ladder", str(run)]):
        rc, out, err = _run(capsys, monkeypatch, *argv)
        assert rc == 2, (argv, out, err)
        [line] = err.splitlines()
        assert line.startswith(f"gpufleet {argv[0]}: {run / 'report.json'} is not"), line
        assert f"make it with `gpufleet report {run}` first" in line, line


@pytest.mark.slow
def test_a_node_lock_of_bytes_that_are_no_text_is_taken_over_and_the_node_measured(tmp_path):
    (tmp_path / "node.lock").write_bytes(NOT_UTF8)
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "after", "-e", '{"gpufleet_benchmarks": []}')
    assert proc.returncode == 1 and line["nodes"] == {"localhost": "not accepted"}, (line, proc.stderr[-3000:])
    run = tmp_path / "reports" / "after"
    doc = json.loads((run / "hosts" / "localhost.json").read_text())
    [taken] = [r for r in doc["results"] if r.get("group") == "lock"]
    assert taken["status"] == "pass", taken
    assert "took over the stale lock" in taken["reason"] and "is not UTF-8 text" in taken["reason"], taken
    assert {r.get("group") for r in doc["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene"}  # measured
    # Not accepted for its own results (no GPU here), not for the lock: no drain line names it.
    assert "lock" not in (run / "drain.txt").read_text()
    assert not (tmp_path / "node.lock").exists()  # given back at the end


@pytest.mark.parametrize(
    "content, why",
    [
        (b'{"run_id": "nope"}', "names run 'nope', which is no run folder of"),
        (b'{"run_id": "../../etc"}', "its run_id '../../etc' is not a plain name"),
        (NOT_UTF8, "is not UTF-8 text"),
        (b'{"run_id": ', "is not valid JSON"),
        (b"[1]", "is not a baseline record"),
    ],
    ids=["no such run", "a path", "random bytes", "cut short", "a list"],
)
def test_store_rebuild_takes_only_a_baseline_of_the_folder_and_names_the_file_when_not(
    capsys, monkeypatch, tmp_path, content, why
):
    reports = tmp_path / "reports"
    for run_id in ("r0", "r1"):
        assert _run(capsys, monkeypatch, "report", str(write_run(reports, run_id, {"n0": node_doc("n0", 0)})))[0] == 0
    (reports / "gpufleet.db").unlink()  # nothing but the file to restore the baseline from
    (reports / "baseline.json").write_bytes(content)
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["runs"] == ["r0", "r1"] and summary["baseline"] is None, summary
    [warning] = err.splitlines()
    assert warning.startswith(f"gpufleet store: warning: {reports / 'baseline.json'} ") and why in warning, warning
    assert "gpufleet baseline set RUN_ID" in warning, warning
    # One that names a run of the folder is restored.
    (reports / "baseline.json").write_text('{"run_id": "r0", "set_at": "2026-11-20T10:00:00Z"}')
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports), "--json")
    assert rc == 0 and json.loads(out)["baseline"] == "r0" and not err, err


@pytest.mark.slow
def test_a_symbolic_link_planted_at_the_run_folder_is_refused_before_anything_is_written(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "planted").symlink_to(elsewhere)
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "planted")
    assert proc.returncode == 2 and line["status"] == "refused", line
    assert f"{tmp_path / 'reports' / 'planted'} is a symbolic link (to {elsewhere})" in line["message"], line
    assert "nothing was written through it" in line["message"], line
    assert not list(elsewhere.iterdir())  # no runner/, no settings, no artifacts
    # The playbook's own start refuses it the same way (`ansible-playbook validate.yml -e gpufleet_run_id=...`).
    line = one_line(gpufleet("run", "start", str(tmp_path / "reports"), "planted", "--host", "localhost"))
    assert "gpufleet_run_id 'planted'" in line and "is a symbolic link" in line, line
    assert not list(elsewhere.iterdir())


def _cell(tmp_path: Path, *argv: str) -> cli_cells.Cell:
    """The command in a process of its own, killed should it hang (the timeout bounds a hang, nothing waits on it)."""
    return cli_cells.run(list(argv), cwd=REPO, folder=tmp_path / f"io-{argv[0]}-{len(list(tmp_path.iterdir()))}")


def test_a_fifo_where_a_file_should_be_hangs_neither_the_report_nor_store_rebuild(capsys, monkeypatch, tmp_path):
    """A FIFO at the run.json of an old run that was never reported (its controller killed) and at baseline.json: the
    report of a later run, which indexes the old run too, and `store rebuild` end (the reader opens nothing it would
    wait on) and name both files; nothing is read from them, nothing waits."""
    reports = tmp_path / "reports"
    write_run(reports, "old", {"n0": node_doc("n0", 0)})
    new = write_run(reports, "new", {"n0": node_doc("n0", 0, started="2026-11-22T10:00:00Z")})
    for fifo in (reports / "old" / "run.json", reports / "baseline.json"):
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    done = _cell(tmp_path, "report", str(new), "--json")
    assert done.rc == 0 and "Traceback" not in done.err, done
    done = _cell(tmp_path, "store", "rebuild", "--reports-dir", str(reports), "--json")
    assert done.rc == 0 and "Traceback" not in done.err, done
    summary = json.loads(done.out)
    assert summary["runs"] == ["new", "old"], summary
    assert any(u["file"] == "run.json" and "is a FIFO (named pipe)" in u["reason"] for u in summary["unreadable"])
    assert f"{reports / 'baseline.json'} is a FIFO (named pipe), not a file" in done.err, done.err
    assert all(stat.S_ISFIFO(p.lstat().st_mode) for p in (reports / "old" / "run.json", reports / "baseline.json"))


@pytest.mark.slow
def test_fleet_run_beside_an_old_run_whose_files_are_fifos_is_measured_and_reported(tmp_path):
    """Every JSON file of an old run (layout.FILES) and baseline.json a FIFO: the next `gpufleet fleet run` in that
    reports folder starts, measures and reports (exit 1: no GPU here), without waiting on any of them."""
    reports = tmp_path / "reports"
    old = write_run(reports, "old", {"localhost": node_doc("localhost", 0)})
    assert gpufleet("report", str(old)).returncode == 0
    fifos = [reports / "baseline.json"] + [
        old / f.name.replace("<host>", "localhost")
        for f in layout.FILES
        if f.where == layout.RUN and f.form == layout.JSON
    ]
    for path in fifos:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", "new", "-e", '{"gpufleet_benchmarks": []}')
    assert proc.returncode == 1 and line["nodes"] == {"localhost": "not accepted"}, (line, proc.stderr[-3000:])
    assert (reports / "new" / "report.json").is_file()
    assert all(stat.S_ISFIFO(p.lstat().st_mode) for p in fifos)


@pytest.mark.parametrize("form", ["{}", "{}-wal", "{}.damaged-20261120T100000Z", "{}.bak"])
@pytest.mark.parametrize("name", layout.reserved_names())
def test_a_run_id_the_reports_folder_keeps_for_its_own_files_is_refused(tmp_path, name, form):
    """`gpufleet run start` (what validate.yml's run_prepare runs for gpufleet_run_id) refuses the names of the reports
    folder's own files and their forms, before anything is made; the file stays as it was."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / name).write_bytes(b"the folder's own file\n")
    run_id = form.format(name)
    done = _cell(tmp_path, "run", "start", str(reports), run_id, "--host", "n0", "--json")
    assert done.rc == 2, done
    [line] = done.err.splitlines()
    assert line.startswith(f"gpufleet run start: gpufleet_run_id {run_id!r} is a name the reports folder keeps"), line
    assert f"keeps for its own {name}" in line and "choose another run id" in line, line
    assert json.loads(done.out)["exit"] == 2
    assert (
        sorted(p.name for p in reports.iterdir()) == [name]
        and (reports / name).read_bytes() == b"the folder's own file\n"
    )


@pytest.mark.parametrize("run_id", layout.reserved_names())
def test_fleet_run_refuses_a_run_id_the_reports_folder_keeps(tmp_path, run_id):
    proc, line = fleet_run(tmp_path, "-i", "inventory/local", "--run-id", run_id)
    assert proc.returncode == 2 and line["status"] == "refused", (line, proc.stderr[-2000:])
    assert f"--run-id {run_id!r} is a name the reports folder keeps for its own {run_id}" in line["message"], line
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").iterdir())


@pytest.mark.slow
def test_the_playbook_refuses_a_gpufleet_run_id_the_reports_folder_keeps(tmp_path):
    """ansible-playbook validate.yml -e gpufleet_run_id=baseline.json (run_prepare's run start): refused, naming the
    variable; the baseline file the folder keeps is left as it was."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "baseline.json").write_text('{"run_id": "r0", "set_at": "2026-11-20T10:00:00Z"}\n')
    done = run_playbook(
        "validate.yml",
        "inventory/local",
        "-e",
        json.dumps({"gpufleet_run_id": "baseline.json", "gpufleet_reports_dir": str(reports)}),
        env=playbook_env(tmp_path),
        timeout_s=600,
    )
    said = " ".join(done.stdout.split())
    assert done.returncode != 0 and "gpufleet_run_id 'baseline.json' is a name the reports folder keeps" in said, said[
        -3000:
    ]
    assert sorted(p.name for p in reports.iterdir()) == ["baseline.json"]
    assert json.loads((reports / "baseline.json").read_text())["run_id"] == "r0"


def test_store_rebuild_names_a_damaged_ladder_json_and_keeps_its_record(capsys, monkeypatch, tmp_path):
    """ladder.json of random bytes: `store rebuild` names it (exit 0: the rebuild stands), the store keeps the ladder
    records it held of it (the node's history still shows them), the file is left as it was, and `gpufleet ladder`
    refuses to write over it."""
    reports = tmp_path / "reports"
    run = write_run(reports, "r1", {"n0": node_doc("n0", 0, extra=[ecc_failure(gpus_of(0)[0])])})
    assert _run(capsys, monkeypatch, "report", str(run))[0] == 1
    assert _run(capsys, monkeypatch, "ladder", str(run))[0] == 0
    steps = json.loads(_run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")[1])
    assert [s["step"] for s in steps["service"]["ladder"]] == ["retest"], steps["service"]
    (run / "ladder.json").write_bytes(NOT_UTF8)
    rc, out, err = _run(capsys, monkeypatch, "store", "rebuild", "--reports-dir", str(reports), "--json")
    assert rc == 0, err
    [named] = [u for u in json.loads(out)["unreadable"] if u.get("file") == "ladder.json"]
    assert named["run_id"] == "r1" and "is not UTF-8 text" in named["reason"], named
    assert "the store keeps the 1 event(s) it held of it" in named["reason"], named
    history = json.loads(_run(capsys, monkeypatch, "history", "n0", "--reports-dir", str(reports), "--json")[1])
    assert history["service"]["ladder"] == steps["service"]["ladder"]
    rc, out, err = _run(capsys, monkeypatch, "ladder", str(run))
    assert rc == 2 and err.startswith(f"gpufleet ladder: {run / 'ladder.json'} is not UTF-8 text"), err
    assert (run / "ladder.json").read_bytes() == NOT_UTF8
