"""Real ansible-playbook runs of validate.yml with the benchmark stages, on this machine (no GPU).

The benchmarks run on the CPU (gloo for NCCL, tiny sizes); their results are
`skip`, never a performance claim. The run across nodes uses two inventory
hosts that are both this machine (connection local, ansible_host 127.0.0.1),
so torchrun really starts on both with nnodes=2 and meets at 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.base import registry
from gpufleet.bench.launch import free_port
from playbooks import playbook_env, run_playbook
from waiting import left_running

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

CPU_NOTE = "not a performance figure"
COLLECTIVES = {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all"}


def run_validate(tmp_path: Path, *extra: str, inventory: str = "inventory/local", timeout: int = 300):
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    proc = run_playbook(
        "validate.yml",
        inventory,
        *extra,
        env=playbook_env(tmp_path, ANSIBLE_ASYNC_DIR=str(tmp_path / "ansible-async")),
        timeout_s=timeout,
        run_id=run_id,
        reports=tmp_path,
        lock=tmp_path / "node.lock",
    )
    return proc, tmp_path / run_id


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def host_doc(run_dir: Path, host: str) -> dict:
    return json.loads((run_dir / "hosts" / f"{host}.json").read_text())


def _leftover_workers() -> list[str]:
    return left_running(r"gpufleet[.](bench[.]nccl|train[.]gpt2) --worker")


# ---------------------------------------------------------------- one node: the benchmark stage


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bench-local")
    proc, run_dir = run_validate(tmp_path)
    return proc, run_dir


def test_local_run_records_benchmarks_in_host_document_and_report(local_run):
    proc, run_dir = local_run
    out = output(proc)
    assert proc.returncode != 0, out  # no GPU: not accepted, benchmarks or not
    doc = host_doc(run_dir, "localhost")
    bench = {r["check"]: r for r in doc["results"] if r["group"] == "benchmark"}
    sdc = bench.pop("sdc", None)
    # Each engine run was handed what its figures are held against (RUN_DIR/references/localhost.json, written by
    # the run's first play): here a first run, with no baseline.
    held = [r for r in doc["results"] if r["check"] == "measured_again"]
    bench.pop("measured_again", None)
    # matmul and sdc, memory, nccl, host
    assert len(held) == 4 and (run_dir / "references" / "localhost.json").is_file(), out
    for r in held:
        assert r["status"] == "pass" and r["detail"]["held_against"]["baseline"] is None, r
        assert r["detail"]["held_against"]["notes"] == [
            "no baseline run set (gpufleet baseline set RUN_ID, or gpufleet_baseline for validate.yml)"
        ], r
        assert "held against nothing beyond its limits: no baseline run set" in r["reason"], r
    # The host's own step, in the default acceptance benchmarks: its figures a CPU run's; no scratch folder named here
    host = {
        c: bench.pop(c) for c in ("host_memory_bandwidth", "disk_write_bandwidth", "disk_read_bandwidth", "data_loader")
    }
    assert all(
        host[c]["status"] == "skip" and CPU_NOTE in host[c]["reason"] for c in ("host_memory_bandwidth", "data_loader")
    )
    assert all(
        "no scratch folder named (gpufleet_scratch_dir" in host[c]["reason"]
        for c in ("disk_write_bandwidth", "disk_read_bandwidth")
    )
    assert set(bench) == {"matmul_bf16", "hbm_bandwidth", "nccl_sendrecv"} | COLLECTIVES, out
    # The SDC hashes of the default acceptance benchmarks: two CPU processes, compared for real, no claim on a GPU.
    assert sdc and sdc["status"] == "skip" and sdc["detail"]["would_be"] == "pass" and CPU_NOTE in sdc["reason"], sdc
    assert len({json.dumps(g["hashes"], sort_keys=True) for g in sdc["detail"]["per_gpu"].values()}) == 1
    assert sdc["detail"]["method"]["computed_in"] == "the matmul workers", sdc["detail"]["method"]  # one engine run
    for check, res in bench.items():
        # A CPU figure is never judged: skip, with the note, and the number measured kept.
        assert res["status"] == "skip", res
        assert CPU_NOTE in res["reason"], res
        assert isinstance(res["value"], (int, float)) and res["value"] > 0, res
        assert res["unit"] in ("TFLOPS", "GB/s")
        method = res["detail"]["method"]
        assert method["benchmark_version"] >= 1 and method["tier"] == "cpu", method
    assert bench["matmul_bf16"]["threshold"]["key"] == "matmul_bf16_tflops_min"
    for check in COLLECTIVES:
        rows = bench[check]["detail"]["rows"]
        assert [r["size_bytes"] for r in rows] == [4096, 65536]
        assert all(r["correct"] and r["busbw_gbps"] > 0 for r in rows)
        assert bench[check]["detail"]["world_size"] == 2 and bench[check]["detail"]["backend"] == "gloo"

    report = json.loads((run_dir / "report.json").read_text())
    reported = [r for r in report["nodes"]["localhost"]["results"] if r["group"] == "benchmark"]
    assert reported == [r for r in doc["results"] if r["group"] == "benchmark"]  # unchanged
    # One node: no run across nodes, nothing recorded for it.
    assert not [r for r in doc["results"] if r["group"] == "benchmark_multinode"]


def test_local_run_draws_busbw_in_report_html_and_tabulates_it_in_md(local_run):
    _, run_dir = local_run
    page = (run_dir / "report.html").read_text()
    svgs = re.findall(r'<svg class="chart busbw".*?</svg>', page, re.S)
    assert len(svgs) == 1, "one chart: the single-node NCCL run"
    svg = svgs[0]
    assert svg.count("<polyline") == len(COLLECTIVES)
    for label in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert f">{label} (skip)</text>" in svg
    assert ">4 KiB</text>" in svg and ">64 KiB</text>" in svg and "busbw (GB/s)" in svg
    assert "a logic check, not a performance figure" in page
    # Still self-contained: no script, no external reference.
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.I)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))

    md = (run_dir / "report.md").read_text()
    assert "### NCCL bus bandwidth (GB/s)" in md
    assert "| size | all_reduce | all_gather | reduce_scatter | all_to_all |" in md
    assert re.search(r"^\| 64 KiB \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$", md, re.M)
    # the limit that decided, its source beside it, in the node's table of results
    assert re.search(
        r"^\| `benchmark\.matmul_bf16` \|.*\| matmul_bf16_tflops_min = none set, not calibrated \|", md, re.M
    )


# ---------------------------------------------------------------- bad input stops before any node


def either(names: tuple[str, ...], word: str) -> str:
    """`a, b and c`: how the playbook's message names what the registry holds."""
    return f"{', '.join(names[:-1])} {word} {names[-1]}"


