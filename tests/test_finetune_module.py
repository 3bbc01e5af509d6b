"""gpufleet.cluster.finetune: its arguments, what it hands the engine, check mode, and a run it has to kill.

The engine is a stand-in `python -m gpufleet` the test writes (the module is what is under test here);
tests/test_playbook_finetune.py runs the real engine through the module on two hosts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from module_runner import run_module  # noqa: E402  (also puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import engine_process, engine_results  # noqa: E402
from ansible_collections.gpufleet.cluster.plugins.modules import finetune  # noqa: E402


def run_finetune(args: dict, capsys) -> dict:
    # The module adds `env` to its own environment (its engine inherits it): keep this process's as it was.
    with mock.patch.dict(os.environ):
        return run_module(finetune, {"python": sys.executable, "config": "/cfg/tiny.yml", **args}, capsys)


# Answers with one finetune result that echoes its arguments and the environment it was given.
ECHO = """
import json, os, sys
res = {"check": "finetune", "group": "finetune", "status": "skip", "value": 10, "unit": "tokens/s/GPU", "threshold": None,
       "reason": "stand-in", "remedy": None, "started": "2026-11-21T21:00:00Z", "seconds": 0.1,
       "detail": {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith(("GPUFLEET_T", "CUDA_"))}}}
print(json.dumps({"schema_version": 1, "host": "n1", "engine_version": "9.9", "profile": None, "versions": {},
                  "started": "2026-11-21T21:00:00Z", "seconds": 0.1, "results": [res]}))
"""


def test_arguments_and_environment_reach_the_engine(fake_engine, capsys):
    fake_engine(ECHO)
    out = run_finetune(
        {
            "nnodes": 2,
            "node_rank": 1,
            "master_addr": "127.0.0.2",
            "master_port": 29600,
            "timeout_s": 600,
            "rdzv_timeout_s": 120,
            "max_steps": 20,
            "output_dir": "/out/run1",
            "host_name": "n1",
            "env": {"CUDA_VISIBLE_DEVICES": "0,1", "GPUFLEET_TEST_FLAG": True, "GPUFLEET_TEST_N": 4},
        },
        capsys,
    )
    assert out["_exit_code"] == 0 and out["changed"] is True, out
    (res,) = out["gpufleet"]["results"]
    argv = res["detail"]["argv"]
    assert argv[:3] == ["finetune", "--config", "/cfg/tiny.yml"] and argv[-1] == "--json"
    opts = dict(zip(argv[3:-1:2], argv[4:-1:2]))
    assert (opts["--nnodes"], opts["--node-rank"], opts["--master-addr"], opts["--master-port"]) == (
        "2",
        "1",
        "127.0.0.2",
        "29600",
    )
    assert (opts["--rdzv-timeout-s"], opts["--max-steps"], opts["--output-dir"], opts["--host"]) == (
        "120",
        "20",
        "/out/run1",
        "n1",
    )
    # The engine kills torchrun a minute before the module's own kill, so a hang comes back with its log tail.
    assert opts["--timeout-s"] == "540" and engine_results.torchrun_engine_timeout_s(600) == 540
    assert res["detail"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "GPUFLEET_TEST_FLAG": "1", "GPUFLEET_TEST_N": "4"}
    assert out["cmd"][1:3] == ["-m", "gpufleet"]


def test_max_steps_zero_keeps_the_configs(fake_engine, capsys):
    fake_engine(ECHO)
    out = run_finetune({"max_steps": 0}, capsys)
    argv = out["gpufleet"]["results"][0]["detail"]["argv"]
    assert "--max-steps" not in argv and "--rdzv-timeout-s" not in argv


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"rdzv_timeout_s": 600, "timeout_s": 600},
            "rdzv_timeout_s = 600; expected 1 to 539 s, under the engine's limit inside timeout_s 600",
        ),
        ({"env": {"BAD-NAME": "1"}}, "env name 'BAD-NAME' is not an environment variable name"),
        ({"env": {"X": {"nested": 1}}}, 'env X = {"nested": 1}; expected a string or a number'),
        ({"nnodes": 2, "node_rank": 2}, "node_rank = 2; expected 0 to nnodes - 1 (1)"),
        ({"master_port": 0}, "master_port = 0; expected a TCP port"),
        ({"max_steps": -1}, "max_steps = -1; expected 0"),
        ({"timeout_s": 0}, "timeout_s = 0; expected a positive number of seconds"),
    ],
)
def test_bad_arguments_fail_with_a_message_naming_them(args, message, capsys):
    out = run_finetune({"host_name": "n2", **args}, capsys)
    assert out["failed"] is True and out["_exit_code"] == 1
    assert message in out["msg"] and "on n2" in out["msg"], out["msg"]
    assert out["remedy"] == engine_process.REMEDY_INPUT


def test_check_mode_runs_nothing_and_says_so(fake_engine, capsys):
    fake_engine("raise SystemExit('the engine must not run in check mode')\n")
    out = run_finetune({"host_name": "n3", "_ansible_check_mode": True}, capsys)
    assert out["_exit_code"] == 0 and out["skipped"] is True and out["changed"] is False
    (res,) = out["gpufleet"]["results"]
    assert (res["check"], res["group"], res["status"]) == ("finetune", "finetune", "skip") and "check mode" in res[
        "reason"
    ]


@pytest.mark.slow
def test_a_run_past_its_timeout_is_killed_with_its_process_group(fake_engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine_process, "KILL_GRACE_S", 0.5)
    pid_file = tmp_path / "child.pid"
    # An engine that ignores SIGTERM and has started a child of its own, as torchrun and its ranks are.
    fake_engine(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("step 3/2000 loss 6.1", file=sys.stderr, flush=True)
        time.sleep(120)
    """)
    t0 = time.monotonic()
    # 5 s: the engine must start its child and print a step first, which takes a busy machine seconds.
    out = run_finetune({"host_name": "n4", "timeout_s": 5}, capsys)
    assert time.monotonic() - t0 < 60  # the timeout and the grace, not the engine's 120 s
    assert out["_exit_code"] == 0 and "failed" not in out, out  # an error result, so the node still reaches the report
    (res,) = out["gpufleet"]["results"]
    assert (
        res["status"] == "error" and res["group"] == "finetune" and "passed its timeout of 5 s on n4" in res["reason"]
    )
    assert "step 3/2000" in res["detail"]["stderr"] and res["remedy"] == finetune.REMEDY_TIMEOUT
    child = int(pid_file.read_text())
    stat = Path(f"/proc/{child}/stat")
    deadline = time.monotonic() + 60
    while (
        stat.exists() and stat.read_text().split(")")[-1].split()[0] not in ("Z", "X") and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] in ("Z", "X"), (
        "the engine's child outlived the kill"
    )


def test_engine_that_cannot_run_fails_the_module(capsys):
    out = run_finetune({"python": "/x/bin/python", "host_name": "n5"}, capsys)
    assert out["failed"] is True and "gpufleet_python '/x/bin/python' does not exist on n5" in out["msg"]


def test_a_config_the_engine_refuses_gives_its_message(tmp_path, capsys):
    pytest.importorskip("torch")
    out = run_finetune({"config": str(tmp_path / "missing.yml"), "host_name": "n6", "timeout_s": 120}, capsys)
    assert out["failed"] is True and out["rc"] == 2
    assert str(tmp_path / "missing.yml") in out["msg"] and "cannot be read" in out["msg"], out["msg"]
    assert json.dumps(out["cmd"]).count("finetune") >= 1
