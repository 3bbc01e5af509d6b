"""Run folders for the report's picture and browser tests, made from what real GPUs recorded (docs/results/), and
a synthetic fleet of many nodes (tests/test_fleet_synthetic.py's builders).

    one_gpu(reports)         a pass: 1 x H100, the acceptance tier (`make validate`,
                             docs/results/2026-11-26-h100-x1-make-validate)
    one_gpu_soak(reports)    a slowed soak: 1 x H100, 21 windows of 30 s with its clocks held at the power cap for all
                             640 s (docs/results/2026-11-23-h100-x1-fleet/soak.json)
    four_gpus(reports)       4 x H200, three acceptance runs of one machine
                             (docs/results/2026-11-27-h200-x4-acceptance-series, call 1): the first is the baseline, the
                             third is reported with the first two as its past (the store) and the first as its baseline
    disturbed_soak(reports)  2 x H200, a soak whose window 0 had another process on GPU 0, measured again, from before
                             the judge joined the windows measured again (docs/results/2026-11-26-h200-x2-moved-paths)
    host_soak(reports)       2 x H200, a soak beside a matmul on GPU 1 whose process also took 14.7% of the host's
                             CPUs as it started, its windows measured again and joined
                             (docs/results/2026-11-28-h200-x2-one-judge-soaks, call b2)
    hardware_failure(reports)  2 x H200, a confirmed hardware failure: the data loader 32.5% and the host memory
                             triad 20.8% below the baseline run right before it, measured twice
                             (docs/results/2026-11-28-one-judge-host-steal, call c2)
    environment_failure(reports)  2 x H200, an environment failure: ten busy processes of another user on the host
                             while the matmul ran (docs/results/2026-11-28-h200-x2-one-judge-soaks, call b2)
    fleet(reports, n)        n synthetic 8 x H100 nodes within about 1.5% of each other, their matmul and memory
                             figures judged by the node's own judge (checks.benchmarks through measure.watched, a
                             figure past a limit measured again and reading the same): n0007's GPU 3 20% slow in bf16
                             matmul, n0011's HBM 30% slow, n0023 an uncorrectable ECC error (a finding: it stands),
                             n0031 an fp8 figure measured once under its limit (not confirmed), n0043 the same figure
                             measured again (confirmed)
"""

from __future__ import annotations

import json
import random
import tarfile
from pathlib import Path

from gpufleet import report
from gpufleet.base import profiles, schema
from gpufleet.bench import summarize
from gpufleet.benchmarks.matmul import matmul_judge
from gpufleet.benchmarks.memory import memory_judge
from gpufleet.comparisons.metric_keys import DTYPES
from gpufleet.comparisons.node import Held
from gpufleet.node.measure import watched

import calibration_runs
import test_fleet_synthetic as synth

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
ONE_GPU = RESULTS / "2026-11-26-h100-x1-make-validate" / "run" / "hosts" / "localhost.json"
ONE_GPU_SOAK = RESULTS / "2026-11-23-h100-x1-fleet" / "soak.json"
FOUR_GPUS = RESULTS / "2026-11-27-h200-x4-acceptance-series" / "call1-tiers.tar.gz"
FOUR_GPU_RUNS = ("after-1-1", "after-1-3", "after-1-5")
DISTURBED_SOAK = RESULTS / "2026-11-26-h200-x2-moved-paths" / "steps.tar.gz"
B2 = RESULTS / "2026-11-28-h200-x2-one-judge-soaks" / "b2-runs.tar.gz"
C2 = RESULTS / "2026-11-28-one-judge-host-steal" / "c2-runs.tar.gz"
HOST_SOAK, ENVIRONMENT = "after-052137-soak_90_gpu_35_15", "after-052643-acc_cpu_5_60"
C2_BASELINE, C2_FAILED = "after-085237-acc", "after-085414-acc"
H100 = "NVIDIA H100 80GB HBM3"
SLOW_GPU, SLOW_HBM, ECC, UNCONFIRMED, CONFIRMED = "n0007", "n0011", "n0023", "n0031", "n0043"


def write(reports: Path, run_id: str, host_docs: dict[str, bytes]) -> Path:
    run = reports / run_id
    (run / "hosts").mkdir(parents=True)
    for host, raw in host_docs.items():
        (run / "hosts" / f"{host}.json").write_bytes(raw)
    return run


