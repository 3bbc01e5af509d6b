"""Calibration node-runs for the CPU tests, in the format tools/gpu_calibrate.py appends, until real ones arrive.

Each node document starts from a recorded one: the quick tier's host document of one H100 80GB HBM3
(docs/results/2026-11-23-h100-x1-fleet, fleet-A.tar.gz, the baseline run), whose checks are kept as they were.
Its benchmark figures become four GPUs' with the figures issue 28 reports of a healthy 4 x H100: plain torch bf16
matmul per GPU 741.4, 764.9, 775.8 and 752.8 TFLOPS (GPU 0 steadily below the others), the quick tier's GPU 0 at
732.7 against a node median of 781.7, and one device-to-host PCIe sample of GPU 0 at 31.03 GB/s, 43% below its
median of 54.72, on a quiet GPU. The timed samples are spread as the recorded GPU's were (bf16 about 5%, HBM 2.6%,
PCIe about 1%); the outputs are built as benchmarks.matmul and benchmarks.memory build them and judged by checks.benchmarks.
A disturbed run has a foreign process on GPU 1 while seven of its HBM samples fall about a third below their
3.0 TB/s median (the H200 field report's fall: 2.9 TB/s around 4.28 TB/s, 32% below).
"""

from __future__ import annotations

import copy
import json
import tarfile
from functools import lru_cache
from pathlib import Path

from gpufleet.base import profiles
from gpufleet.bench import summarize
from gpufleet.benchmarks.matmul import matmul_judge
from gpufleet.benchmarks.memory import memory_judge
from gpufleet.node.measure import foreign_processes

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "docs/results/2026-11-23-h100-x1-fleet/fleet-A.tar.gz"
MEMBER = "extra/reports/baseline/hosts/localhost.json"
MODEL = "NVIDIA H100 80GB HBM3"
UUIDS = [f"GPU-c6fd56ed-d066-0df8-36f9-70bb02825b3{i}" for i in range(4)]
EPOCH, T0 = 1795428000.0, 1000.0
# The issue's figures: torch bf16 per GPU on a healthy 4 x H100, and the quick tier's GPU 0 against the node median.
TORCH_BF16 = [741.4, 764.9, 775.8, 752.8]
QUICK_BF16 = [732.7, 778.0, 781.7, 785.4]
PCIE_D2H_MEDIAN, PCIE_LOW = 54.72, 31.03
DISTURB = {"pid": 2002, "name": "gpu_disturb", "used_memory_mib": 1002}


@lru_cache(maxsize=1)
def recorded() -> dict:
    with tarfile.open(RECORDING) as tar:
        return json.load(tar.extractfile(MEMBER))


def samples(median: float, spread_pct: float, n: int = 20, low: dict | None = None) -> dict:
    """n timed samples around median, spread as given, in a fixed order; low {position: value} replaces some."""
    values = [median * (1 + spread_pct / 100 * (((i * 7) % n) / (n - 1) - 0.5)) for i in range(n)]
    for i, v in (low or {}).items():
        values[i] = v
    return {**summarize(values), "ends_s": [round(T0 + 0.5 + 0.1 * i, 3) for i in range(n)]}


def monitor(foreign: list | None = None) -> dict:
    per_gpu = {
        str(i): {
            "pci_bus_id": f"0000:{0x18 + i:02x}:00.0",
            "reasons": ["sw_power_cap"],
            "reasons_mask": 4,
            "throttled": [],
            "causes": [],
            "temperature_max_c": 67,
            "sm_clock_min_mhz": 1755,
            "power_max_w": 690.0,
        }
        for i in range(4)
    }
    procs = [dict(p, index=1, own=False, first_s=0.7, last_s=2.3, samples=9) for p in foreign or []]
    return {
        "samples": 40,
        "interval_s": 0.2,
        "error": None,
        "per_gpu": per_gpu,
        "started_epoch": EPOCH,
        "started_monotonic": T0,
        "processes": procs,
        "foreign": procs,
        "processes_unreadable": {},
    }


def _device(i: int) -> dict:
    return {"name": MODEL, "pci_bus_id": f"0000:{0x18 + i:02x}:00", "uuid": UUIDS[i]}


