"""Silent data corruption: the benchmark on the CPU (real processes, real hashes), the node's majority over its
GPUs, and the fleet's over nodes and runs through the store, with one corrupt GPU planted."""

from __future__ import annotations

import copy
import json

import pytest

from gpufleet.node import host_documents
from gpufleet import report
from gpufleet.benchmarks.sdc import sdc_measure as bench_sdc
from gpufleet.benchmarks.sdc import sdc_judge as sdc_check
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.fleet.store import Store

from sdc_runs import BAD, COMPUTATIONS, VERSIONS, gpu_out, good, node_result
from test_fleet_synthetic import gpus_of, node_doc, write_run

R1, R2, R3 = "2026-11-20T10:00:00Z", "2026-11-21T10:00:00Z", "2026-11-22T10:00:00Z"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# The engine runs these on the CPU only where there is no GPU; on a GPU machine it measures the GPUs instead
# (tools/gpu_sdc_check.py and the GPU results cover that).
cpu_run = pytest.mark.skipif(_has_cuda(), reason="a CPU run of the engine: this machine has a GPU")


# ---------------------------------------------------------------- the benchmark itself, on the CPU


@pytest.mark.slow
@cpu_run
def test_cpu_run_compares_hashes_across_two_processes():
    doc = host_documents.bench_host(["sdc"], host="cpu-node")
    (res,) = doc["results"]
    assert res["group"] == "benchmark" and res["check"] == "sdc"
    assert res["status"] == "skip" and CPU_NOTE in res["reason"] and res["detail"]["would_be"] == "pass", res
    per = res["detail"]["per_gpu"]
    assert sorted(per) == ["cpu0", "cpu1"]  # two processes, each its own torch
    assert per["cpu0"]["hashes"] == per["cpu1"]["hashes"] and set(per["cpu0"]["hashes"]) == set(COMPUTATIONS)
    assert all(len(h) == 64 for h in per["cpu0"]["hashes"].values())
    assert all(n == 0 for g in per.values() for n in g["repeats_differing"].values())
    comp = per["cpu0"]["comparable"]
    assert comp["torch"] and comp["tf32"] is False and comp["sdc_version"] == bench_sdc.SDC_VERSION
    # The same seeded computation in this process gives the same bytes: the hash is of the output, not the run.
    assert bench_sdc.measure_device(None, "cpu")["hashes"] == per["cpu0"]["hashes"]
    assert res["detail"]["method"]["computed_in"] == "its own processes" and res["detail"]["method"]["processes"] == 2


@pytest.mark.slow
@cpu_run
def test_with_matmul_in_the_run_sdc_is_computed_in_the_matmul_workers():
    doc = host_documents.bench_host(["matmul", "sdc"], host="cpu-node")
    by_check = {r["check"]: r for r in doc["results"]}
    assert {"matmul_bf16", "sdc"} <= set(by_check), doc["results"]
    res = by_check["sdc"]
    assert res["group"] == "benchmark" and res["status"] == "skip" and res["detail"]["would_be"] == "pass", res
    method = res["detail"]["method"]
    assert method["computed_in"] == "the matmul workers" and method["processes"] == 2
    per = res["detail"]["per_gpu"]
    assert sorted(per) == ["cpu0", "cpu1"] and per["cpu0"]["hashes"] == per["cpu1"]["hashes"]
    # The same bytes as the computations alone in this process: the timed matmul before them changes nothing.
    assert bench_sdc.measure_device(None, "cpu")["hashes"] == per["cpu0"]["hashes"]
    # The matmul was measured in those workers, each its own figure; its result carries no SDC output.
    matmul_res = by_check["matmul_bf16"]
    assert matmul_res["status"] == "skip" and "sdc" not in json.dumps(matmul_res["detail"]), matmul_res