@pytest.mark.parametrize(
    "variables, message",
    [
        (
            {"gpufleet_benchmark_depth": "bogus"},
            f'gpufleet_benchmark_depth for localhost must be {either(registry.chosen_depths(), "or")}; got "bogus"',
        ),
        # the depth's old name: a variable the collection no longer knows, the new one named
        (
            {"gpufleet_benchmark_tier": "quick"},
            "gpufleet_benchmark_tier (for localhost) is called gpufleet_benchmark_depth",
        ),
        (
            {"gpufleet_benchmarks": ["matmul", "fft"]},
            "gpufleet_benchmarks for localhost must be a list of benchmarks from "
            + either(registry.benchmark_names(selectable=True), "and"),
        ),
        ({"gpufleet_benchmarks": "matmul"}, "gpufleet_benchmarks for localhost must be a list of benchmarks"),
        (
            {"gpufleet_nccl_master_port": 70000},
            "gpufleet_nccl_master_port for localhost must be a TCP port, 1 to 65535",
        ),
        (
            {"gpufleet_nccl_timeout_s": "soon"},
            "gpufleet_nccl_timeout_s for localhost must be a positive whole number of seconds",
        ),
        ({"gpufleet_nccl_multinode": "maybe"}, "gpufleet_nccl_multinode for localhost must be true or false"),
    ],
)
def test_bad_benchmark_variable_fails_early_naming_it(tmp_path, variables, message):
    proc, run_dir = run_validate(tmp_path, "-e", json.dumps(variables))
    out = output(proc)
    assert proc.returncode != 0, out
    assert message in " ".join(out.split()), out
    assert not (run_dir / "hosts").exists(), "no node may be touched"