def matmul_output(bf16: list[float], mon: dict) -> dict:
    per = {}
    for i, v in enumerate(bf16):
        s = samples(v, 5.15)
        per[str(i)] = {
            "bf16": {"tflops": v, "samples_tflops": s, "per_shape": []},
            "fp16": {"tflops": round(v * 0.92, 1), "per_shape": []},
            "tf32": {"tflops": round(v * 0.493, 1), "per_shape": []},
            "fp8": {"tflops": round(v * 1.65, 1), "per_shape": []},
            "device": _device(i),
        }
    summary = {d: {"tflops_min": min(p[d]["tflops"] for p in per.values())} for d in ("bf16", "fp16", "tf32", "fp8")}
    summary["bf16"]["spread_pct"] = round(100 * (max(bf16) - min(bf16)) / max(bf16), 2)
    return {
        "benchmark": "matmul",
        "device": "cuda",
        "method": {"dtypes": ["bf16", "fp16", "tf32", "fp8"], "tier": "quick"},
        "versions": {},
        "summary": summary,
        "per_device": per,
        "monitor": mon,
    }


def memory_output(mon: dict, d2h_low: dict | None = None, hbm_low: dict | None = None) -> dict:
    """d2h_low / hbm_low: {gpu: {sample position: value}}."""
    hbm, pcie = {}, {}
    for i in range(4):
        dev = _device(i)
        h = samples(3008.0, 2.61, low=(hbm_low or {}).get(i))
        hbm[str(i)] = {
            "hbm_copy_gbps": round(h["median"], 1),
            "samples_gbps": h,
            "bytes": 4 << 30,
            "correct": True,
            "uuid": dev["uuid"],
            "pci_bus_id": dev["pci_bus_id"],
        }
        up, down = samples(54.81, 0.72), samples(PCIE_D2H_MEDIAN, 1.17, low=(d2h_low or {}).get(i))
        pcie[str(i)] = {
            "h2d_gbps": round(up["median"], 2),
            "d2h_gbps": round(down["median"], 2),
            "samples_h2d_gbps": up,
            "samples_d2h_gbps": down,
            "bytes": 1 << 30,
            "correct": True,
            "uuid": dev["uuid"],
            "pci_bus_id": dev["pci_bus_id"],
        }
    return memory_of(hbm, pcie, mon)


def memory_of(hbm: dict, pcie: dict, mon: dict) -> dict:
    """benchmarks.memory's output of these copies per CUDA device (`hbm`, `pcie`), with its summary."""
    return {
        "benchmark": "memory",
        "device": "cuda",
        "method": {"tier": "quick"},
        "summary": {
            "hbm_copy_gbps_min": min(v["hbm_copy_gbps"] for v in hbm.values()),
            "h2d_gbps_min": min(v["h2d_gbps"] for v in pcie.values()),
            "d2h_gbps_min": min(v["d2h_gbps"] for v in pcie.values()),
        },
        "per_device": {"hbm": hbm, "pcie": pcie},
        "monitor": mon,
    }


def document(
    node: str,
    bf16: list[float],
    *,
    d2h_low: dict | None = None,
    hbm_low: dict | None = None,
    foreign: list | None = None,
) -> dict:
    """A node document of four GPUs: the recorded checks, these benchmark figures judged by today's checks."""
    profile = profiles.resolve(MODEL, overrides={"gpus_expected": 4})
    doc = copy.deepcopy(recorded())
    mon = monitor(foreign)
    bench = matmul_judge.matmul(matmul_output(bf16, monitor()), profile) + memory_judge.memory(
        memory_output(mon, d2h_low, hbm_low), profile
    )
    bench.append(
        foreign_processes(
            "memory",
            [{"step": "memory", "attempt": 1, "device": "cuda", "foreign": mon["foreign"], "started_epoch": EPOCH}],
        )
    )
    bench = [r.replace(group="benchmark", started=doc["started"], seconds=10.0) for r in bench]
    doc["results"] = [_four_gpus(r) for r in doc["results"] if r["group"] != "benchmark"] + bench
    doc["host"] = node
    doc["profile"] = {
        k: profile.get(k) for k in ("name", "path", "thresholds", "calibration")
    }  # as today's engine writes it
    return doc


