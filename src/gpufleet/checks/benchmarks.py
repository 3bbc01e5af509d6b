"""Turn the quick benchmarks' output (gpufleet.bench.*.run(): matmul, memory) into results of the one schema, and
what every benchmark's judgement shares (GROUP, CPU_NOTE, against_min, flag_gpus). NCCL's judgement is
checks.collectives, the training gate's checks.training_gate, the soak's checks.soak; measuring again and each
figure's trust, measure.

Each function takes the benchmark's output and the profile and returns a list
of results; the raw output rides along in `detail` so nothing measured is lost.
"""

from __future__ import annotations

from gpufleet.base import calibration, host_platform, judge, profiles, schema
from gpufleet.checks import figures
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN, result

GROUP = "benchmark"
C2C_COPY_REMEDY = (
    "a Grace superchip's host copies run over NVLink-C2C: compare with gpu_health.pcie_link (its C2C links' state "
    "and speed, `nvidia-smi c2c -s`) and with the GPU's siblings; check what else uses the CPU's memory"
)
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


def _throttled(monitor: dict) -> dict:
    return {idx: g["throttled"] for idx, g in (monitor.get("per_gpu") or {}).items() if g.get("throttled")}


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


def memory(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    s, per, mon = out["summary"], out["per_device"], out["monitor"]
    detail = {"summary": s, "method": out["method"], "per_gpu": per, "monitor": mon}
    # The host's copies run over NVLink-C2C on a Grace superchip (base.host_platform), held against its figure.
    c2c = out.get("host_link") == host_platform.C2C
    if out.get("host_link"):
        detail["host_link"] = out["host_link"]
    over = " over NVLink-C2C" if c2c else ""
    link_remedy = (
        C2C_COPY_REMEDY
        if c2c
        else "a link trained down shows here: compare with gpu_health.pcie_link and reseat or replace the riser"
    )
    copies = {**per["hbm"], **{f"pcie{k}": v for k, v in per["pcie"].items()}}
    bad = [d for d, v in copies.items() if "error" in v or not v.get("correct", False)]
    if bad:
        wrong_data = any("error" not in copies[d] for d in bad)  # a copy that ran and moved wrong data: the board
        return [
            flag_gpus(
                result(
                    "memory_bandwidth",
                    ERROR,
                    f"copies failed or moved wrong data on {bad}",
                    detail=detail,
                    failure_class="hardware" if wrong_data else None,
                ),
                [cuda_gpu(mon, copies[d]) for d in bad if copies[d].get("uuid")],
            )
        ]

    def under(part, field, key):  # the GPUs under the minimum: the ones a failing result is about
        limit = profiles.value(profile, key)
        return [
            cuda_gpu(mon, v)
            for v in per[part].values()
            if limit is not None and v.get(field) is not None and v[field] < limit
        ]

    res = [
        flag_gpus(
            against_min(
                "hbm_bandwidth",
                s["hbm_copy_gbps_min"],
                "GB/s",
                profile,
                "hbm_copy_gbps_min",
                "slowest GPU HBM copy (read+write)",
                "compare GPUs in detail; check memory clocks and ECC/row remapping",
                detail,
                cpu,
            ),
            under("hbm", "hbm_copy_gbps", "hbm_copy_gbps_min"),
        )
    ]
    if per["pcie"]:
        h2d = against_min(
            "pcie_h2d_bandwidth",
            s["h2d_gbps_min"],
            "GB/s",
            profile,
            "pcie_h2d_gbps_min",
            f"slowest GPU host-to-device{over}",
            link_remedy,
            detail,
            cpu,
        )
        d2h = against_min(
            "pcie_d2h_bandwidth",
            s["d2h_gbps_min"],
            "GB/s",
            profile,
            "pcie_d2h_gbps_min",
            f"slowest GPU device-to-host{over}",
            link_remedy if c2c else "a link trained down shows here: compare with gpu_health.pcie_link",
            detail,
            cpu,
        )
        res += [
            flag_gpus(h2d, under("pcie", "h2d_gbps", "pcie_h2d_gbps_min")),
            flag_gpus(d2h, under("pcie", "d2h_gbps", "pcie_d2h_gbps_min")),
        ]
    if not cpu:
        parts = {
            "hbm_bandwidth": ("hbm", "hbm_copy_gbps", "HBM copy", "samples_gbps", "hbm_copy_gbps_min"),
            "pcie_h2d_bandwidth": ("pcie", "pcie_h2d_gbps", "host-to-device", "samples_h2d_gbps", "pcie_h2d_gbps_min"),
            "pcie_d2h_bandwidth": ("pcie", "pcie_d2h_gbps", "device-to-host", "samples_d2h_gbps", "pcie_d2h_gbps_min"),
        }
        for i, r in enumerate(res):
            part, metric, what, field, key = parts[r["check"]]
            judged = figures.judged(
                [(cuda_gpu(mon, v), metric, what, "GB/s", v.get(field)) for v in per[part].values()], profile, mon
            )
            r, flagged = figures.with_samples(r, judged, r["detail"].get("flagged_gpus") or [], profile, metric)
            res[i] = flag_gpus(figures.near_limit(r, judged, key, profile, metric), flagged)
    return res
