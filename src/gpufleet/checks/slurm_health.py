"""The hard faults of a node for Slurm's health check (`gpufleet check --slurm-health`): which failed results of a
host document of groups gpu_inventory and gpu_health mean the node must not take another job.

    gpu_inventory.gpu_count   a GPU gone (fewer than gpus_expected; NVML sees none), or the driver gone: its
                              library missing or NVML unable to start (an `error` with detail.driver_unusable)
    gpu_health.xid            an Xid of xid_fail_codes in this boot's kernel log
    gpu_health.ecc            uncorrectable ECC errors since the driver loaded (or ECC off)
    gpu_health.row_remapping  a row remap pending or failed
    gpu_health.processes      in the epilog only: a process left on a GPU after the job ended

Otherwise only `fail` counts: a check that could not read (an `error`, a kernel log root may not read) never drains
a node, and nothing here loads a GPU: NVML and kernel-log readings only.
"""

from __future__ import annotations

from gpufleet.base import causes, failure_class, schema, slurm

HARD_FAULTS = ("gpu_inventory.gpu_count", "gpu_health.xid", "gpu_health.ecc", "gpu_health.row_remapping")
EPILOG_FAULTS = ("gpu_health.processes",)
GROUPS = ["gpu_inventory", "gpu_health"]
MODES = ("health", "epilog")  # health: HealthCheckProgram or the prolog; epilog: also processes left behind


def _driver_gone(res: dict) -> bool:
    return res["status"] == schema.ERROR and bool((res.get("detail") or {}).get("driver_unusable"))


def hard_faults(results: list[dict], mode: str = "health") -> list[dict]:
    """The failed results among the hard-fault checks of `mode`, and the driver gone, in the document's order."""
    wanted = HARD_FAULTS + (EPILOG_FAULTS if mode == "epilog" else ())
    return [
        r
        for r in results
        if f"{r.get('group')}.{r['check']}" in wanted
        and (r["status"] == schema.FAIL or (r["check"] == "gpu_count" and _driver_gone(r)))
    ]


def not_read(results: list[dict]) -> str | None:
    """Why the GPUs could not be read at all when that is not the driver's doing (gpufleet's Python lacks
    nvidia-ml-py, say), or None."""
    count = next((r for r in results if r.get("group") == "gpu_inventory" and r["check"] == "gpu_count"), None)
    return count["reason"] if count and count["status"] == schema.ERROR and not _driver_gone(count) else None


def reason_text(faults: list[dict], results: list[dict] = ()) -> str:
    """`<class> <check> <its reason> +N more` (`hw xid GPU 0: Xid 79 ...`), the words after gpufleet's PREFIX
    (gpufleet.base.slurm.reason, by the health check): the class and check within what `sinfo -R` shows; a reason the
    other failing results of the document share (no driver: every NVML check) is named once as the cause, with how
    many checks gave it (causes.label)."""
    first = faults[0]
    group = next((g for g in causes.grouped(list(results)) if causes.in_shared(first, [g])), None)
    what = causes.label(group) if group else f"{first['check']} {first['reason']}"
    others = [f for f in faults[1:] if not (group and causes.in_shared(f, [group]))]
    more = f" +{len(others)} more" if others else ""
    cls = (group or {}).get("class") or failure_class.of(first)
    return f"{slurm.class_word(cls)} {what}{more}"