def _four_gpus(res: dict) -> dict:
    """The recorded GPU's inventory entry and counter snapshots, once for each of the four GPUs."""
    detail = res.get("detail") or {}
    listed = (detail.get("inventory") or {}).get("gpus") if res["check"] == "gpu_count" else detail.get("gpus")
    if res["check"] not in ("gpu_count", "snapshot_before", "snapshot_after") or not listed:
        return res
    four = [
        dict(listed[0], index=i, uuid=UUIDS[i], serial=f"16527240681{i:02d}", pci_bus_id=f"0000:{0x18 + i:02x}:00.0")
        for i in range(4)
    ]
    if res["check"] == "gpu_count":
        return {**res, "detail": {**detail, "inventory": {**detail["inventory"], "gpus": four}}}
    return {**res, "detail": {**detail, "gpus": four}}


def row(doc: dict, round_id: str, condition: str = "clean", report: dict | None = None) -> dict:
    disturbed = condition == "disturbed"
    return {
        "format": "gpufleet-calibration/1",
        "round": round_id,
        "node": doc["host"],
        "layout": "node",
        "seed": 1,
        "machine": {
            "gpu_model": MODEL,
            "gpus_on_machine": 4,
            "node_gpus": [0, 1, 2, 3],
            "driver": "580.159.04",
            "host": "h100-x4",
        },
        "commit": "0" * 40,
        "condition": condition,
        "node_affected": disturbed,
        "disturbance": {"kind": "memcopy", "gpus": [1], "pids": [DISTURB["pid"]], "user": None} if disturbed else None,
        "wall_s": 113.0,
        "document": doc,
        "report": report or {"verdict": "pass", "not_passing": []},
    }


# What the run of the issue said of the healthy node: three warnings, none of them a fault.
ISSUE_REPORT = {
    "verdict": "warn",
    "not_passing": [
        {
            "check": "pcie_d2h_bandwidth",
            "group": "benchmark",
            "status": "warn",
            "class": "hardware",
            "reason": "inconclusive: one of 20 samples on GPU 0 was 31.03 GB/s, 43% below its median of 54.72 GB/s",
        },
        {
            "check": "gpu_vs_node",
            "group": "fleet",
            "status": "warn",
            "class": "hardware",
            "reason": "GPU 0 bf16 matmul 732.7 TFLOPS is 6.3% below the node median 781.7 (threshold 5%)",
        },
        {
            "check": "sample_spread",
            "group": "fleet",
            "status": "warn",
            "class": "environment",
            "reason": "GPU 0 PCIe device-to-host samples spread 44%",
        },
    ],
}


def runs(clean: int = 8, disturbed: int = 2) -> list[dict]:
    """`clean` rounds of the healthy 4 x H100 (GPU 0 below its siblings; its PCIe sample low in every other round,
    at a different position), then `disturbed` rounds with a foreign process on GPU 1 while its HBM samples fall."""
    out = []
    for k in range(clean):
        jitter = 1 + 0.004 * ((k % 3) - 1)
        bf16 = [round(v * jitter, 1) for v in (QUICK_BF16 if k % 2 else TORCH_BF16)]
        low = {0: {(3 * k) % 20: PCIE_LOW}} if k % 2 == 0 else None
        out.append(
            row(document("node", bf16, d2h_low=low), f"r{k:03d}-node-clean", report=ISSUE_REPORT if low else None)
        )
    for k in range(clean, clean + disturbed):
        fall = {1: {i: 2000.0 + 20 * i for i in range(5, 12)}}
        doc = document("node", TORCH_BF16, hbm_low=fall, foreign=[DISTURB])
        rep = {
            "verdict": "fail",
            "not_passing": [
                {
                    "check": "memory_processes",
                    "group": "benchmark",
                    "status": "fail",
                    "class": "environment",
                    "reason": "pid 2002 (gpu_disturb, 1002 MiB)",
                }
            ],
        }
        out.append(row(doc, f"r{k:03d}-node-memcopy", "disturbed", rep))
    return out


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
