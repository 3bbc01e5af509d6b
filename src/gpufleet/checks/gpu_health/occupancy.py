"""Whether the GPUs this node's jobs may use are free: no process on them before the benchmarks run."""

from __future__ import annotations

from gpufleet.checks.gpu_inventory import UNREADABLE_REMEDY, Findings, gpu_check, gpu_list, unreadable
from gpufleet.collect.nvml.processes import visible_indices
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, result

PROCESS_REMEDY = (
    "stop the processes named, or drain the node (Slurm: `scontrol update NodeName=<node> State=DRAIN "
    "Reason=validation`) and let its jobs end, then validate again: benchmark figures taken beside another "
    "workload are not the node's; `nvidia-smi -i {gpus}` lists the processes"
)


@gpu_check("processes")
def processes(readings, gpus, profile):
    """No process on any GPU this node's jobs may use (CUDA_VISIBLE_DEVICES), before the benchmarks run."""
    cvd = readings["nvml"].get("cuda_visible_devices")
    vis = visible_indices(gpus, cvd)
    judged = [g for g in gpus if g["index"] in set(vis["indices"])]
    visibility = {k: vis[k] for k in ("cuda_visible_devices", "indices", "all", "resolved", "note")}
    if not judged:
        return result(
            "processes",
            SKIP,
            f"CUDA_VISIBLE_DEVICES={cvd!r} leaves no GPU to this node, so there is none to judge",
            detail={"visibility": visibility},
        )
    f = Findings()
    listing = []
    for g in judged:
        i, procs = g["index"], g.get("processes")
        if procs is None:
            f.add(ERROR, f"GPU processes unreadable ({unreadable(g, 'processes')})", gpu=i, remedy=UNREADABLE_REMEDY)
            continue
        for p in procs:
            listing.append({"index": i, "uuid": g.get("uuid"), **p})
            name = p.get("name") or "name unknown: not in this host's /proc"
            mem = f"{p['used_memory_mib']} MiB" if p.get("used_memory_mib") is not None else "memory not reported"
            f.add(FAIL, f"pid {p['pid']} ({name}, {mem})", gpu=i, remedy=PROCESS_REMEDY)
    if vis["note"]:
        f.add(PASS, vis["note"])
    n = len(judged)
    res = f.result(
        "processes",
        f"no process on the {n} GPU{'s' if n != 1 else ''} of this node"
        + ("" if vis["all"] else f" ({gpu_list(vis['indices'])})"),
        value=len(listing),
        unit="processes",
        detail={"processes": listing, "visibility": visibility},
    )
    if not vis["resolved"] and res["status"] != PASS:  # a passing reason carries the note already
        return res.replace(reason=f"{res['reason']}; {vis['note']}")
    return res