def member(tar_path: Path, name: str) -> bytes:
    with tarfile.open(tar_path) as tar:
        return tar.extractfile(name).read()


def one_gpu(reports: Path) -> Path:
    run = write(reports, "h100-x1", {"localhost": ONE_GPU.read_bytes()})
    report.build(run)
    return run


def one_gpu_soak(reports: Path) -> Path:
    run = write(reports, "h100-x1-soak", {"localhost": ONE_GPU_SOAK.read_bytes()})
    report.build(run)
    return run


def four_gpus(reports: Path) -> Path:
    for run_id in FOUR_GPU_RUNS:
        doc = member(FOUR_GPUS, f"./reports-after/{run_id}/hosts/localhost.json")
        run = write(reports, run_id, {"localhost": doc})
        report.build(run, baseline=None if run_id == FOUR_GPU_RUNS[0] else FOUR_GPU_RUNS[0])
    return run


def disturbed_soak(reports: Path) -> Path:
    run = write(reports, "h200-x2-soak", {"localhost": member(DISTURBED_SOAK, "soak/soak.json")})
    report.build(run)
    return run


def _recorded(tar_path: Path, run_id: str) -> bytes:
    return member(tar_path, f"reports-after/{run_id}/hosts/localhost.json")


def host_soak(reports: Path) -> Path:
    run = write(reports, HOST_SOAK, {"localhost": _recorded(B2, HOST_SOAK)})
    report.build(run)
    return run


def hardware_failure(reports: Path) -> Path:
    """The failed run reported against the clean run right before it, its baseline (as the call set it)."""
    for run_id in (C2_BASELINE, C2_FAILED):
        run = write(reports, run_id, {"localhost": _recorded(C2, run_id)})
        report.build(run, baseline=None if run_id == C2_BASELINE else C2_BASELINE)
    return run


def environment_failure(reports: Path) -> Path:
    run = write(reports, ENVIRONMENT, {"localhost": _recorded(B2, ENVIRONMENT)})
    report.build(run)
    return run


def _failed_figure(trust: str) -> dict:
    res = schema.result(
        "matmul_fp8",
        schema.FAIL,
        f"GPU 5 fp8 matmul 900 TFLOPS, under 1000 (trust {trust})",
        value=900.0,
        unit="TFLOPS",
        threshold={"key": "matmul_fp8_tflops_min", "value": 1000, "min": 1000, "source": "test"},
        trust=trust,
    )
    return dict(res, group="benchmark", started="2026-11-21T10:01:00Z", seconds=1.0)


def _spread(i: int, gpus: list[dict]) -> dict:
    """Healthy variation from node to node (the synthetic GPUs of tests/test_fleet_synthetic.py vary only from GPU
    to GPU): each node's matmul and HBM figures within about 1.5% of the fleet's, drawn from a fixed seed."""
    rng = random.Random(i)
    mm, hbm = (min(1.015, max(0.985, rng.gauss(1.0, 0.005))) for _ in range(2))
    return {
        **{("matmul_bf16_tflops", g["index"]): mm for g in gpus},
        **{("hbm_copy_gbps", g["index"]): hbm for g in gpus},
    }


def _samples(value: float) -> dict:
    """Five timed samples within 0.4% of the figure, as a quiet GPU times them (the quick tier times 20: five keep
    a fleet of 1,000 nodes quick to judge)."""
    return summarize([value * (1 + 0.004 * (i / 4 - 0.5)) for i in (0, 3, 1, 4, 2)])


def _monitor(gpus: list[dict]) -> dict:
    """What a quiet step's sampler saw: nothing but the GPUs themselves."""
    per_gpu = {
        str(g["index"]): {"pci_bus_id": g["pci_bus_id"], "reasons": [], "throttled": [], "causes": []} for g in gpus
    }
    return {"samples": 40, "interval_s": 0.2, "error": None, "per_gpu": per_gpu, "processes": [], "foreign": [],
            "processes_unreadable": {}}  # fmt: skip


