"""soak_throttle: hardware and thermal slowdown events on each GPU during the soak, with the time they began."""

from __future__ import annotations

from gpufleet.base import profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.benchmarks.soak.soak_naming import Flags, soak_when
from gpufleet.collect.nvml.clocks import HW_SLOWDOWN_EVENTS
from gpufleet.base.schema import ERROR, FAIL, PASS, result

SOAK_REMEDY_THROTTLE = (
    "hardware slowdown under sustained load: check cooling (inlet temperature, fans, airflow for this "
    "GPU's slot) and power delivery (PSUs, BMC power capping); detail.per_gpu has clocks, temperature "
    "and power per window"
)


def soak_throttle(out, profile, base, gpus, cpu) -> dict:
    limit = profiles.value(profile, "soak_throttle_s_max")
    threshold = profiles.threshold(profile, "soak_throttle_s_max", max=limit)
    sampler = out.get("sampler") or {}
    detail = {
        **base,
        "per_gpu": {
            i: {k: g.get(k) for k in ("uuid", "serial", "pci_bus_id", "throttle", "windows", "error")}
            for i, g in (sampler.get("per_gpu") or {}).items()
        },
    }
    if cpu:
        return result(
            "soak_throttle", schema.SKIP, f"no GPU clocks to watch; {CPU_NOTE}", threshold=threshold, detail=detail
        )
    if sampler.get("error") or not sampler.get("per_gpu"):
        return result(
            "soak_throttle",
            ERROR,
            f"could not watch the GPUs' clocks during the soak: {sampler.get('error') or 'no GPU sampled'}",
            threshold=threshold,
            detail=detail,
            remedy="check NVML (`nvidia-smi`) on the node and run the soak again",
        )
    f, flags = Findings(), Flags()
    worst = 0.0
    clocks = []
    for i, g in sorted(sampler["per_gpu"].items(), key=lambda kv: int(kv[0])):
        hw = {name: e for name, e in (g.get("throttle") or {}).items() if name in HW_SLOWDOWN_EVENTS}
        seconds = sum(e["seconds"] for e in hw.values())
        worst = max(worst, seconds)
        sm = [w["sm_clock_min_mhz"] for w in g.get("windows") or [] if w.get("sm_clock_min_mhz") is not None]
        clocks += sm
        if hw and (limit is None or seconds > limit):
            first = min(e["first_s"] for e in hw.values())
            names = ", ".join(HW_SLOWDOWN_EVENTS[n] for n in hw)
            f.add(
                FAIL, f"{names} {soak_when(out, first)}, {seconds:g} s in all", gpu=int(i), remedy=SOAK_REMEDY_THROTTLE
            )
            flags.add(FAIL, gpus.by_index.get(i))
        if g.get("error"):
            f.add(PASS, f"some readings failed: {g['error']}", gpu=int(i))
    ok = f"no hardware or thermal slowdown on {len(sampler['per_gpu'])} GPU(s) over {out.get('ran_s'):g} s" + (
        f" (lowest SM clock {min(clocks)} MHz)" if clocks else ""
    )
    return flags.apply(f.result("soak_throttle", ok, value=worst, unit="s", threshold=threshold, detail=detail))
