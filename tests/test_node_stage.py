"""The node's stage, written once in the engine (gpufleet node-stage, node/stage.py) and its steps, each an engine
process of its own (supervised.py): what validate.yml's node stage (two parts, one module run each) and a sweep's
Slurm job (the whole) run on the node.

The stage runs for real on this machine: its checks and counters replay a recorded node, its lock is a real lock
file. Where a step must hang or crash on demand, its interpreter is a stand-in engine (a `gpufleet` package first on
its PYTHONPATH) while the stage that supervises it is the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpufleet.base import lock, registry
from gpufleet.node import supervised

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"
RESULT_KEYS = {"check", "group", "status", "value", "unit", "threshold", "reason", "remedy", "detail", "class"}

# A stand-in engine: `bench matmul ...` answers with one result that echoes its arguments, `bench memory` hangs
# (and ignores SIGTERM), any other benchmark crashes.
STAND_IN = """
import json, signal, sys, time
names = [a for a in sys.argv[2:] if not a.startswith("-")][:2]
if names[0] in ANSWER:
    res = {"check": names[0] + "_figure", "group": "benchmark", "status": "skip", "value": 1.5, "unit": "TFLOPS",
           "threshold": None, "reason": "stand-in", "remedy": None, "detail": {"argv": sys.argv[1:]},
           "started": "2026-11-21T21:00:00Z", "seconds": 0.1}
    print(json.dumps({"schema_version": 1, "host": "n1", "engine_version": "9.9", "profile": {"name": "generic"},
                      "versions": {"engine": "9.9"}, "started": "2026-11-21T21:00:00Z", "seconds": 0.1, "results": [res]}))
elif names[0] == "memory":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("memory copies started", file=sys.stderr, flush=True)
    time.sleep(60)
else:
    raise RuntimeError("torchrun exploded")
"""


@pytest.fixture
def stand_in(tmp_path):
    """An interpreter whose `-m gpufleet` is the stand-in engine, answering for the benchmarks named."""

    def make(answer=("matmul",)) -> str:
        pkg = tmp_path / "fake" / "gpufleet"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "__main__.py").write_text(f"ANSWER = {list(answer)!r}\n" + textwrap.dedent(STAND_IN))
        python = tmp_path / "python"
        python.write_text(f'#!/bin/sh\nPYTHONPATH={pkg.parent} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        return str(python)

    return make


def test_a_hung_and_a_crashed_benchmark_are_each_an_error_and_the_others_keep_what_they_measured(stand_in):
    t0 = time.monotonic()
    # 5 s a benchmark: `bench memory` must start and say so first, which takes a busy machine seconds.
    docs, results = supervised.benchmarks(stand_in(), ["matmul", "memory", "nccl"], 5, ["--json"])
    assert time.monotonic() - t0 < 45  # the timeouts and the grace, not the hung one's 60 s
    assert [d["engine_version"] for d in docs] == ["9.9"]
    by = {r["check"]: r for r in results}
    assert list(by) == ["matmul_figure", "memory", "nccl"]
    assert by["matmul_figure"]["value"] == 1.5  # measured before the others failed: kept
    hung = by["memory"]
    assert RESULT_KEYS <= set(hung) and hung["status"] == "error" and hung["group"] == "benchmark"
    assert "`gpufleet bench memory` passed its timeout of 5 s and was killed" in hung["reason"]
    assert "memory copies started" in hung["reason"] and "memory copies started" in hung["detail"]["stderr"]
    assert hung["remedy"] == supervised.REMEDY_TIMEOUT and hung["class"] == "software"
    crashed = by["nccl"]
    assert crashed["status"] == "error" and "RuntimeError: torchrun exploded" in crashed["reason"]
    assert crashed["detail"]["rc"] == 1 and crashed["detail"]["benchmark"] == "nccl"


def test_sdc_runs_in_matmuls_engine_run_and_its_error_stands_for_both(stand_in):
    docs, results = supervised.benchmarks(stand_in(("matmul", "sdc")), ["sdc", "memory", "matmul"], 50, ["--json"])
    argvs = [r["detail"]["argv"] for r in results if r["status"] == "skip"]
    assert [a[:3] for a in argvs] == [["bench", "matmul", "sdc"]], argvs
    alone = supervised.benchmarks(stand_in(("sdc",)), ["sdc"], 50, ["--json"])[1]
    assert alone[0]["detail"]["argv"][:2] == ["bench", "sdc"]
    # `bench matmul sdc` crashes: both are error results, each naming itself, with the run's timeout (each's, twice)
    errors = supervised.benchmarks(stand_in(("none",)), ["sdc", "matmul"], 50, ["--json"])[1]
    assert [(r["check"], r["status"], r["detail"]["benchmark"]) for r in errors] == [
        ("matmul", "error", "matmul"),
        ("sdc", "error", "sdc"),
    ]
    assert all("RuntimeError: torchrun exploded" in r["reason"] and r["detail"]["timeout_s"] == 100 for r in errors)


def test_torchrun_stops_inside_its_steps_timeout_and_the_soak_gets_its_duration_beyond_it(stand_in):
    more = ["--depth", "smoke", "--json", "--duration-s", "120"]
    results = supervised.benchmarks(stand_in(("nccl", "soak")), ["nccl", "soak"], 100, more, soak_duration_s=120)[1]
    nccl, soak = [r["detail"]["argv"] for r in results]
    # The engine stops torchrun first, so that a hang is reported with its log tail before the step is killed.
    assert nccl[nccl.index("--depth") + 1] == "smoke" and float(nccl[nccl.index("--timeout-s") + 1]) == 75
    assert float(soak[soak.index("--timeout-s") + 1]) == 220 - 55  # 100 s and the soak's 120 s, less a quarter


def stage(tmp_path: Path, part: str, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpufleet", "node-stage", "--part", part, "--host", "n1", "--python", python]
    argv += ["--readings", str(READINGS), "--profile", "h100-sxm", "--lock-path", str(tmp_path / "node.lock")]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def test_the_checks_part_takes_the_lock_checks_and_says_what_the_tier_runs_next(tmp_path):
    done = stage(tmp_path, "checks", "--run-id", "r1", "--tier", "smoke")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["lock"]["acquired"] and doc["results"][0]["check"] == "node_lock"
    groups = [r["group"] for r in doc["results"]]
    assert set(registry.group_names()) | {"counters"} <= set(groups) and "benchmark" not in groups
    assert [r["check"] for r in doc["results"] if r["group"] == "counters"] == ["snapshot_before", "fabric_before"]
    # The engine decides what the smoke tier runs, and at which depth: not the site's depth, the tier's own.
    assert (doc["benchmarks"], doc["depth"], doc["done"]) == (["matmul", "memory", "nccl"], "smoke", False)
    assert doc["profile"]["name"] == "h100-sxm" and doc["versions"]
    assert json.loads((tmp_path / "node.lock").read_text())["run_id"] == "r1"  # held for the benchmarks

    # Another run finds it held: not measured, the holder named, nothing else run.
    held = json.loads(stage(tmp_path, "checks", "--run-id", "r2").stdout)
    (only,) = held["results"]
    assert only["check"] == "node_lock" and only["status"] == "error" and "held by run 'r1'" in only["reason"]
    assert "--limit n1" in only["remedy"] and not held["lock"]["acquired"]


def test_a_tier_with_nothing_to_benchmark_is_done_in_the_checks_part_and_gives_the_lock_back(tmp_path):
    done = stage(tmp_path, "checks", "--run-id", "r1", "--benchmarks", "--release")
    doc = json.loads(done.stdout)
    assert (doc["benchmarks"], doc["done"], doc["released"]) == ([], True, True), done.stderr
    counters = [r["check"] for r in doc["results"] if r["group"] == "counters"]
    assert counters == ["snapshot_before", "fabric_before", "snapshot_after", "fabric_after", "processes_after"]
    assert not (tmp_path / "node.lock").exists()


def test_the_plan_reads_the_lock_and_the_inventory_and_takes_nothing(tmp_path):
    lock.acquire(tmp_path / "node.lock", "other", "n1", 600)
    plan = json.loads(stage(tmp_path, "plan", "--run-id", "r1", "--tier", "soak").stdout)
    assert plan["lock"]["record"]["run_id"] == "other" and plan["benchmarks"] == ["soak", "sdc"]
    assert {r["group"] for r in plan["results"]} == {"gpu_inventory"}
    assert json.loads((tmp_path / "node.lock").read_text())["run_id"] == "other"


def refusals() -> list[tuple[list[str], str]]:
    """Each input of the stage a hand-typed `gpufleet node-stage` may get wrong, and the registry's words for it."""
    may = ", ".join(registry.benchmark_names(selectable=True))
    return [
        (["--tier", "bogus"], f"--tier must be one of {', '.join(registry.run_tier_names())}; got 'bogus'"),
        (["--benchmarks", "matmul", "soak"], f"--benchmarks names 'soak'; expected some of {may}, or none"),
        (["--depth", "smoke"], f"--depth 'smoke'; expected one of {', '.join(registry.chosen_depths())}"),
    ]


