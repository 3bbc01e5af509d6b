"""A GPU's clock event (throttle) reasons through NVML."""

from __future__ import annotations

from gpufleet.collect.nvml.binding import call_first, pynvml

# NVML's clocks event (throttle) reason bits, named as the checks and reports use them.
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Reasons that mean the hardware is protecting itself: clocks cut below what the job asked for.
HW_SLOWDOWN_EVENTS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
    "sw_thermal_slowdown": "SW thermal slowdown",
}


def clock_events(handle) -> dict:
    mask = call_first(
        (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None), handle),
        (getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None), handle),
    )
    return {"mask": int(mask), "names": reason_names(mask)}


def reason_names(mask: int) -> list[str]:
    """The clock event reasons a mask holds, by name."""
    return [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]
