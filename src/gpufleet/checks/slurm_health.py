"""The hard faults of a node for Slurm's health check (`gpufleet check --slurm-health`): which failed results of a
host document of groups gpu_inventory and gpu_health mean the node must not take another job.

    gpu_inventory.gpu_count   a GPU gone (fewer than gpus_expected; NVML sees none)
    gpu_health.xid            an Xid of xid_fail_codes in this boot's kernel log
    gpu_health.ecc            uncorrectable ECC errors since the driver loaded (or ECC off)
    gpu_health.row_remapping  a row remap pending or failed
    gpu_health.processes      in the epilog only: a process left on a GPU after the job ended

Only `fail` counts: a check that could not read (an `error`, a kernel log root may not read) never drains a node,
and nothing here loads a GPU: NVML and kernel-log readings only.
"""

from __future__ import annotations

from gpufleet import failure_class, schema

HARD_FAULTS = ("gpu_inventory.gpu_count", "gpu_health.xid", "gpu_health.ecc", "gpu_health.row_remapping")
EPILOG_FAULTS = ("gpu_health.processes",)
GROUPS = ["gpu_inventory", "gpu_health"]
MODES = ("health", "epilog")  # health: HealthCheckProgram or the prolog; epilog: also processes left behind


def hard_faults(results: list[dict], mode: str = "health") -> list[dict]:
    """The failed results among the hard-fault checks of `mode`, in the document's order."""
    wanted = HARD_FAULTS + (EPILOG_FAULTS if mode == "epilog" else ())
    return [r for r in results if r["status"] == schema.FAIL and f"{r.get('group')}.{r['check']}" in wanted]


def reason_text(faults: list[dict]) -> str:
    """`health <class>: <check> <its reason> +N more`, the reason's words before PREFIX (gpufleet.slurm.reason)."""
    first = faults[0]
    more = f" +{len(faults) - 1} more" if len(faults) > 1 else ""
    return f"health {failure_class.of(first) or 'failed'}: {first['check']} {first['reason']}{more}"
