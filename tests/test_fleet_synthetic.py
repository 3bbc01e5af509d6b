"""Synthetic fleets for the fleet layer's tests, built from what real GPUs recorded, copied and perturbed.

GPU identities (uuid, serial, PCI bus id) and counter values come from the recorded 8 x H100 readings
(tests/data/readings/h100-sxm-8gpu-healthy.json), each node given its own uuids and serials; the per-GPU
benchmark figures from the H100's quick tier (docs/results/2026-11-21-h100-x1/bench-quick.json), spread over 8
GPUs by at most +-0.8%; NCCL rows from the 2 x H200 run (docs/results/2026-11-21-h200-x2). Documents carry the
node side's new fields (per-GPU uuid, samples_tflops, spread_pct, counter snapshots, flagged_gpus) in the
formats of the work plan. The other fleet test files import the builders from here.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

from gpufleet.base import schema
from gpufleet.comparisons import metric_keys, metrics

ROOT = Path(__file__).resolve().parents[1]
READINGS = ROOT / "tests" / "data" / "readings"
RESULTS = ROOT / "docs" / "results"
COUNTER_NAMES = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "row_remap_correctable",
    "row_remap_uncorrectable",
    "row_remap_pending",
    "row_remap_failure",
    "nvlink_crc_data",
    "nvlink_crc_flit",
    "nvlink_replay",
    "nvlink_recovery",
    "pcie_replay",
    "xid",
)


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def h100_readings() -> dict:
    return copy.deepcopy(_load(READINGS / "h100-sxm-8gpu-healthy.json"))


def h100_bench() -> list[dict]:
    return copy.deepcopy(_load(RESULTS / "2026-11-21-h100-x1" / "bench-quick.json")["results"])


def h200_node() -> dict:
    return copy.deepcopy(_load(RESULTS / "2026-11-21-h200-x2" / "validate-report.json")["nodes"]["localhost"])


def h200_two_nodes() -> dict:
    return copy.deepcopy(
        _load(RESULTS / "2026-11-21-h200-x2-two-nodes" / "validate-two-nodes-after-fix" / "report.json")["nodes"]
    )


def _stamp(res: dict, group: str) -> dict:
    return dict(res, group=group, started="2026-11-21T21:00:00Z", seconds=0.1)


def gpus_of(node_no: int, n: int = 8) -> list[dict]:
    """The recorded H100s' identities, made this node's own: uuid and serial differ per node."""
    out = []
    for g in h100_readings()["nvml"]["gpus"][:n]:
        uuid = g["uuid"]
        out.append(
            {
                "index": g["index"],
                "uuid": f"GPU-{node_no:02x}{uuid[6:]}",
                "serial": f"{int(g['serial']) + 1000 * node_no}",
                "pci_bus_id": g["pci_bus_id"],
                "name": g["name"],
                "memory_total_mib": g["memory_total_mib"],
                "vbios": g["vbios_version"],
            }
        )
    return out


def recorded_counters(g: dict) -> dict:
    """The counters of one recorded NVML GPU, named as the counter snapshot names them."""
    links = g.get("nvlink") or []
    link_sum = lambda k: sum((lk.get("errors") or {}).get(k) or 0 for lk in links)  # noqa: E731
    rows = g.get("remapped_rows") or {}
    return {
        "ecc_corrected_volatile": g["ecc_volatile_corrected"],
        "ecc_uncorrected_volatile": g["ecc_volatile_uncorrected"],
        "ecc_corrected_aggregate": g["ecc_aggregate_corrected"],
        "ecc_uncorrected_aggregate": g["ecc_aggregate_uncorrected"],
        "row_remap_correctable": rows.get("correctable", 0),
        "row_remap_uncorrectable": rows.get("uncorrectable", 0),
        "row_remap_pending": int(bool(rows.get("pending"))),
        "row_remap_failure": int(bool(rows.get("failure"))),
        "nvlink_crc_data": link_sum("crc_data"),
        "nvlink_crc_flit": link_sum("crc_flit"),
        "nvlink_replay": link_sum("replay"),
        "nvlink_recovery": link_sum("recovery"),
        "pcie_replay": 0,
        "xid": 0,
    }


def snapshot(
    phase: str,
    gpus: list[dict],
    read_at: str,
    boot_id: str = "boot-1",
    counters: dict | None = None,
    visible: list[int] | None = None,
) -> dict:
    """A counters.snapshot_<phase> result: the recorded counters, with `counters[index][name]` in their place."""
    recorded = h100_readings()["nvml"]["gpus"]
    entries = []
    for g in gpus:
        values = recorded_counters(recorded[g["index"] % len(recorded)])
        values.update((counters or {}).get(g["index"], {}))
        entries.append(
            {
                "index": g["index"],
                "uuid": g["uuid"],
                "serial": g["serial"],
                "pci_bus_id": g["pci_bus_id"],
                "visible": visible is None or g["index"] in visible,
                "counters": values,
            }
        )
    return _stamp(
        schema.result(
            f"snapshot_{phase}",
            schema.PASS,
            f"counters of {len(gpus)} GPU(s) read",
            detail={"phase": phase, "read_at": read_at, "boot_id": boot_id, "gpus": entries, "unreadable": {}},
        ),
        "counters",
    )


def _factor(node_no: int, i: int) -> float:
    """Healthy variation: within +-0.8% from GPU to GPU and node to node."""
    return 1 + 0.004 * (((i * 7 + node_no * 3) % 5) - 2)


def _samples(value: float, spread_pct: float, n: int = 20) -> dict:
    lo, hi = value * (1 - spread_pct / 100 * 0.8), value * (1 + spread_pct / 100 * 0.2)
    return {"n": n, "min": lo, "median": value, "max": hi, "spread_pct": round((hi - lo) / value * 100, 2)}


def benchmark_results(
    node_no: int,
    gpus: list[dict],
    *,
    factors: dict | None = None,
    spreads: dict | None = None,
    with_uuid: bool = True,
    cpu: bool = False,
) -> list[dict]:
    """matmul, memory and NCCL results of one node: the recorded figures per GPU, perturbed.

    factors: {(metric key, NVML index): factor} on top of healthy variation; spreads: {(metric key, index): spread %}.
    """
    factors, spreads = factors or {}, spreads or {}
    bench = {r["check"]: r for r in h100_bench()}
    mm, mem = bench["matmul_bf16"], bench["hbm_bandwidth"]
    base_mm, base_hbm, base_pcie = (
        mm["detail"]["per_gpu"]["0"],
        mem["detail"]["per_gpu"]["hbm"]["0"],
        mem["detail"]["per_gpu"]["pcie"]["0"],
    )
    per_gpu, hbm, pcie = {}, {}, {}
    for cuda, g in enumerate(gpus):
        i, f = g["index"], _factor(node_no, g["index"])
        fig = {d: round(base_mm[d] * f * factors.get((f"matmul_{d}_tflops", i), 1.0), 1) for d in metric_keys.DTYPES}
        fig["error"] = None
        fig["samples_tflops"] = _samples(fig["bf16"], spreads.get(("matmul_bf16_tflops", i), 4.0))
        hb = round(base_hbm["hbm_copy_gbps"] * f * factors.get(("hbm_copy_gbps", i), 1.0), 1)
        h2d = round(base_pcie["h2d_gbps"] * f * factors.get(("pcie_h2d_gbps", i), 1.0), 2)
        d2h = round(base_pcie["d2h_gbps"] * f * factors.get(("pcie_d2h_gbps", i), 1.0), 2)
        hbm[str(cuda)] = {
            "bytes": base_hbm["bytes"],
            "correct": True,
            "hbm_copy_gbps": hb,
            "samples_gbps": _samples(hb, spreads.get(("hbm_copy_gbps", i), 2.0)),
        }
        pcie[str(cuda)] = {
            "bytes": base_pcie["bytes"],
            "correct": True,
            "h2d_gbps": h2d,
            "d2h_gbps": d2h,
            "samples_h2d_gbps": _samples(h2d, spreads.get(("pcie_h2d_gbps", i), 1.0)),
            "samples_d2h_gbps": _samples(d2h, spreads.get(("pcie_d2h_gbps", i), 1.0)),
        }
        if with_uuid:
            fig["uuid"] = hbm[str(cuda)]["uuid"] = pcie[str(cuda)]["uuid"] = g["uuid"]
        per_gpu[str(cuda)] = fig
    slowest = min(v["bf16"] for v in per_gpu.values())
    note = "; CPU run: logic check only, not a performance figure" if cpu else ""
    status = schema.SKIP if cpu else schema.PASS
    mm_res = schema.result(
        "matmul_bf16",
        status,
        f"slowest GPU bf16 matmul {slowest} TFLOPS (minimum 700){note}",
        value=slowest,
        unit="TFLOPS",
        threshold={"key": "matmul_bf16_tflops_min", "value": 700, "min": 700, "source": "h100-sxm"},
        detail={"method": mm["detail"]["method"], "monitor": {}, "per_gpu": per_gpu, "per_shape": {}, "summary": {}},
    )
    mem_detail = {
        "method": mem["detail"]["method"],
        "monitor": {},
        "per_gpu": {"hbm": hbm, "pcie": pcie},
        "summary": {},
    }
    out = [_stamp(mm_res, "benchmark")]
    low = min(v["hbm_copy_gbps"] for v in hbm.values())
    out.append(
        _stamp(
            schema.result(
                "hbm_bandwidth",
                status,
                f"slowest GPU HBM copy {low} GB/s{note}",
                value=low,
                unit="GB/s",
                detail=mem_detail,
            ),
            "benchmark",
        )
    )
    for check, field in (("pcie_h2d_bandwidth", "h2d_gbps"), ("pcie_d2h_bandwidth", "d2h_gbps")):
        low = min(v[field] for v in pcie.values())
        out.append(
            _stamp(
                schema.result(
                    check, status, f"slowest GPU {field} {low} GB/s{note}", value=low, unit="GB/s", detail=mem_detail
                ),
                "benchmark",
            )
        )
    for res in h200_node()["results"]:
        if res["group"] == "benchmark" and res["check"].startswith("nccl_") and res["check"] != "nccl_sendrecv":
            res = copy.deepcopy(res)
            if cpu:
                res["status"], res["reason"] = schema.SKIP, res["reason"] + note
            out.append(res)
    return out


def inventory_result(gpus: list[dict]) -> dict:
    return _stamp(
        schema.result(
            "gpu_count",
            schema.PASS,
            f"found {len(gpus)} GPUs",
            value=len(gpus),
            unit="GPUs",
            detail={"inventory": {"driver_version": "550.54.15", "gpus": gpus}},
        ),
        "gpu_inventory",
    )


def node_doc(
    host: str,
    node_no: int,
    *,
    gpus: list[dict] | None = None,
    factors: dict | None = None,
    spreads: dict | None = None,
    before: dict | None = None,
    after: dict | None = None,
    read_at: tuple[str, str] | None = None,
    boot_id: str = "boot-1",
    extra: list[dict] | None = None,
    with_uuid: bool = True,
    cpu: bool = False,
    started: str = "2026-11-21T10:00:00Z",
) -> dict:
    """One node's host document: inventory, benchmarks, and counter snapshots when read_at is given."""
    gpus = gpus if gpus is not None else gpus_of(node_no)
    results = [inventory_result(gpus)]
    if read_at:
        results.append(snapshot("before", gpus, read_at[0], boot_id, before))
    results += benchmark_results(node_no, gpus, factors=factors, spreads=spreads, with_uuid=with_uuid, cpu=cpu)
    if read_at:
        results.append(snapshot("after", gpus, read_at[1], boot_id, after))
    results += extra or []
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "host": host,
        "engine_version": "0.1.0",
        "profile": {"name": "h100-sxm", "path": "files/profiles/h100-sxm.yml", "thresholds": {}},
        "versions": {"engine": "0.1.0", "driver": "550.54.15"},
        "started": started,
        "seconds": 60.0,
        "results": results,
    }