@pytest.mark.slow
@cpu_run
def test_matmul_run_computes_sdc_in_its_workers_only_when_asked():
    from gpufleet.benchmarks.matmul import matmul_measure as matmul

    out = matmul.run("smoke", sdc_depth="smoke")
    assert sorted(out["per_device"]) == ["cpu0", "cpu1"]
    assert all(v["bf16"]["tflops"] > 0 and "sdc" not in v for v in out["per_device"].values())
    sdc_out = out["sdc"]
    assert sdc_out["benchmark"] == "sdc" and sdc_out["method"]["computed_in"] == "the matmul workers"
    assert sdc_out["method"]["sdc_version"] == bench_sdc.SDC_VERSION and sdc_out["versions"]["torch"]
    assert set(sdc_out["per_device"]["cpu0"]["hashes"]) == set(COMPUTATIONS)
    alone = matmul.run("smoke")
    assert "sdc" not in alone and list(alone["per_device"]) == ["cpu"]
    # Where each worker's seconds went, so a step that grows shows why.
    assert all(set(v["phases_s"]) == {"barrier", "measure", "fixed_computations"} for v in out["per_device"].values())
    assert {"settings", "inputs", "hashes", *COMPUTATIONS} <= set(sdc_out["per_device"]["cpu0"]["phases_s"])


@pytest.mark.slow
def test_deterministic_algorithms_switch_on_without_loading_the_compiler():
    """torch.use_deterministic_algorithms imports torch._inductor's configuration (seconds of the matmul step on a
    GPU machine); the SDC computations switch torch's core on without it, and the switch is on."""
    import subprocess
    import sys

    code = (
        "import sys, torch; from gpufleet.benchmarks.sdc import sdc_measure as sdc; assert not torch.are_deterministic_algorithms_enabled(); "
        "sdc.deterministic_algorithms(torch); "
        "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(), "
        "'torch._inductor.config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False"]


# ---------------------------------------------------------------- one node: majority over its GPUs


def test_node_names_the_gpu_that_disagrees_with_the_majority():
    gpus = gpus_of(0)
    res = node_result(gpus, corrupt={5: "matmul_fp32"})
    assert res["status"] == "fail" and res["class"] == "hardware"
    assert res["reason"].startswith(
        f"matmul_fp32: GPU 5 ({gpus[5]['uuid']}) disagree(s) with the 7 of 8 GPUs that agree"
    )
    assert res["detail"]["flagged_gpus"] == [{"index": 5, "uuid": gpus[5]["uuid"], "serial": gpus[5]["serial"]}]
    clean = node_result(gpus)
    assert clean["status"] == "pass" and "8 GPUs" in clean["reason"] and clean["class"] is None


def test_node_without_a_majority_fails_without_naming_a_gpu():
    gpus = gpus_of(0, n=2)
    res = node_result(gpus, corrupt={1: "matmul_bf16"})
    assert res["status"] == "fail" and "no majority among GPU 0" in res["reason"] and "fleet.sdc" in res["reason"]
    assert "flagged_gpus" not in res["detail"]  # which one is wrong is for the fleet to say


def test_gpu_that_disagrees_with_itself_fails():
    gpus = gpus_of(0, n=1)
    res = node_result(gpus, differing={0: 3})
    assert (
        res["status"] == "fail"
        and f"gave 3 of {bench_sdc.REPEATS['gpu'] - 1} repeats of matmul_fp32 unlike its first" in res["reason"]
    )
    assert res["detail"]["flagged_gpus"][0]["uuid"] == gpus[0]["uuid"]
    alone = node_result(gpus)
    assert alone["status"] == "pass" and "1 GPU:" in alone["reason"] and "across nodes" in alone["reason"]


def test_gpus_of_another_cublas_are_not_compared():
    gpus = gpus_of(0, n=3)
    # GPU 2 runs another cuBLAS: its different hash is no fault, and it is not outvoted.
    res = node_result(gpus, corrupt={2: "matmul_bf16"}, cublas={2: "12.9.1"})
    assert res["status"] == "pass" and "not_compared" in res["detail"], res["reason"]


# ---------------------------------------------------------------- the fleet: across nodes and runs, through the store


def _doc(host: str, node_no: int, gpus: list[dict], started: str, **kw) -> dict:
    return node_doc(host, node_no, gpus=gpus, started=started, extra=[node_result(gpus, **kw)])


