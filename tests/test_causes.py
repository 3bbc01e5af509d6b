"""A cause, once: the failing results of a node that give one reason are named once, with the checks they explain,
in report.json, report.md, report.html, drain.txt, the Slurm reason, the report's summary and the runner's ending.

The documents come from the real engine: the check groups over readings of a node without a driver, and the
benchmarks run by an interpreter that has no torch (this one started with -S, its site-packages left out).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.base import causes, schema
from gpufleet import report
from gpufleet.collect import nvml
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.runner import ending, invocation

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"


def engine(*args: str, env: dict | None = None, python: tuple[str, ...] = (sys.executable,)) -> dict:
    done = subprocess.run(
        [*python, "-m", "gpufleet", *args, "--json", "--exit-zero"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def no_driver_run(tmp_path_factory) -> Path:
    """hosts/n1.json: a node whose NVML has no driver and whose Python has no torch; hosts/n2.json: healthy."""
    tmp = tmp_path_factory.mktemp("causes")
    readings = json.loads(READINGS.read_text())
    readings["nvml"] = {"available": False, "error": nvml.NO_DRIVER, "gpus": []}
    (tmp / "no-driver.json").write_text(json.dumps(readings))
    # The GPU groups: the recording is older than host_hygiene's sections.
    doc = engine(
        "check",
        "--group",
        "gpu_inventory",
        "--group",
        "gpu_health",
        "--readings",
        str(tmp / "no-driver.json"),
        "--host",
        "n1",
    )
    # A Python without torch: this interpreter with -S (no site-packages), given the engine and PyYAML alone.
    site = tmp / "site"
    shutil.copytree(Path(yaml.__file__).parent, site / "yaml")
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}:{site}")
    bench = engine(
        "bench", "matmul", "memory", "--depth", "smoke", "--host", "n1", env=env, python=(sys.executable, "-S")
    )
    doc["results"] += bench["results"]
    healthy = json.loads(READINGS.read_text())
    healthy["nvml"]["gpus"][0]["processes"] = []
    (tmp / "ok.json").write_text(json.dumps(healthy))
    ok = engine(
        "check",
        "--group",
        "gpu_inventory",
        "--group",
        "gpu_health",
        "--readings",
        str(tmp / "ok.json"),
        "--host",
        "n2",
        "--thresholds",
        json.dumps({"gpus_expected": 1}),
    )
    run_dir = tmp / "run-c"
    (run_dir / "hosts").mkdir(parents=True)
    (run_dir / "hosts" / "n1.json").write_text(json.dumps(doc))
    (run_dir / "hosts" / "n2.json").write_text(json.dumps(ok))
    return run_dir


@pytest.mark.slow
def test_the_engine_names_each_cause_in_the_same_words(no_driver_run):
    doc = json.loads((no_driver_run / "hosts" / "n1.json").read_text())
    nvml_checks = [r for r in doc["results"] if r["group"] in ("gpu_inventory", "gpu_health")]
    assert nvml_checks and {r["reason"] for r in nvml_checks} == {nvml.NO_DRIVER}
    bench = [r for r in doc["results"] if r["group"] == "benchmark"]
    assert [(r["check"], r["status"]) for r in bench] == [("matmul", "error"), ("memory", "error")]
    assert (
        len({r["reason"] for r in bench}) == 1
        and "no torch in" in bench[0]["reason"]
        and "crashed" not in bench[0]["reason"]
    )
    assert "gpufleet_python" in bench[0]["remedy"]


def test_report_says_each_cause_once(no_driver_run):
    summary = report.build(no_driver_run, use_store=False)
    rep = json.loads((no_driver_run / "report.json").read_text())
    node = rep["nodes"]["n1"]
    n_nvml = sum(1 for r in node["results"] if r["reason"] == nvml.NO_DRIVER and r["status"] == "error")
    driver, torch = node["causes"][:2]
    assert driver["cause"] == nvml.NO_DRIVER and len(driver["checks"]) == n_nvml and driver["class"] == "software"
    # gpu_health.processes errs for the missing driver too: inside the cause, not leading the drain line.
    assert "gpu_health.processes" in driver["checks"] and driver["remedy"].startswith("install the NVIDIA driver")
    assert torch["checks"] == ["benchmark.matmul", "benchmark.memory"] and "no torch" in torch["cause"]

    # The summary's counts are the table's, and the words say "not accepted" of the node that errs.
    md = (no_driver_run / "report.md").read_text()
    counts = rep["counts"]
    assert (
        f"1 of 2 node(s) not accepted; results: {counts['error']} error, {counts['fail']} fail, {counts['warn']} warn"
        in md
    )
    row = next(line for line in md.splitlines() if line.startswith("| n1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert [int(c) for c in cells[2:7]] == [node["counts"][s] for s in ("error", "fail", "warn", "skip", "pass")]
    assert cells[-2].startswith(f"`{nvml.NO_DRIVER} ({n_nvml} checks)`, `no torch in ")
    # then the first cause in a sentence, with what to do: software beside the board, a re-test once fixed
    assert cells[-1].startswith(f"{nvml.NO_DRIVER} [software, ") and "; action: re-test" in cells[-1]
    section = md.split("## n1: FAIL")[1].split("## n2")[0]
    assert section.count(nvml.NO_DRIVER) == 1 and section.count("install the NVIDIA driver") == 1
    assert "#### ERROR `gpu_inventory.gpu_count`" not in section  # its reason is the cause's, said above
    html = (no_driver_run / "report.html").read_text()
    html_section = html.split('<section id="')[1]
    assert html_section.count(nvml.NO_DRIVER) == 1, html_section[:3000]

    # drain.txt and the Slurm reason lead with the cause, not with a side effect of it.
    drain = (no_driver_run / "drain.txt").read_text().splitlines()[1]
    assert f'Reason="gpufleet sw {nvml.NO_DRIVER} ({n_nvml} checks), no torch in ' in drain, drain
    assert drain.endswith('; run run-c"'), drain
    assert (
        fleet_slurm.drain_reason("run-c", node) == f"gpufleet sw {nvml.NO_DRIVER} ({n_nvml} checks) +1 more; run run-c"
    )

    # The summary the playbook's failure message and `gpufleet report` print.
    assert summary["not_accepted"].startswith(f"n1: {nvml.NO_DRIVER} ({n_nvml} checks: gpu_inventory.gpu_count, ")
    assert summary["not_accepted"].count(nvml.NO_DRIVER) == 1 and "no torch in" in summary["not_accepted"]
    text = report.summary_text(summary)
    assert text.splitlines()[0] == "fleet verdict: FAIL (2 node(s): 1 not accepted, 1 accepted with warnings)"
    assert text.count(nvml.NO_DRIVER) == 1


def test_the_runs_ending_says_each_cause_once(no_driver_run):
    report.build(no_driver_run, use_store=False)
    rep = json.loads((no_driver_run / "report.json").read_text())
    why = ending.not_accepted_why(rep, {"n1": invocation.NOT_ACCEPTED, "n2": "accepted"})
    text = ending.ending_text(why, "end")
    first = text.splitlines()[0]
    n_nvml = len(rep["nodes"]["n1"]["causes"][0]["checks"])
    assert re.match(
        rf"  n1: error gpu_inventory\.\w+ and {n_nvml - 1} more check\(s\) with the same reason: "
        rf"{re.escape(nvml.NO_DRIVER)}; also benchmark\.matmul \(error, 2 checks with its reason\)$",
        first,
    ), first
    assert text.count(nvml.NO_DRIVER) == 1


def test_grouping_keeps_different_reasons_apart_and_hardware_first():
    res = [
        schema.result("a", "error", "same words", group="g", remedy="r1"),
        schema.result("xid", "fail", "GPU 0: Xid 79", group="gpu_health"),
        schema.result("b", "error", "same  words", group="g"),
        schema.result("c", "warn", "same words", group="g"),
        {"check": "d", "group": "g", "status": "fail"},
        {"check": "e", "group": "g", "status": "fail"},
    ]
    groups = causes.grouped(res)
    assert [g["checks"] for g in groups] == [["gpu_health.xid"], ["g.a", "g.b"], ["g.d"], ["g.e"]]
    assert groups[1]["remedy"] == "r1" and groups[1]["status"] == "error"
    assert [causes.label(g) for g in groups[:2]] == ["gpu_health.xid", "same words (2 checks)"]