@pytest.mark.parametrize("args, message", refusals(), ids=["tier", "benchmarks", "depth"])
def test_what_the_registry_refuses_is_said_in_one_line_before_anything_runs(tmp_path, args, message):
    # The tier comes checked from the controller; typed by hand, the node's lookup (registry.stage_plan) says the
    # controller's words, naming the option.
    done = stage(tmp_path, "checks", "--run-id", "r1", *args)
    assert done.returncode == 2 and done.stderr == f"gpufleet node-stage: {message}\n", done.stderr
    assert not (tmp_path / "node.lock").exists()


def test_the_benchmarks_part_runs_each_benchmark_under_the_lock_and_gives_it_back(tmp_path, stand_in):
    lock.acquire(tmp_path / "node.lock", "r1", "n1", 600)
    python = stand_in(("matmul",))
    done = stage(tmp_path, "benchmarks", "--run-id", "r1", "--benchmarks", "matmul", "--release", python=python)
    doc = json.loads(done.stdout)
    (figure,) = [r for r in doc["results"] if r["group"] == "benchmark"]
    argv = figure["detail"]["argv"]
    assert argv[:2] == ["bench", "matmul"] and argv[argv.index("--depth") + 1] == registry.DEFAULT_DEPTH
    # the counters after it: the stand-in has none, an error of their group naming the step
    (after,) = [r for r in doc["results"] if r["group"] == "counters"]
    assert after["check"] == "engine" and "`gpufleet counters --phase after`" in after["reason"]
    assert doc["done"] and doc["released"] and not (tmp_path / "node.lock").exists()


def test_the_whole_stage_of_a_sweep_job_writes_its_document_and_gives_the_lock_back(tmp_path):
    (tmp_path / "run" / "hosts").mkdir(parents=True)
    done = stage(
        tmp_path, "whole", "--run-id", "sw-1", "--run-dir", str(tmp_path / "run"), "--tier", "smoke", "--benchmarks"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["host"] == "n1"
    doc = json.loads((tmp_path / "run" / "hosts" / "n1.json").read_text())
    assert doc["results"][0]["check"] == "node_lock" and doc["results"][0]["status"] == "pass"
    assert "lock" not in doc and "benchmarks" not in doc  # a host document, nothing of the parts' talk
    assert not (tmp_path / "node.lock").exists()