def ecc_failure(gpu: dict) -> dict:
    """gpu_health.ecc failing on one GPU, naming it in detail.flagged_gpus."""
    return _stamp(
        schema.result(
            "ecc",
            schema.FAIL,
            f"GPU {gpu['index']}: 2 volatile uncorrectable ECC errors",
            value=2,
            unit="errors",
            remedy="drain the node; reset the GPU",
            detail={"flagged_gpus": [{"index": gpu["index"], "uuid": gpu["uuid"], "serial": gpu["serial"]}]},
        ),
        "gpu_health",
    )


def write_run(
    reports_dir: Path, run_id: str, docs: dict[str, dict], *, started: str | None = None, baseline: str | None = None
) -> Path:
    """A run folder as the playbook leaves it: run.json and hosts/<host>.json."""
    run_dir = reports_dir / run_id
    (run_dir / "hosts").mkdir(parents=True, exist_ok=True)
    run = {
        "schema_version": 1,
        "run_id": run_id,
        "playbook": "validate",
        "started": started or min(d["started"] for d in docs.values()),
        "tier": "quick",
        "hosts": sorted(docs),
        "baseline": baseline,
        "attempts": [{"attempt": 1, "started": started, "limit": None, "stages": None}],
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    for host, doc in docs.items():
        (run_dir / "hosts" / f"{host}.json").write_text(json.dumps(doc))
    return run_dir


def measured_twice(run_dir: Path, docs: dict[str, dict], baseline: str | None = None) -> None:
    """The run's documents as nodes' stages leave them when each measured every figure twice and found the same:
    the run's references written as validate.yml writes them before the nodes' stage (fleet/references.py), each
    node's figures held against its own by the node's comparisons (comparisons.node.Held), the figures past or near
    a limit kept in detail.held with both measurements' states (comparisons/confirm.py)."""
    from gpufleet.comparisons import metrics
    from gpufleet.comparisons.confirm import RECORD, beyond
    from gpufleet.comparisons.node import Held, read
    from gpufleet.fleet import references
    from gpufleet.fleet.store import Store

    with Store(run_dir.parent / "gpufleet.db") as store:
        references.write(run_dir, sorted(docs), store, None, references.choose_baseline(run_dir, store, baseline))
    for host, doc in docs.items():
        held = Held(read(run_dir, host), doc["profile"], metrics.inventory(doc["results"]), host)
        bench = [r for r in doc["results"] if r.get("group") == "benchmark"]
        record = {k: [st, st] for k, st in held(bench).items() if beyond(st) or st.get("near")}
        for r in bench:
            r["detail"][RECORD] = record
        (run_dir / "hosts" / f"{host}.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------- the builders make what the recordings hold


def test_synthetic_gpus_are_the_recorded_ones_made_unique_per_node():
    a, b = gpus_of(1), gpus_of(2)
    assert [g["pci_bus_id"] for g in a] == [g["pci_bus_id"] for g in h100_readings()["nvml"]["gpus"]]
    assert not {g["uuid"] for g in a} & {g["uuid"] for g in b}
    assert not {g["serial"] for g in a} & {g["serial"] for g in b}


def test_synthetic_figures_stay_within_healthy_variation():
    found = metrics.extract(node_doc("n0", 0))
    bf16 = [m["value"] for m in found["metrics"] if m["key"] == "matmul_bf16_tflops" and m["scope"] == "gpu"]
    assert len(bf16) == 8 and max(bf16) / min(bf16) < 1.017
    assert {m["mapped_by"] for m in found["metrics"] if m["scope"] == "gpu"} == {"uuid"}


def test_recorded_counters_read_as_snapshot_counters():
    counters = recorded_counters(_load(READINGS / "recorded-h200-x2-vm.json")["nvml"]["gpus"][0])
    assert set(counters) == set(COUNTER_NAMES)
    assert counters["nvlink_crc_data"] > 0  # the H200 VM's links had CRC counts
