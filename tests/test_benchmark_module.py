"""gpufleet.cluster.benchmark, run in-process (AnsibleModule with patched arguments).

Against the real engine on this CPU-only machine, and against a stand-in engine process (a `gpufleet` package first
on PYTHONPATH) where the engine run must answer, hang or crash on demand. The engine runs each benchmark in a
process of its own (`--each-timeout-s`): tests/test_node_stage.py holds that part.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from module_runner import run_module  # noqa: E402  (also puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import benchmark_module, engine_process  # noqa: E402
from ansible_collections.gpufleet.cluster.plugins.modules import benchmark  # noqa: E402

from gpufleet.base import schema  # noqa: E402

RESULT_KEYS = set(schema.result("x", schema.PASS, "r")) | {"started", "seconds"}


def run_benchmark(args: dict, capsys) -> dict:
    return run_module(benchmark, args, capsys)


# A stand-in engine: `bench matmul ...` answers with one result that echoes its arguments, `bench memory ...` hangs
# (and ignores SIGTERM), `bench nccl ...` crashes.
STAND_IN = """
import json, signal, sys, time
name = sys.argv[2]
if name == "matmul":
    res = {"check": "matmul_bf16", "group": "benchmark", "status": "skip", "value": 1.5, "unit": "TFLOPS",
           "threshold": None, "reason": "stand-in", "remedy": None, "detail": {"argv": sys.argv[1:]},
           "started": "2026-11-21T21:00:00Z", "seconds": 0.1}
    print(json.dumps({"schema_version": 1, "host": "n1", "engine_version": "9.9", "profile": {"name": "generic"},
                      "versions": {"engine": "9.9"}, "started": "2026-11-21T21:00:00Z", "seconds": 0.1, "results": [res]}))
elif name == "memory":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("memory copies started", file=sys.stderr, flush=True)
    time.sleep(60)
else:
    raise RuntimeError("torchrun exploded")
