"""Run folders for the report's picture and browser tests, made from what real GPUs recorded (docs/results/), and
a synthetic fleet of many nodes (tests/test_fleet_synthetic.py's builders).

    one_gpu(reports)         1 x H100, the acceptance tier (`make validate`,
                             docs/results/2026-11-26-h100-x1-make-validate)
    one_gpu_soak(reports)    1 x H100, a soak of 21 windows of 30 s (docs/results/2026-11-23-h100-x1-fleet/soak.json)
    four_gpus(reports)       4 x H200, three acceptance runs of one machine
                             (docs/results/2026-11-27-h200-x4-acceptance-series, call 1): the first is the baseline, the
                             third is reported with the first two as its past (the store) and the first as its baseline
    disturbed_soak(reports)  2 x H200, a soak whose window 0 had another process on GPU 0, measured again
                             (docs/results/2026-11-26-h200-x2-moved-paths, soak/soak.json)
    fleet(reports, n)        n synthetic 8 x H100 nodes within about 1.5% of each other: n0007's GPU 3 20% slow in
                             bf16 matmul, n0011's HBM 30% slow, n0023 an uncorrectable ECC error (a finding: it
                             stands), n0031 an fp8 figure measured once under its limit (not confirmed), n0043 the same
                             figure measured again (confirmed)
"""

from __future__ import annotations

import json
import random
import tarfile
from pathlib import Path

from gpufleet import report
from gpufleet.base import schema

import test_fleet_synthetic as synth

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
ONE_GPU = RESULTS / "2026-11-26-h100-x1-make-validate" / "run" / "hosts" / "localhost.json"
ONE_GPU_SOAK = RESULTS / "2026-11-23-h100-x1-fleet" / "soak.json"
FOUR_GPUS = RESULTS / "2026-11-27-h200-x4-acceptance-series" / "call1-tiers.tar.gz"
FOUR_GPU_RUNS = ("after-1-1", "after-1-3", "after-1-5")
DISTURBED_SOAK = RESULTS / "2026-11-26-h200-x2-moved-paths" / "steps.tar.gz"
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


def fleet_docs(n: int) -> dict[str, dict]:
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
        docs[host] = synth.node_doc(host, i, gpus=gpus, read_at=("2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"), **kw)
    return docs


def fleet(reports: Path, n: int = 1000) -> Path:
    """A fleet of n nodes reported without a store (no history to build: the picture is of this run's fleet)."""
    docs = fleet_docs(n)
    run = synth.write_run(reports, f"fleet-{n}", docs)
    report.build(run, use_store=False)
    return run


def report_json(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())
