"""The memory benchmark's output judged: every HBM and host copy ran and moved the right data, and the slowest GPU's
HBM, host-to-device and device-to-host bandwidth against their limits and their own samples (checks/figures.py)."""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import host_platform, profiles
from gpufleet.checks import figures
from gpufleet.checks.benchmarks import against_min, cuda_gpu, flag_gpus
from gpufleet.base.schema import ERROR, result

C2C_COPY_REMEDY = (
    "a Grace superchip's host copies run over NVLink-C2C: compare with gpu_health.pcie_link (its C2C links' state "
    "and speed, `nvidia-smi c2c -s`) and with the GPU's siblings; check what else uses the CPU's memory"
)


@registers("memory", "judge")
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
