"""GPU memory: ECC mode and error counts, HBM row remapping, retired pages (before Ampere)."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.checks.gpu_inventory import UNREADABLE_REMEDY, Findings, gpu_check, not_supported, unreadable
from gpufleet.base.schema import ERROR, FAIL, SKIP, WARN

RESET_REMEDY = "drain the node, then reset the GPU with no process on it: `nvidia-smi -r -i {gpus}`"


def _ecc_unreadable(g: dict, fields: tuple) -> str | None:
    missing = [f for f in fields if g.get(f) is None]
    return f"{', '.join(missing)} unreadable ({unreadable(g, missing[0])})" if missing else None


def _repair_state(g: dict) -> str:
    """What the GPU's row remapping says of its past memory errors, where it was read: ' (N row(s) remapped ...)'."""
    rows = g.get("remapped_rows")
    if not isinstance(rows, dict):
        return ""
    state = "pending" if rows.get("pending") else "failed" if rows.get("failure") else "none pending or failed"
    return f" ({rows.get('uncorrectable') or 0} row(s) remapped for them, {state})"


@gpu_check("ecc")
def ecc(readings, gpus, profile):
    """ECC mode on; uncorrectable errors since the driver loaded fail, lifetime ones warn."""
    vol_max = profiles.value(profile, "ecc_volatile_uncorrected_max")
    agg_max = profiles.value(profile, "ecc_aggregate_uncorrected_max")
    counters = (
        "ecc_volatile_uncorrected",
        "ecc_volatile_corrected",
        "ecc_aggregate_uncorrected",
        "ecc_aggregate_corrected",
    )
    f = Findings()
    per_gpu, facts = [], {}
    for g in gpus:
        i = g["index"]
        per_gpu.append({"index": i, "ecc_mode_current": g.get("ecc_mode_current"), **{c: g.get(c) for c in counters}})
        mode = g.get("ecc_mode_current")
        if mode is None:
            f.add(ERROR, f"ECC mode unreadable ({unreadable(g, 'ecc_mode_current')})", gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        if not mode:
            f.add(
                FAIL, "ECC off", gpu=i, remedy="enable ECC: `nvidia-smi -i {gpus} -e 1`, then reset the GPU or reboot"
            )
            continue
        missing = _ecc_unreadable(g, ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"))
        if missing:
            f.add(ERROR, missing, gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        vol, agg = g["ecc_volatile_uncorrected"], g["ecc_aggregate_uncorrected"]
        if vol_max is not None and vol > vol_max:
            f.add(
                FAIL,
                f"{vol} volatile uncorrectable ECC errors",
                gpu=i,
                remedy=RESET_REMEDY + "; if uncorrectable errors come back, replace the GPU (RMA)",
            )
        if agg_max is not None and agg > agg_max:
            # A stable fact of this GPU: once a baseline run accepted it, only a change warns (fleet/facts.py).
            facts[f"ecc_aggregate_uncorrected:{g.get('uuid') or i}"] = agg
            f.add(
                WARN,
                f"{agg} uncorrectable ECC errors over its lifetime{_repair_state(g)}",
                gpu=i,
                remedy=(
                    "if the GPU's rows repaired them (none pending or failed), accept it with `gpufleet baseline set "
                    "<run>`: only a new error then warns; else ask the provider for the GPU's history"
                ),
            )
    vols = [p["ecc_volatile_uncorrected"] for p in per_gpu if p["ecc_volatile_uncorrected"] is not None]
    corrected = sum(p["ecc_volatile_corrected"] or 0 for p in per_gpu)
    return f.result(
        "ecc",
        f"ECC on, no uncorrectable errors ({corrected} corrected since the driver loaded, all GPUs)",
        value=max(vols) if vols else None,
        unit="errors",
        threshold=profiles.threshold(profile, "ecc_volatile_uncorrected_max", aggregate_max=agg_max),
        detail={"per_gpu": per_gpu, **({"facts": facts} if facts else {})},
    )


@gpu_check("row_remapping")
def row_remapping(readings, gpus, profile):
    """Ampere and later repair HBM rows: a pending remap needs a reset, a failed one a new GPU."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, rows = g["index"], g.get("remapped_rows")
        per_gpu.append({"index": i, "remapped_rows": rows})
        if rows is None and not_supported(g, "remapped_rows"):
            f.add(SKIP, "row remapping not supported (pre-Ampere GPU; see retired_pages)", gpu=i)
        elif rows is None:
            f.add(
                ERROR, f"remapped rows unreadable ({unreadable(g, 'remapped_rows')})", gpu=i, remedy=UNREADABLE_REMEDY
            )
        else:
            if rows.get("failure"):
                f.add(
                    FAIL, "row remapping failed", gpu=i, remedy="GPU needs replacement (RMA): it ran out of spare rows"
                )
            if rows.get("pending"):
                f.add(
                    FAIL,
                    "row remap pending",
                    gpu=i,
                    remedy="reset the GPU to apply the remap: `nvidia-smi -r -i {gpus}` with no process on it",
                )
    total = sum((p["remapped_rows"] or {}).get("uncorrectable") or 0 for p in per_gpu)
    return f.result(
        "row_remapping",
        f"no pending or failed row remaps ({total} rows remapped for uncorrectable errors, all GPUs)",
        value=total,
        unit="rows",
        detail={"per_gpu": per_gpu},
    )


@gpu_check("retired_pages")
def retired_pages(readings, gpus, profile):
    """Pre-Ampere GPUs retire memory pages; a pending retirement needs a reset."""
    f = Findings()
    per_gpu = []
    for g in gpus:
        i, pages = g["index"], g.get("retired_pages")
        per_gpu.append({"index": i, "retired_pages": pages})
        if pages is None and not_supported(g, "retired_pages"):
            f.add(SKIP, "page retirement not used (Ampere and later remap rows instead; see row_remapping)", gpu=i)
        elif pages is None:
            f.add(
                ERROR, f"retired pages unreadable ({unreadable(g, 'retired_pages')})", gpu=i, remedy=UNREADABLE_REMEDY
            )
        elif pages.get("pending"):
            f.add(
                FAIL,
                "page retirement pending",
                gpu=i,
                remedy="reset the GPU to retire the pages: `nvidia-smi -r -i {gpus}` with no process on it",
            )
    total = sum(
        ((p["retired_pages"] or {}).get("sbe") or 0) + ((p["retired_pages"] or {}).get("dbe") or 0) for p in per_gpu
    )
    return f.result(
        "retired_pages",
        f"no retirement pending ({total} pages retired, all GPUs)",
        value=total,
        unit="pages",
        detail={"per_gpu": per_gpu},
    )
