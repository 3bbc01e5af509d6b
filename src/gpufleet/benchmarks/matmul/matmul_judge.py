"""The matmul benchmark's output judged: the bf16 TFLOPS of the slowest GPU against its limit and its own samples
(checks/figures.py), a GPU that throttled while it measured failed, every GPU that erred named."""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import calibration, judge, profiles
from gpufleet.checks import figures
from gpufleet.checks.benchmarks import against_min, cuda_gpu, flag_gpus
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN, result


def _throttled(monitor: dict) -> dict:
    return {idx: g["throttled"] for idx, g in (monitor.get("per_gpu") or {}).items() if g.get("throttled")}


@registers("matmul", "judge")
def matmul(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    mon = out["monitor"]
    errors = {d: v["error"] for d, v in out["per_device"].items() if "error" in v}
    detail = {
        "summary": out["summary"],
        "method": out["method"],
        "versions": out["versions"],
        "monitor": mon,
        "per_gpu": {
            d: {k: v.get(k, {}).get("tflops") for k in out["method"]["dtypes"]}
            | {
                "error": v.get("error"),
                "uuid": (v.get("device") or {}).get("uuid"),
                "pci_bus_id": (v.get("device") or {}).get("pci_bus_id"),
                "samples_tflops": (v.get("bf16") or {}).get("samples_tflops"),
            }
            | ({"phases_s": v["phases_s"]} if v.get("phases_s") else {})  # a worker's, where one ran
            for d, v in out["per_device"].items()
        },
        "per_shape": {
            d: {k: v[k]["per_shape"] for k in out["method"]["dtypes"] if k in v} for d, v in out["per_device"].items()
        },
    }
    ident = {d: cuda_gpu(mon, v.get("device") or {}) for d, v in out["per_device"].items()}
    if errors:
        return [
            flag_gpus(
                result(
                    "matmul_bf16",
                    ERROR,
                    f"matmul failed on GPU(s) {', '.join(errors)}: {next(iter(errors.values()))}",
                    detail=detail,
                    remedy="look at the error; a GPU that cannot run a matmul is not fit for training",
                ),
                [ident[d] for d in errors],
            )
        ]
    bf16 = out["summary"].get("bf16", {})
    res = against_min(
        "matmul_bf16",
        bf16.get("tflops_min"),
        "TFLOPS",
        profile,
        "matmul_bf16_tflops_min",
        "slowest GPU bf16 matmul",
        "compare with the other GPUs in detail; check clocks, power limit and cooling",
        detail,
        cpu,
    )
    limit = profiles.value(profile, "matmul_bf16_tflops_min")
    flagged = [
        ident[d]
        for d, v in out["per_device"].items()
        if limit is not None and (v.get("bf16") or {}).get("tflops") is not None and v["bf16"]["tflops"] < limit
    ]
    throttled = _throttled(mon)
    spread = bf16.get("spread_pct")
    spread_thr = calibration.entry(profile["thresholds"], "matmul_spread_pct_max", "matmul_bf16_tflops")
    spread_max = spread_thr["value"]
    if not cpu and throttled and res["status"] == PASS:
        res = res.replace(
            status=FAIL,
            reason=f"{res['reason']}, but GPU(s) throttled during the run: {throttled}",
            remedy="hardware slowdown under load: check cooling, power delivery and the GPU's health",
        )
        by_index = {g["index"]: g for g in ident.values()}
        flagged = [by_index.get(int(i)) or {"index": int(i), "uuid": None} for i in throttled]
    elif (
        not cpu
        and spread is not None
        and res["status"] == PASS
        and judge.judge(spread, judge.Limit("matmul_spread_pct_max", spread_max, breach=WARN)).status == WARN
    ):
        res = res.replace(
            status=WARN,
            reason=f"{res['reason']}, but GPUs differ by {spread}% (more than {spread_max:g}%"
            f"{calibration.uncalibrated_text(spread_thr)})",
            remedy="the slowest GPU in detail.per_gpu is the one to look at: compare its clocks, power and "
            "temperature in detail.monitor with its siblings'; one that stays slow needs service",
            detail={**res["detail"], "spread_threshold": spread_thr},
        )
        slowest = min(
            (d for d, v in out["per_device"].items() if (v.get("bf16") or {}).get("tflops") is not None),
            key=lambda d: out["per_device"][d]["bf16"]["tflops"],
            default=None,
        )
        flagged = [ident[slowest]] if slowest is not None else []
    if not cpu:
        judged = figures.judged(
            [
                (ident[d], "matmul_bf16_tflops", "bf16 matmul", "TFLOPS", (v.get("bf16") or {}).get("samples_tflops"))
                for d, v in out["per_device"].items()
            ],
            profile,
            mon,
        )
        res, flagged = figures.with_samples(res, judged, flagged, profile, "matmul_bf16_tflops")
        res = figures.near_limit(res, judged, "matmul_bf16_tflops_min", profile, "matmul_bf16_tflops")
    return [flag_gpus(res, flagged)]
