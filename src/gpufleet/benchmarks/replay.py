"""A recorded node document's benchmark figures judged again by today's judges: the benchmark output each
matmul and memory result keeps in its detail is rebuilt and handed to their judgements (matmul_judge, memory_judge), with the profile of
today (its calibrated limits). tools/calibration_table.py states, beside what a recorded run said, what the
code of today says of the same figures; the CPU tests replay recorded samples the same way.

What is not replayed stays as recorded: a figure measured beside a foreign process (trust `disturbed`: it is an
error whatever its numbers), the checks of readings the document does not keep (gpu_health, host_hygiene), NCCL,
SDC and the processes seen. A confirmation measured again is judged on the measurement the document kept.
"""

from __future__ import annotations

from gpufleet.base import schema
from gpufleet.benchmarks.matmul import matmul_judge
from gpufleet.benchmarks.memory import memory_judge
from gpufleet.checks import benchmarks

GROUP = benchmarks.GROUP
MEMORY_CHECKS = ("hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_d2h_bandwidth")


def _cpu(detail: dict) -> bool:
    return (detail.get("method") or {}).get("tier") == "cpu"


def matmul_output(detail: dict) -> dict:
    """benchmarks.matmul.run's output, as far as benchmark.matmul_bf16's detail keeps it."""
    per_device = {}
    dtypes = (detail.get("method") or {}).get("dtypes") or []
    for dev, row in (detail.get("per_gpu") or {}).items():
        entry: dict = {"device": {"uuid": row.get("uuid"), "pci_bus_id": row.get("pci_bus_id")}}
        if row.get("error"):
            entry["error"] = row["error"]
        for dtype in dtypes:
            if row.get(dtype) is not None:
                entry[dtype] = {
                    "tflops": row[dtype],
                    "per_shape": ((detail.get("per_shape") or {}).get(dev) or {}).get(dtype, []),
                }
        if row.get("samples_tflops") and "bf16" in entry:
            entry["bf16"]["samples_tflops"] = row["samples_tflops"]
        per_device[dev] = entry
    return {
        "benchmark": "matmul",
        "device": "cpu" if _cpu(detail) else "cuda",
        "method": detail.get("method") or {},
        "summary": detail.get("summary") or {},
        "versions": detail.get("versions") or {},
        "per_device": per_device,
        "monitor": detail.get("monitor") or {},
    }


def memory_output(detail: dict) -> dict:
    """benchmarks.memory.run's output, from the detail the memory results share."""
    return {
        "benchmark": "memory",
        "device": "cpu" if _cpu(detail) else "cuda",
        "method": detail.get("method") or {},
        "summary": detail.get("summary") or {},
        "per_device": detail.get("per_gpu") or {"hbm": {}, "pcie": {}},
        "monitor": detail.get("monitor") or {},
        **({"host_link": detail["host_link"]} if detail.get("host_link") else {}),
    }


def _kept(res: dict) -> bool:
    """Results judged again: a benchmark figure that was not measured beside a foreign process."""
    return res.get("group") == GROUP and res.get("trust") != schema.DISTURBED and isinstance(res.get("detail"), dict)


def benchmark_results(results: list[dict], profile: dict) -> list[dict]:
    """The document's results with matmul_bf16 and the memory results judged again; every other result as it
    was. Each replayed result keeps the recorded one's group, time and seconds, and says `replayed` in detail."""
    out, memory_done = [], None
    for res in results:
        check = res.get("check")
        if check == "matmul_bf16" and _kept(res):
            (new,) = matmul_judge.matmul(matmul_output(res["detail"]), profile)
        elif check in MEMORY_CHECKS and _kept(res):
            if memory_done is None:
                memory_done = {r["check"]: r for r in memory_judge.memory(memory_output(res["detail"]), profile)}
            new = memory_done.get(check)
            if new is None:
                out.append(res)
                continue
        else:
            out.append(res)
            continue
        trust = None
        if res.get("trust") is not None and new["status"] not in (schema.SKIP, schema.ERROR):
            trust = res["trust"] if not new["detail"].get("measure_again") else schema.INCONCLUSIVE
        stamped = {k: res[k] for k in ("started", "seconds") if res.get(k) is not None}
        out.append(
            new.replace(
                group=res.get("group"),
                trust=trust,
                **stamped,
                detail={
                    **new["detail"],
                    "replayed": {"recorded_status": res.get("status"), "recorded_trust": res.get("trust")},
                },
            )
        )
    return out
