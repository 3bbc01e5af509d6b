"""What slows a GPU: clock event (throttle) reasons, temperature against its limits, the enforced power limit."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.checks.gpu_inventory import UNREADABLE_REMEDY, Findings, gpu_check, unreadable
from gpufleet.collect.nvml.clocks import CLOCK_EVENT_BITS, HW_SLOWDOWN_EVENTS
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN


def _busy(g: dict) -> bool:
    names = (g.get("clock_event_reasons") or {}).get("names") or []
    return "gpu_idle" not in names and (g.get("utilization_gpu_pct") or 0) > 0


@gpu_check("clock_events")
def clock_events(readings, gpus, profile):
    """Clock event (throttle) reasons at read time: hardware slowdowns fail, a power cap under load warns."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, ev = g["index"], g.get("clock_event_reasons")
        per_gpu.append({"index": i, "clock_event_reasons": ev, "utilization_gpu_pct": g.get("utilization_gpu_pct")})
        if ev is None:
            f.add(
                ERROR,
                f"clock event reasons unreadable ({unreadable(g, 'clock_event_reasons')})",
                gpu=i,
                remedy=UNREADABLE_REMEDY,
            )
            continue
        mask = ev.get("mask") or 0
        for name, label in HW_SLOWDOWN_EVENTS.items():
            if mask & CLOCK_EVENT_BITS[name]:
                f.add(
                    FAIL,
                    f"{label}",
                    gpu=i,
                    remedy="check cooling and power: inlet temperature, fans, PSUs and the BMC sensor log; "
                    "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {gpus}` shows which limit hit",
                )
        if mask & CLOCK_EVENT_BITS["sw_power_cap"]:
            if _busy(g):
                f.add(
                    WARN,
                    f"SW power cap while busy ({g.get('utilization_gpu_pct')}% utilization)",
                    gpu=i,
                    remedy="check the power limit (power_limit check) and the job's power draw",
                )
            else:
                f.add(PASS, "SW power cap while idle", gpu=i)
    return f.result("clock_events", "no hardware or thermal slowdown", detail={"per_gpu": per_gpu})


@gpu_check("temperature")
def temperature(readings, gpus, profile):
    """GPU temperature against the GPU's own slowdown threshold and the profile's margin; HBM against its limit."""
    warn_c = profiles.value(profile, "gpu_temperature_warn_c")
    mem_warn_c = profiles.value(profile, "memory_temperature_warn_c")
    cooling = (
        "check airflow, fans and inlet temperature for this GPU's position in the chassis; check the BMC sensor log"
    )
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, t, slow, mem_t = (
            g["index"],
            g.get("temperature_c"),
            g.get("temperature_slowdown_c"),
            g.get("memory_temperature_c"),
        )
        per_gpu.append(
            {
                "index": i,
                "temperature_c": t,
                "temperature_slowdown_c": slow,
                "memory_temperature_c": mem_t,
                "temperature_shutdown_c": g.get("temperature_shutdown_c"),
            }
        )
        if t is None:
            f.add(ERROR, f"temperature unreadable ({unreadable(g, 'temperature_c')})", gpu=i, remedy=UNREADABLE_REMEDY)
        elif slow is not None and t >= slow:
            f.add(FAIL, f"{t} C, at or above its slowdown threshold {slow} C", gpu=i, remedy=cooling)
        elif warn_c is not None and t >= warn_c:
            f.add(WARN, f"{t} C >= {warn_c} C", gpu=i, remedy=cooling)
        if mem_t is not None and mem_warn_c is not None and mem_t >= mem_warn_c:
            f.add(WARN, f"memory {mem_t} C >= {mem_warn_c} C", gpu=i, remedy=cooling)
    temps = [p["temperature_c"] for p in per_gpu if p["temperature_c"] is not None]
    mems = [p["memory_temperature_c"] for p in per_gpu if p["memory_temperature_c"] is not None]
    ok = f"hottest GPU {max(temps) if temps else None} C" + (
        f", hottest memory {max(mems)} C" if mems else ", memory temperature not reported"
    )
    return f.result(
        "temperature",
        ok,
        value=max(temps) if temps else None,
        unit="C",
        threshold=profiles.threshold(
            profile, "gpu_temperature_warn_c", memory_warn_c=mem_warn_c, fail="the GPU's slowdown threshold"
        ),
        detail={"per_gpu": per_gpu},
    )


@gpu_check("power_limit")
def power_limit(readings, gpus, profile):
    """The enforced power limit against the board default: a lowered cap costs throughput."""
    min_ratio = profiles.value(profile, "power_limit_min_ratio")
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, limit, default = g["index"], g.get("power_limit_w"), g.get("power_default_limit_w")
        ratio = round(limit / default, 3) if limit is not None and default else None
        per_gpu.append(
            {
                "index": i,
                "power_limit_w": limit,
                "power_default_limit_w": default,
                "power_draw_w": g.get("power_draw_w"),
                "ratio": ratio,
            }
        )
        if ratio is None:
            field = "power_limit_w" if limit is None else "power_default_limit_w"
            f.add(ERROR, f"power limits unreadable ({unreadable(g, field)})", gpu=i, remedy=UNREADABLE_REMEDY)
        elif min_ratio is not None and ratio < min_ratio:
            f.add(
                FAIL,
                f"enforced power limit {limit:g} W is {ratio:.0%} of the default {default:g} W",
                gpu=i,
                remedy="restore the default limit (`nvidia-smi -i {gpus} -pl <default W>`) and look for a site or BMC power cap",
            )
    if min_ratio is None:
        f.add(
            WARN, "no minimum ratio set (power_limit_min_ratio)", remedy="set gpufleet_thresholds.power_limit_min_ratio"
        )
    ratios = [p["ratio"] for p in per_gpu if p["ratio"] is not None]
    lowest = min(ratios) if ratios else None
    return f.result(
        "power_limit",
        f"enforced power limits at {lowest:.0%} or more of the default" if ratios else "no power limit read",
        value=lowest,
        unit="ratio",
        threshold=profiles.threshold(profile, "power_limit_min_ratio"),
        detail={"per_gpu": per_gpu},
    )
