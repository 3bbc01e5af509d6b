"""What every benchmark's judgement shares (GROUP, CPU_NOTE, against_min, flag_gpus, cuda_gpu); each
benchmark's own judgement is in its folder (benchmarks/<name>/<name>_judge.py), measuring again and each figure's
trust in node/measure.py. A judgement takes the benchmark's output and the profile and returns a list of results;
the raw output rides along in `detail` so nothing measured is lost.
"""

from __future__ import annotations

from gpufleet.base import judge, profiles, schema
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN, result

GROUP = "benchmark"
CPU_NOTE = "CPU run: logic check only, not a performance figure"


def against_min(check, value, unit, profile, key, what, remedy, detail, cpu):
    """pass/fail against a minimum threshold (judge.judge); warn when none is set; never a claim on CPU."""
    limit = profiles.value(profile, key)
    threshold = profiles.threshold(profile, key, min=limit)
    if value is None:
        return result(check, ERROR, f"{what}: no value measured", threshold=threshold, detail=detail)
    if cpu:
        return result(
            check,
            schema.SKIP,
            f"{what} {value} {unit}; {CPU_NOTE}",
            value=value,
            unit=unit,
            threshold=threshold,
            detail=detail,
        )
    if limit is None:
        return result(
            check,
            WARN,
            f"{what} {value} {unit}; no threshold set ({key})",
            value=value,
            unit=unit,
            threshold=threshold,
            remedy=f"set gpufleet_thresholds.{key} or add it to the GPU's profile",
            detail=detail,
        )
    if judge.judge(value, judge.Limit(key, limit, kind=judge.MIN)).status == FAIL:
        return result(
            check,
            FAIL,
            f"{what} {value} {unit} is under the minimum {limit} {unit}",
            value=value,
            unit=unit,
            threshold=threshold,
            remedy=remedy,
            detail=detail,
        )
    return result(
        check,
        PASS,
        f"{what} {value} {unit} (minimum {limit})",
        value=value,
        unit=unit,
        threshold=threshold,
        detail=detail,
    )


def _nvml_index(monitor: dict, pci_bus_id: str | None) -> int | None:
    """The NVML index of a CUDA device, by PCI bus id: the monitor samples NVML's GPUs, torch counts CUDA's."""
    for idx, g in (monitor.get("per_gpu") or {}).items():
        if pci_bus_id and (g.get("pci_bus_id") or "").startswith(pci_bus_id):
            return int(idx)
    return None


def flag_gpus(res: dict, gpus: list[dict]) -> dict:
    """detail.flagged_gpus on a result that is not passing because of these GPUs ({"index", "uuid"}; index NVML's)."""
    if res["status"] in (WARN, FAIL, ERROR) and gpus:
        seen, flagged = set(), []
        for g in gpus:
            key = (g.get("index"), g.get("uuid"))
            if key not in seen:
                seen.add(key)
                flagged.append({"index": g.get("index"), "uuid": g.get("uuid"), "serial": g.get("serial")})
        return res.replace(detail={**res["detail"], "flagged_gpus": flagged})
    return res


def cuda_gpu(monitor: dict, info: dict) -> dict:
    """A CUDA device's identity for flagged_gpus, from what the benchmark read of it ({"uuid", "pci_bus_id"})."""
    return {"index": _nvml_index(monitor, info.get("pci_bus_id")), "uuid": info.get("uuid"), "serial": None}
