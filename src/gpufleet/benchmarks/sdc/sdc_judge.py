"""benchmark.sdc: the hashes of benchmarks/sdc/sdc_measure.py compared across the node's GPUs.

For each computation the GPUs whose `comparable` keys are the same (model, SM count, driver, CUDA, torch, cuBLAS,
method) vote with their hash; a hash that more than half of them hold is the majority, and a GPU with another
hash is named and fails (class hardware). With no majority (two GPUs, one hash each) the node fails as well: one
of them computes wrong bits, and fleet.sdc, which compares across the fleet, names which. A GPU whose repeats
differ from its own first output fails too. One GPU alone is judged on its repeats; fleet.sdc compares it across
nodes.
"""

from __future__ import annotations

import json
from collections import Counter

from gpufleet.base.registry import registers
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, result

CHECK = "sdc"
REMEDY = (
    "a GPU that computes different bits from its identical siblings corrupts training silently: drain the node, "
    "run the check again at temperature (soak tier) and replace the GPU if it disagrees again"
)


def comparable(info: dict, versions: dict, method: dict, driver: str | None) -> dict:
    """What must be equal for two GPUs' hashes to be comparable (benchmarks/sdc/sdc_measure.py says why each one)."""
    dev = info.get("device") or {}
    return {
        "name": dev.get("name"),
        "sm_count": dev.get("sm_count"),
        "capability": dev.get("capability"),
        "driver": driver,
        "cuda": versions.get("cuda_runtime"),
        "torch": versions.get("torch"),
        "cublas": info.get("cublas"),
        "tf32": method.get("tf32"),
        "sdc_version": method.get("sdc_version"),
        "sizes": method.get("sizes"),
        "seed": method.get("seed"),
        "cublas_workspace_config": method.get("cublas_workspace_config"),
    }


def comparable_key(c: dict) -> str:
    return json.dumps(c, sort_keys=True)


def majority(votes: dict) -> tuple[str | None, list]:
    """(the hash more than half of the voters hold, or None; the voters without it) over {voter: hash}."""
    if not votes:
        return None, []
    top, n = Counter(votes.values()).most_common(1)[0]
    if 2 * n <= len(votes):
        return None, list(votes)
    return top, [v for v, h in votes.items() if h != top]


def _nvml_gpu(info: dict, nvml_gpus: list) -> dict:
    uuid = ((info.get("device") or {}).get("uuid") or "").lower()
    g = next((g for g in nvml_gpus if uuid and (g.get("uuid") or "").lower() == uuid), {})
    return {"index": g.get("index"), "uuid": (info.get("device") or {}).get("uuid"), "serial": g.get("serial")}


@registers("sdc", "judge")
def results(out: dict, profile: dict, nvml: dict | None = None) -> list[dict]:
    """One result `sdc`; detail.per_gpu holds every GPU's hashes and comparable keys (the store indexes them). nvml:
    the node's NVML reading, which names each GPU (default: the one the measurement carries, measure.run_sdc)."""
    nvml = nvml or out.get("nvml") or {}
    cpu = out["device"] == "cpu"
    per = out["per_device"]
    per_gpu = {}
    for d, info in per.items():
        if "error" in info:
            per_gpu[d] = {"error": info["error"]}
            continue
        per_gpu[d] = {
            **_nvml_gpu(info, nvml.get("gpus") or []),
            "cuda_index": d,
            "name": info["device"]["name"],
            "hashes": info["hashes"],
            "repeats_differing": info["repeats_differing"],
            "seconds": info["seconds"],
            "phases_s": info.get("phases_s"),
            "comparable": comparable(info, out["versions"], out["method"], nvml.get("driver_version")),
        }
    detail = {"method": out["method"], "versions": out["versions"], "per_gpu": per_gpu}
    who, whos = ("CPU process", "CPU processes") if cpu else ("GPU", "GPUs")

    def named(d):
        g = per_gpu[d]
        return f"{who} {d}" + (f" ({g['uuid']})" if g.get("uuid") else "")

    def flagged(ds):
        return [{k: per_gpu[d].get(k) for k in ("index", "uuid", "serial")} for d in ds if not cpu]

    errors = [d for d, g in per_gpu.items() if "error" in g]
    if errors:
        return [
            result(
                CHECK,
                ERROR,
                f"the SDC computations did not finish on {', '.join(named(d) for d in errors)}: "
                f"{per_gpu[errors[0]]['error']}",
                detail=detail,
                remedy="read the error; a GPU that cannot finish a seeded matmul is not fit for training",
            )
        ]
    findings, bad = [], []
    for d, g in per_gpu.items():
        for name, n in g["repeats_differing"].items():
            if n:
                findings.append(
                    f"{named(d)} gave {n} of {out['method']['repeats'] - 1} repeats of {name} unlike its first"
                )
                bad.append(d)
    groups: dict = {}
    for d, g in per_gpu.items():
        groups.setdefault(comparable_key(g["comparable"]), []).append(d)
    for name in out["method"]["sizes"]:
        for members in groups.values():
            top, others = majority({d: per_gpu[d]["hashes"][name] for d in members})
            if top is None and len(members) > 1:
                findings.append(
                    f"{name}: no majority among {', '.join(named(d) for d in members)}: one of them computes "
                    "wrong bits (fleet.sdc compares them across nodes)"
                )
            elif others:
                findings.append(
                    f"{name}: {', '.join(named(d) for d in others)} disagree(s) with the {len(members) - len(others)} "
                    f"of {len(members)} {whos} that agree (sha256 {top[:12]}…)"
                )
                bad += others
    if len(groups) > 1:
        detail["not_compared"] = (
            "GPUs of this node differ in model, SM count or versions: compared only within each kind"
        )
    bad = list(dict.fromkeys(bad))
    n, names = len(per_gpu), ", ".join(out["method"]["sizes"])
    if findings:
        status, reason = FAIL, "; ".join(findings)
    elif n == 1:
        status, reason = (
            PASS,
            (
                f"1 {who}: {names} bit-identical over {out['method']['repeats']} repeats; "
                "fleet.sdc compares it across nodes"
            ),
        )
    else:
        status, reason = (
            PASS,
            f"{n} {whos}: {names} bit-identical across {whos} and {out['method']['repeats']} repeats each",
        )
    if cpu:
        detail["would_be"] = status
        return [result(CHECK, SKIP, f"{reason}; {CPU_NOTE}", detail=detail)]
    return [
        result(
            CHECK,
            status,
            reason,
            detail={**detail, "flagged_gpus": flagged(bad)} if bad else detail,
            remedy=REMEDY if status == FAIL else None,
            failure_class="hardware" if status == FAIL else None,
        )
    ]