"""


@pytest.mark.slow
def test_an_engine_run_that_hangs_or_crashes_is_an_error_for_each_of_its_benchmarks(fake_engine, monkeypatch, capsys):
    monkeypatch.setattr(engine_process, "KILL_GRACE_S", 0.5)
    monkeypatch.setattr(benchmark_module, "MARGIN_S", 0)
    fake_engine(STAND_IN)
    t0 = time.monotonic()
    # 3 s a benchmark: `bench memory` must start and say so first, which takes a busy machine seconds.
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["memory", "nccl"], "host_name": "n1", "timeout_s": 3}, capsys
    )
    assert time.monotonic() - t0 < 45  # the timeout and the grace, not the hung one's 60 s
    assert out["_exit_code"] == 0 and "failed" not in out, out
    by = {r["check"]: r for r in out["gpufleet"]["results"]}
    assert list(by) == ["memory", "nccl"]
    hung = by["memory"]
    assert set(hung) == RESULT_KEYS and hung["status"] == "error" and hung["group"] == "benchmark"
    assert "passed its timeout of 6 s on n1" in hung["reason"] and "memory copies started" in hung["reason"]
    assert hung["remedy"] == benchmark_module.REMEDY_TIMEOUT and by["nccl"]["detail"]["benchmark"] == "nccl"
    out = run_benchmark({"python": sys.executable, "benchmarks": ["nccl"], "host_name": "n1"}, capsys)
    (crashed,) = out["gpufleet"]["results"]
    assert crashed["status"] == "error" and "RuntimeError: torchrun exploded" in crashed["reason"]
    assert crashed["detail"]["rc"] == 1 and crashed["remedy"]


def test_one_engine_run_gets_each_benchmarks_timeout_the_depth_and_a_free_port_inside_a_node(fake_engine, capsys):
    fake_engine(STAND_IN.replace('if name == "matmul":', 'if name in ("matmul", "nccl"):'))
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["nccl", "matmul"], "timeout_s": 100, "depth": "thorough"}, capsys
    )
    argv = out["gpufleet"]["results"][0]["detail"]["argv"]
    assert argv[:3] == ["bench", "nccl", "matmul"]
    assert argv[argv.index("--each-timeout-s") + 1] == "100" and argv[argv.index("--depth") + 1] == "thorough"
    assert argv[argv.index("--nnodes") + 1] == "1" and "--master-port" not in argv  # the engine takes a free one


def test_across_nodes_passes_rank_master_and_port(fake_engine, capsys):
    fake_engine(STAND_IN.replace('if name == "matmul":', 'if name == "nccl":'))
    out = run_benchmark(
        {
            "python": sys.executable,
            "benchmarks": ["nccl"],
            "nnodes": 3,
            "node_rank": 2,
            "master_addr": "127.0.0.2",
            "master_port": 29600,
            "timeout_s": 600,
        },
        capsys,
    )
    argv = out["gpufleet"]["results"][0]["detail"]["argv"]
    opts = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
    assert (opts["--nnodes"], opts["--node-rank"], opts["--master-addr"], opts["--master-port"]) == (
        "3",
        "2",
        "127.0.0.2",
        "29600",
    )
    assert opts["--each-timeout-s"] == "600"


def test_training_across_nodes_gets_the_nodes_own_figure_and_the_same_placement(fake_engine, capsys):
    fake_engine(STAND_IN.replace('if name == "matmul":', 'if name == "train_gpt2":'))
    single = {
        "check": "train_gpt2",
        "group": "benchmark",
        "status": "pass",
        "value": 512198,
        "unit": "tokens/s/GPU",
        "reason": "r",
        "remedy": None,
        "threshold": {"key": "k"},
        "detail": {"world_size": 8, "command": ["torchrun"]},
    }
    out = run_benchmark(
        {
            "python": sys.executable,
            "benchmarks": ["train_gpt2"],
            "nnodes": 2,
            "node_rank": 1,
            "master_addr": "127.0.0.2",
            "master_port": 29511,
            "timeout_s": 600,
            "train_reference": single,
        },
        capsys,
    )
    argv = out["gpufleet"]["results"][0]["detail"]["argv"]
    opts = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
    assert (opts["--nnodes"], opts["--node-rank"], opts["--master-addr"], opts["--master-port"]) == (
        "2",
        "1",
        "127.0.0.2",
        "29511",
    )
    # Only what the engine needs of the node's own result: its figure, or why it has none.
    assert json.loads(opts["--train-reference"]) == {
        "check": "train_gpt2",
        "group": "benchmark",
        "status": "pass",
        "value": 512198,
        "unit": "tokens/s/GPU",
        "reason": "r",
        "world_size": 8,
    }
    # Left out, the engine gets none and its scaling result names the missing figure.
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["train_gpt2"], "nnodes": 2, "node_rank": 0, "master_port": 29511},
        capsys,
    )
    assert "--train-reference" not in out["gpufleet"]["results"][0]["detail"]["argv"]


@pytest.mark.parametrize(
    "args, message",
    [
        ({"benchmarks": ["nccl"], "nnodes": 2, "node_rank": 2}, "node_rank = 2; expected 0 to nnodes - 1 (1)"),
        ({"benchmarks": []}, "benchmarks is empty"),
        ({"benchmarks": ["nccl"], "master_port": 70000}, "master_port = 70000; expected a TCP port"),
        ({"benchmarks": ["nccl"], "timeout_s": 0}, "timeout_s = 0; expected a positive number of seconds"),
    ],
)
def test_bad_arguments_fail_with_a_message_naming_them(args, message, capsys):
    out = run_benchmark({"python": sys.executable, "host_name": "n2", **args}, capsys)
    assert out["failed"] is True and out["_exit_code"] == 1
    assert message in out["msg"] and "on n2" in out["msg"]
    assert out["remedy"] == engine_process.REMEDY_INPUT


def test_benchmarks_that_cannot_run_across_hosts_are_refused_by_the_engine(capsys):
    out = run_benchmark({"python": sys.executable, "benchmarks": ["matmul", "nccl"], "nnodes": 2}, capsys)
    assert out["failed"] is True and out["rc"] == 2 and out["remedy"] == engine_process.REMEDY_INPUT
    assert "nnodes = 2 runs across hosts, which only nccl and train_gpt2 do; got matmul" in out["msg"]


def test_an_unknown_benchmark_is_refused_by_the_engine_naming_the_ones_there_are(capsys):
    out = run_benchmark({"python": sys.executable, "benchmarks": ["fft"]}, capsys)
    assert out["failed"] is True and "'fft'" in out["msg"] and "matmul" in out["msg"]


def test_check_mode_runs_nothing_and_says_so(fake_engine, capsys):
    fake_engine("raise SystemExit('the engine must not run in check mode')\n")
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["matmul", "nccl"], "host_name": "n3", "_ansible_check_mode": True},
        capsys,
    )
    assert out["_exit_code"] == 0 and out["skipped"] is True and out["changed"] is False
    assert "not run in check mode" in out["msg"]
    results = out["gpufleet"]["results"]
    assert [(r["check"], r["group"], r["status"]) for r in results] == [
        ("matmul", "benchmark", "skip"),
        ("nccl", "benchmark", "skip"),
    ]
    assert all(set(r) == RESULT_KEYS for r in results)


def test_engine_that_cannot_run_fails_the_module(capsys):
    out = run_benchmark({"python": "/x/bin/python", "benchmarks": ["matmul"], "host_name": "n4"}, capsys)
    assert out["failed"] is True and "gpufleet_python '/x/bin/python' does not exist on n4" in out["msg"]


def test_unknown_threshold_gives_the_engine_message(capsys):
    out = run_benchmark({"python": sys.executable, "benchmarks": ["memory"], "thresholds": {"nope": 1}}, capsys)
    assert out["failed"] is True and out["rc"] == 2
    assert "gpufleet_thresholds.nope is not a known threshold" in out["msg"]


@pytest.mark.slow
def test_real_engine_on_the_cpu_returns_skip_results(capsys):
    pytest.importorskip("torch")
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["memory"], "host_name": "cpu-box", "timeout_s": 120}, capsys
    )
    assert out["_exit_code"] == 0, out
    doc = out["gpufleet"]
    assert doc["host"] == "cpu-box" and doc["engine_version"]
    (res,) = doc["results"]
    assert res["check"] == "hbm_bandwidth" and res["group"] == "benchmark"
    assert res["status"] == "skip" and "not a performance figure" in res["reason"] and res["value"] > 0
    assert res["detail"]["method"]["tier"] == "cpu"


def test_the_smoke_depth_and_the_soak_reach_the_engine(fake_engine, capsys):
    fake_engine(STAND_IN.replace('if name == "matmul":', 'if name in ("matmul", "soak"):'))
    out = run_benchmark(
        {"python": sys.executable, "benchmarks": ["matmul", "soak"], "depth": "smoke", "soak_duration_s": 120}, capsys
    )
    assert out["_exit_code"] == 0, out
    argv = out["gpufleet"]["results"][0]["detail"]["argv"]
    assert argv[argv.index("--depth") + 1] == "smoke" and argv[argv.index("--duration-s") + 1] == "120"