def _outputs(results: list[dict], gpus: list[dict]) -> tuple[dict, dict]:
    """The matmul and memory benchmarks' outputs (benchmarks.matmul, benchmarks.memory) again, from a synthetic node's figures."""
    mm = next(r for r in results if r["check"] == "matmul_bf16")["detail"]["per_gpu"]
    mem = next(r for r in results if r["check"] == "hbm_bandwidth")["detail"]["per_gpu"]
    ident = {
        cuda: {"uuid": f["uuid"], "pci_bus_id": g["pci_bus_id"], "name": g["name"]}
        for (cuda, f), g in zip(mm.items(), gpus)
    }
    per = {
        cuda: {**{d: {"tflops": f[d], "per_shape": []} for d in DTYPES}, "device": ident[cuda]}
        for cuda, f in mm.items()
    }
    for cuda, f in mm.items():
        per[cuda]["bf16"]["samples_tflops"] = _samples(f["bf16"])
    summary = {d: {"tflops_min": min(p[d]["tflops"] for p in per.values())} for d in DTYPES}
    bf16 = [p["bf16"]["tflops"] for p in per.values()]
    summary["bf16"]["spread_pct"] = round(100 * (max(bf16) - min(bf16)) / max(bf16), 2)
    matmul = {"benchmark": "matmul", "device": "cuda", "method": {"dtypes": list(DTYPES), "tier": "quick"},
              "versions": {}, "summary": summary, "per_device": per, "monitor": _monitor(gpus)}  # fmt: skip
    hbm = {
        cuda: {**{k: v for k, v in h.items() if k != "samples_gbps"}, "samples_gbps": _samples(h["hbm_copy_gbps"]),
               "pci_bus_id": ident[cuda]["pci_bus_id"]}
        for cuda, h in mem["hbm"].items()
    }  # fmt: skip
    pcie = {
        cuda: {**p, "samples_h2d_gbps": _samples(p["h2d_gbps"]), "samples_d2h_gbps": _samples(p["d2h_gbps"]),
               "pci_bus_id": ident[cuda]["pci_bus_id"]}
        for cuda, p in mem["pcie"].items()
    }  # fmt: skip
    memory = calibration_runs.memory_of(hbm, pcie, _monitor(gpus))
    return matmul, memory


def judged(doc: dict, profile: dict) -> dict:
    """A synthetic node's matmul and memory results as its own judge gives them: checks.benchmarks through
    measure.watched, the figures held against their siblings as the node's stage holds them (comparisons.node.Held),
    a figure past a limit measured again (the same figures: a slow GPU stays slow)."""
    gpus = doc["results"][0]["detail"]["inventory"]["gpus"]
    matmul, memory = _outputs(doc["results"], gpus)
    hold = Held(None, profile, gpus, doc["host"])
    new = []
    for step, out, judge in (("matmul", matmul, matmul_judge.matmul), ("memory", memory, memory_judge.memory)):
        outputs = iter([out, out, out])
        new += [dict(r, group="benchmark", started=doc["started"], seconds=1.0)
                for r in watched(step, lambda it=outputs: next(it), judge, profile, log=[], hold=hold)]  # fmt: skip
    replaced = {"matmul_bf16", "hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_d2h_bandwidth"}
    kept = [r for r in doc["results"] if not (r.get("group") == "benchmark" and r["check"] in replaced)]
    first_nccl = next(i for i, r in enumerate(kept) if r["check"].startswith("nccl_"))
    return {**doc, "results": kept[:first_nccl] + new + kept[first_nccl:]}


def fleet_docs(n: int) -> dict[str, dict]:
    profile = profiles.resolve(H100, overrides={"gpus_expected": 8})
    docs = {}
    for i in range(n):
        host, gpus = f"n{i:04d}", synth.gpus_of(i)
        kw: dict = {"factors": _spread(i, gpus)}
        if host == SLOW_GPU:
            kw["factors"][("matmul_bf16_tflops", 3)] *= 0.8
        elif host == SLOW_HBM:
            kw["factors"].update({("hbm_copy_gbps", g["index"]): 0.7 for g in gpus})
        elif host == ECC:
            kw["extra"] = [synth.ecc_failure(gpus[2])]
        elif host == UNCONFIRMED:
            kw["extra"] = [_failed_figure(schema.CLEAN)]
        elif host == CONFIRMED:
            kw["extra"] = [_failed_figure(schema.CONFIRMED)]
        doc = synth.node_doc(host, i, gpus=gpus, read_at=("2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"), **kw)
        docs[host] = judged(doc, profile)
    return docs


def fleet(reports: Path, n: int = 1000) -> Path:
    """A fleet of n nodes reported without a store (no history to build: the picture is of this run's fleet)."""
    docs = fleet_docs(n)
    run = synth.write_run(reports, f"fleet-{n}", docs)
    report.build(run, use_store=False)
    return run


def report_json(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())
