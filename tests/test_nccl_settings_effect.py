"""tools/nccl_settings_effect.py, the measurement of the nccl role's settings: its judgement of runs against the
baseline, and one real run on the CPU (gloo: the logic, no NCCL), with the conf file moved aside while it measures and
put back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tool_modules
from gpufleet.benchmarks.nccl.nccl_measure import SIZES, depth_sizes

REPO = Path(__file__).resolve().parents[1]
SCRIPT = tool_modules.TOOLS / "nccl_settings_effect.py"
MiB = 1 << 20


def load():
    return tool_modules.load("nccl_settings_effect")


def run(variant: str, busbw: dict) -> dict:
    """A worker's output as nccl_settings_effect keeps it: busbw per (collective, MiB)."""
    collectives: dict = {}
    for (name, mib), value in busbw.items():
        collectives.setdefault(name, []).append({"size_bytes": mib * MiB, "busbw_gbps": value, "correct": True})
    return {"variant": variant, "collectives": collectives, "rc": 0, "timed_out": False}


def test_variants_measure_each_role_setting_then_all_of_them():
    ns = load()
    names = [v[0] for v in ns.variants({"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "WARN"})]
    assert names == [
        "base",
        "role:NCCL_DEBUG",
        "role:NCCL_SOCKET_IFNAME",
        "role:all",
        "base",
        "ib-documented",
        "seeds:ring",
        "seeds:simple",
        "seeds:ring+simple",
        "base",
        "net:base",
        "net:ifname",
    ]
    net = dict((v[0], v) for v in ns.variants({"NCCL_SOCKET_IFNAME": "=eth0"}))["net:ifname"]
    assert (
        net[1] == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0"}
        and net[2] == 256 * MiB
    )
    # Without an interface setting there is nothing to hold the network path against.
    assert "net:ifname" not in [v[0] for v in ns.variants({"NCCL_DEBUG": "WARN"})]


def test_clean_env_keeps_only_the_variants_nccl_variables(monkeypatch):
    ns = load()
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = ns.clean_env({"NCCL_PROTO": "Simple"})
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_GRAPH_MIXING_SUPPORT": "0",
        "NCCL_PROTO": "Simple",
    }
    assert env["PYTHONPATH"].split(":")[0] == str(REPO / "src")


def test_judge_against_the_baselines_median_and_spread():
    ns = load()
    runs = [
        run("base", {("all_reduce", 1): 10.0, ("all_reduce", 1024): 300.0}),
        run("base", {("all_reduce", 1): 10.4, ("all_reduce", 1024): 306.0}),
        run("base", {("all_reduce", 1): 9.9, ("all_reduce", 1024): 303.0}),
        run("seeds:simple", {("all_reduce", 1): 4.0, ("all_reduce", 1024): 304.0}),
        run("role:NCCL_DEBUG", {("all_reduce", 1): 10.2, ("all_reduce", 1024): 301.0}),
        run("role:all", {("all_reduce", 1): 12.0, ("all_reduce", 1024): 350.0}),
        run("net:base", {("all_reduce", 1): 1.0}),
        run("net:ifname", {("all_reduce", 1): 1.01}),
    ]
    rows = {r["variant"]: r for r in ns.judge(runs)}
    assert rows["base"]["verdict"] == "reference" and rows["base"]["runs"] == 3
    assert rows["seeds:simple"]["verdict"] == "hurts" and rows["seeds:simple"]["cells_below"] == 1
    assert rows["seeds:simple"]["worst"] == "all_reduce 1 MiB 0.400"
    assert rows["role:NCCL_DEBUG"]["verdict"] == "no effect beyond the baseline's spread"
    assert rows["role:all"]["verdict"] == "helps" and rows["role:all"]["cells_above"] == 2
    # The network path is held against itself without the setting, not against NVLink's figures.
    assert rows["net:ifname"]["against"] == "net:base" and rows["net:ifname"]["geomean_ratio"] == pytest.approx(1.01)


@pytest.mark.slow
def test_a_run_on_the_cpu_moves_the_conf_aside_and_puts_it_back(tmp_path):
    record = tmp_path / "bringup.json"
    record.write_text(
        json.dumps({"roles": {"nccl": {"settings": {"NCCL_SOCKET_IFNAME": "=lo", "NCCL_DEBUG": "WARN"}}}})
    )
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=WARN\n")
    out = tmp_path / "out"
    # A budget that lets one variant start: the rest are left out and named.
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--record",
            str(record),
            "--conf",
            str(conf),
            "--tier",
            "cpu",
            "--nproc",
            "2",
            "--budget-s",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert conf.read_text() == "NCCL_DEBUG=WARN\n" and not (tmp_path / "nccl.conf.gpufleet-measuring").exists()
    (base,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert base["variant"] == "base" and base["nccl_env"] == {} and base["backend"] == "gloo"
    assert {r["size_bytes"] for r in base["collectives"]["all_reduce"]} == {4096, 65536}
    summary = (out / "summary.txt").read_text()
    assert "left out for time: role:NCCL_DEBUG, role:NCCL_SOCKET_IFNAME, role:all" in summary
    assert proc.stdout.endswith(summary)
    method = json.loads((out / "method.json").read_text())
    assert method["role_settings"] == {"NCCL_SOCKET_IFNAME": "=lo", "NCCL_DEBUG": "WARN"} and method["nproc"] == 2


def test_a_record_without_the_nccl_role_is_refused(tmp_path):
    record = tmp_path / "bringup.json"
    record.write_text(json.dumps({"roles": {"host_tuning": {}}}))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--record", str(record)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        proc.returncode != 0 and "has no nccl section with settings: run bringup.yml (role nccl) first" in proc.stderr
    )


def test_the_benchmark_tier_capped_for_a_slow_transport():
    capped = depth_sizes("quick", 256 * MiB)
    assert capped["all_reduce"] == [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    assert capped["sendrecv"] == [256 * MiB] and max(capped["all_to_all"]) == 256 * MiB
    assert "sendrecv" not in depth_sizes("quick", 64 * MiB) and depth_sizes("quick") == SIZES["quick"]