def _fleet_sdc(rep: dict, host: str) -> dict:
    return next(r for r in rep["nodes"][host]["results"] if r["group"] == "fleet" and r["check"] == "sdc")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """r1: four one-GPU nodes, n2's GPU corrupt. r2: n2 alone again, and n9 with another torch. r3: n2 repaired."""
    reports = tmp_path_factory.mktemp("reports")
    gpus = {i: gpus_of(i, n=1) for i in range(4)}
    docs = {f"n{i}": _doc(f"n{i}", i, gpus[i], R1, corrupt={0: "train_mlp"} if i == 2 else None) for i in range(4)}
    report.build(write_run(reports, "r1", docs))
    other = gpus_of(9, n=1)
    report.build(
        write_run(
            reports,
            "r2",
            {
                "n2": _doc("n2", 2, gpus[2], R2, corrupt={0: "train_mlp"}),
                "n9": _doc("n9", 9, other, R2, versions=dict(VERSIONS, torch="2.12.0+cu130")),
            },
        )
    )
    report.build(write_run(reports, "r3", {"n2": _doc("n2", 2, gpus[2], R3)}))
    load = lambda run: json.loads((reports / run / "report.json").read_text())  # noqa: E731
    return {"reports": reports, "gpus": gpus, "r1": load("r1"), "r2": load("r2"), "r3": load("r3")}


def test_fleet_names_the_corrupt_gpu_that_its_own_node_could_not(runs):
    n2 = runs["gpus"][2][0]
    node = next(r for r in runs["r1"]["nodes"]["n2"]["results"] if r["group"] == "benchmark" and r["check"] == "sdc")
    assert node["status"] == "pass"  # one GPU: nothing inside the node to outvote it
    res = _fleet_sdc(runs["r1"], "n2")
    assert res["status"] == "fail" and res["class"] == "hardware"
    assert res["reason"].startswith("GPU 0 (") and f"train_mlp sha256 {BAD[:12]}… against 3 of 4 GPUs" in res["reason"]
    assert res["detail"]["flagged_gpus"] == [{"index": 0, "uuid": n2["uuid"], "serial": n2["serial"]}]
    assert runs["r1"]["nodes"]["n2"]["verdict"] == "fail"
    for host in ("n0", "n1", "n3"):
        ok = _fleet_sdc(runs["r1"], host)
        assert ok["status"] == "pass" and "among 4 GPUs" in ok["reason"], ok
    assert any("NodeName=n2 " in line and "gpufleet hw sdc" in line for line in runs["r1"]["fleet"]["drain"])


def test_store_outvotes_a_corrupt_gpu_that_is_alone_in_its_run(runs):
    res = _fleet_sdc(runs["r2"], "n2")
    # n2 is the only H200 of these versions in r2; r1's GPUs, through the store, are the majority.
    assert res["status"] == "fail" and "against 3 of 4 GPUs" in res["reason"], res["reason"]
    returning = next(r for r in runs["r2"]["nodes"]["n2"]["results"] if r["check"] == "returning_gpu")
    assert returning["status"] == "warn" and "fleet.sdc fail (hardware)" in returning["reason"]


def test_other_versions_are_never_compared(runs):
    res = _fleet_sdc(runs["r2"], "n9")
    assert res["status"] == "skip" and "no other GPU of this model, driver, CUDA, torch and cuBLAS" in res["reason"]


def test_a_repaired_gpu_agrees_and_its_old_hash_no_longer_votes(runs):
    res = _fleet_sdc(runs["r3"], "n2")
    assert res["status"] == "pass" and "among 4 GPUs" in res["reason"], res[
        "reason"
    ]  # its r3 hash stands for it, not r1's
    with Store(runs["reports"] / "gpufleet.db") as store:
        rows = store.sdc_hashes(json.dumps(_fleet_comparable(runs), sort_keys=True), "train_mlp", "none")
        assert len(rows) == 6 and sum(r["sha256"] == BAD for r in rows) == 2  # r1 and r2 kept, as indexed


def _fleet_comparable(runs) -> dict:
    doc = json.loads((runs["reports"] / "r1" / "hosts" / "n0.json").read_text())
    res = next(r for r in doc["results"] if r["check"] == "sdc")
    return copy.deepcopy(res["detail"]["per_gpu"]["0"]["comparable"])


def test_a_gpu_that_did_not_finish_is_an_error_and_the_others_keep_their_hashes():
    gpus = gpus_of(0, n=2)
    out = gpu_out(gpus)
    out["per_device"]["1"] = {"error": "sdc on GPU 1 exited with code -9 without a result"}
    (res,) = sdc_check.results(out, {}, {"gpus": gpus, "driver_version": "580.95.05"})
    assert (
        res["status"] == "error" and res["class"] == "software" and "GPU 1" in res["reason"] and "-9" in res["reason"]
    )
    assert res["detail"]["per_gpu"]["0"]["hashes"]["matmul_bf16"] == good("matmul_bf16")