# ---------------------------------------------------------------- two nodes: NCCL across them


def two_node_inventory(tmp_path: Path, port: int, group_vars: dict | None = None, **node_b_vars) -> Path:
    """node-a and node-b: both this machine, so a run across them really starts two torchruns."""
    node = {
        "ansible_connection": "local",
        "ansible_host": "127.0.0.1",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "gpufleet_python": "{{ ansible_playbook_python }}",
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {
                            # Node benchmarks off unless asked for: the one-node tests cover them.
                            "vars": {
                                "gpufleet_nccl_master_port": port,
                                "gpufleet_benchmarks": [],
                                **(group_vars or {}),
                            },
                            "hosts": {"node-a": dict(node), "node-b": dict(node, **node_b_vars)},
                        }
                    }
                }
            }
        )
    )
    return inventory


def test_two_nodes_run_nccl_and_training_across_both_and_merge_into_each_document(tmp_path):
    """NCCL, then the GPT-2 training gate (tiny on the CPU) across both nodes, each node's own single-node
    train_gpt2 figure from play 2 the reference of its scaling efficiency."""
    port = free_port()
    # A peak figure so that MFU is computed (the generic profile has none); it judges nothing on the CPU.
    group_vars = {"gpufleet_benchmarks": ["train_gpt2"], "gpufleet_thresholds": {"bf16_dense_peak_tflops": 989}}
    proc, run_dir = run_validate(tmp_path, inventory=str(two_node_inventory(tmp_path, port, group_vars)))
    out = output(proc)
    assert proc.returncode != 0, out  # no GPU: not accepted
    assert "Start NCCL across the nodes at once: node-a, node-b" in out, out
    assert "Start the training gate across the nodes at once: node-a, node-b" in out, out
    assert "argsplat-unsafe" not in out, out  # the jobs' arguments are given by name, not as one template

    for host, rank in (("node-a", 0), ("node-b", 1)):
        doc = host_doc(run_dir, host)
        # The checks of play 2 are still there: the results were added, not replaced.
        assert {r["group"] for r in doc["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene"}
        multi = {r["check"]: r for r in doc["results"] if r["group"] == "benchmark_multinode"}
        assert set(multi) >= COLLECTIVES, (host, sorted(multi), out)
        for check in COLLECTIVES:
            res = multi[check]
            detail = res["detail"]
            assert detail["world_size"] == 4 and detail["nnodes"] == 2, detail  # 2 ranks a node on the CPU
            assert res["status"] == "skip" and CPU_NOTE in res["reason"] and res["value"] > 0
            assert all(r["correct"] for r in detail["rows"]), detail["rows"]
            assert "--nnodes=2" in detail["command"] and f"--master-port={port}" in detail["command"]
            mn = detail["multinode"]
            assert (
                mn["members"] == ["node-a", "node-b"] and mn["master"] == "node-a" and mn["master_addr"] == "127.0.0.1"
            )
            assert mn["node_rank"] == rank and mn["master_port"] == port and mn["left_out"] == {}
        # Gloo on the CPU writes no NCCL log: there is no transport to judge.
        assert multi["nccl_transport"]["status"] == "skip", multi["nccl_transport"]

        # The training gate across the nodes: a logic check on the CPU, never a performance claim.
        (single,) = [r for r in doc["results"] if r["group"] == "benchmark" and r["check"] == "train_gpt2"]
        assert single["status"] == "skip" and single["detail"]["world_size"] == 1 and single["value"] > 0, single
        train, scaling = multi["train_gpt2"], multi["train_scaling"]
        assert train["status"] == "skip" and CPU_NOTE in train["reason"], train
        assert train["unit"] == "tokens/s/GPU" and train["value"] > 0
        assert "over 2 nodes" in train["reason"], train["reason"]
        detail = train["detail"]
        assert detail["world_size"] >= 2 and detail["nnodes"] == 2, detail
        assert detail["mfu"] > 0 and detail["mfu_peak_tflops"] == 989
        assert len(detail["per_rank_tokens_per_s"]) == detail["world_size"]
        assert "--nnodes=2" in detail["command"] and f"--master-port={port}" in detail["command"]
        assert detail["multinode"]["node_rank"] == rank and detail["multinode"]["master"] == "node-a"
        # Scaling against this node's own single-node figure.
        assert scaling["status"] == "skip" and CPU_NOTE in scaling["reason"], scaling
        assert scaling["detail"]["tokens_per_s_per_gpu_one_node"] == single["value"]
        assert scaling["value"] == pytest.approx(train["value"] / single["value"], abs=1e-3)
        assert scaling["detail"]["nnodes"] == 2 and scaling["detail"]["world_size"] == detail["world_size"]
        assert scaling["threshold"]["key"] == "train_scaling_efficiency_min"

    report = json.loads((run_dir / "report.json").read_text())
    assert {
        r["check"] for r in report["nodes"]["node-b"]["results"] if r["group"] == "benchmark_multinode"
    } >= COLLECTIVES | {"train_gpt2", "train_scaling"}
    page = (run_dir / "report.html").read_text()
    assert page.count('<svg class="chart busbw"') == 2  # one chart per node: the run across nodes
    assert "4 ranks over 2 nodes" in page
    assert "benchmark_multinode.train_gpt2" in page and "benchmark_multinode.train_scaling" in page
    md = (run_dir / "report.md").read_text()
    assert md.count("| `benchmark_multinode.train_gpt2` |") == 2, md  # a row in each node's folded skips
    assert md.count("| `benchmark_multinode.train_scaling` |") == 2, md
    assert re.search(r"GPT-2-small training on 2 GPU\(s\) over 2 nodes [0-9]+ tokens/s/GPU; CPU run", md), md
    assert not _leftover_workers()


def test_a_node_that_never_comes_makes_both_stop_within_the_timeout(tmp_path):
    """node-b dials a port nobody listens on: node-a waits for it, both are killed at the timeout. The training
    gate across the nodes then does not wait out a second timeout: it says the run could not meet for NCCL."""
    port = free_port()
    inventory = two_node_inventory(
        tmp_path, port, {"gpufleet_benchmarks": ["train_gpt2"]}, gpufleet_nccl_master_port=free_port()
    )
    timeout_s = 16
    t0 = time.monotonic()
    proc, run_dir = run_validate(tmp_path, "-e", f"gpufleet_nccl_timeout_s={timeout_s}", inventory=str(inventory))
    elapsed = time.monotonic() - t0
    out = output(proc)
    assert proc.returncode != 0, out

    for host in ("node-a", "node-b"):
        doc = host_doc(run_dir, host)
        multi = [r for r in doc["results"] if r["group"] == "benchmark_multinode"]
        assert [r["check"] for r in multi] == ["nccl", "train_gpt2"], (host, multi)
        res, train = multi
        assert train["status"] == "skip", train
        assert train["reason"] == (
            "no training run across nodes: the NCCL run across nodes did not finish on node-a, node-b"
            " (benchmark_multinode.nccl says why)"
        ), train
        assert res["status"] in ("fail", "error"), res
        assert "timed out" in res["reason"] or "timeout" in res["reason"], res
        assert res["remedy"]
        assert "log_tail" in res["detail"] or "stderr" in res["detail"], res["detail"]
        assert res["detail"]["multinode"]["members"] == ["node-a", "node-b"]
        assert {r["group"] for r in doc["results"]} >= {"gpu_inventory", "gpu_health", "host_hygiene"}
    report = json.loads((run_dir / "report.json").read_text())
    assert "benchmark_multinode.nccl" in " ".join(
        f"{r['group']}.{r['check']}" for r in report["nodes"]["node-a"]["results"] if r["status"] in ("fail", "error")
    )
    # Bounded by the timeout (plus the checks and the polling), not by torchrun's own rendezvous limit.
    assert elapsed < timeout_s + 90, elapsed
    assert not _leftover_workers()


def test_an_unreachable_node_is_left_out_and_the_others_run_without_it(tmp_path):
    """deadnode comes first in inventory order but cannot be reached: node-a becomes the master, and
    deadnode's document says it was left out of the run. deadnode and node-b want the training gate across
    nodes, node-a does not: no training run, and each says why."""
    if shutil.which("ssh") is None:
        pytest.skip("the ssh client is needed to try a node over ssh (Debian: apt-get install openssh-client)")
    inventory = two_node_inventory(tmp_path, free_port())
    doc = yaml.safe_load(inventory.read_text())
    hosts = doc["all"]["children"]["gpu_nodes"]["hosts"]
    hosts["node-b"]["gpufleet_benchmarks"] = ["train_gpt2"]
    doc["all"]["children"]["gpu_nodes"]["hosts"] = {
        "deadnode": {
            "ansible_connection": "ssh",
            "ansible_host": "127.0.0.1",
            "ansible_port": 1,
            "ansible_ssh_common_args": "-o ConnectTimeout=5 -o BatchMode=yes",
            "gpufleet_benchmarks": ["train_gpt2"],
        },
        **hosts,
    }
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc, run_dir = run_validate(tmp_path, inventory=str(inventory))
    out = output(proc)
    assert proc.returncode != 0, out

    note, train_note = [r for r in host_doc(run_dir, "deadnode")["results"] if r["group"] == "benchmark_multinode"]
    assert note["status"] == "skip" and note["check"] == "nccl"
    assert (
        note["reason"]
        == "left out of the NCCL run across nodes: the node did not answer; the run covered node-a, node-b"
    )
    assert train_note["status"] == "skip" and train_note["check"] == "train_gpt2"
    assert (
        train_note["reason"]
        == "left out of the training run across nodes: the node did not answer; the run covered node-a, node-b"
    )
    (lacking,) = [
        r
        for r in host_doc(run_dir, "node-b")["results"]
        if r["check"] == "train_gpt2" and r["group"] == "benchmark_multinode"
    ]
    assert lacking["status"] == "skip" and lacking["reason"] == (
        "no training run across nodes: gpufleet_benchmarks of node-a does not include train_gpt2, and the run across nodes needs it on every node"
    )
    assert not [r for r in host_doc(run_dir, "node-a")["results"] if r["check"].startswith("train")]
    for host, rank in (("node-a", 0), ("node-b", 1)):
        multi = {r["check"]: r for r in host_doc(run_dir, host)["results"] if r["group"] == "benchmark_multinode"}
        assert set(multi) >= COLLECTIVES, (host, multi)
        mn = multi["nccl_all_reduce"]["detail"]["multinode"]
        assert mn["master"] == "node-a" and mn["node_rank"] == rank
        assert mn["left_out"] == {"deadnode": "the node did not answer"}
        assert multi["nccl_all_reduce"]["detail"]["world_size"] == 4
    md = (run_dir / "report.md").read_text()
    assert "left out of the NCCL run across nodes: the node did not answer" in md
