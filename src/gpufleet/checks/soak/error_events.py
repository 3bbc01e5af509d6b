"""soak_errors: a GPU's load that stopped, an all_reduce that gave wrong results, error counters that moved and Xid
events during the soak, each with its time."""

from __future__ import annotations

from gpufleet import profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.checks.soak.naming import Flags, soak_when
from gpufleet.schema import ERROR, FAIL, PASS, WARN, result

# Counters whose growth during a soak fails it: memory the GPU could not correct or repair.
SOAK_FAIL_COUNTERS = (
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "row_remap_uncorrectable",
    "row_remap_pending",
    "row_remap_failure",
)


def soak_errors(out, profile, base, gpus, cpu) -> dict:
    fail_codes = set(profiles.value(profile, "xid_fail_codes") or [])
    sampler = out.get("sampler") or {}
    events = [
        dict(e, utc=soak_when(out, e.get("t_s")))
        for e in sampler.get("events") or []
        if e.get("kind") in ("counter", "xid")
    ]
    detail = {
        **base,
        "events": events,
        "events_dropped": sampler.get("events_dropped"),
        "per_gpu": {
            i: {k: g.get(k) for k in ("uuid", "serial", "counters_start", "counters_end")}
            for i, g in (sampler.get("per_gpu") or {}).items()
        },
        "processes": {
            r: {k: g.get(k) for k in ("uuid", "nvml_index", "error", "done_s", "last_burst_s", "bursts")}
            for r, g in (out.get("gpus") or {}).items()
        },
        "nccl_wrong": (out.get("nccl") or {}).get("wrong"),
    }
    f, flags = Findings(), Flags()
    for rank, g in sorted((out.get("gpus") or {}).items(), key=lambda kv: int(kv[0])):
        if g.get("error"):
            index, prefix = gpus.label(rank)
            err = g["error"]
            f.add(
                FAIL,
                f"{prefix}the load stopped {soak_when(out, err.get('t_s'))}: {err.get('error')}",
                gpu=index,
                remedy="read the error and the node's gpu_health (Xid, ECC); a GPU that cannot hold a sustained load is not "
                "fit for training",
            )
            flags.add(FAIL, gpus.by_rank.get(rank))
    for wrong in (out.get("nccl") or {}).get("wrong") or []:
        rank = str(wrong["rank"])
        index, prefix = gpus.label(rank)
        f.add(
            FAIL,
            f"{prefix}all_reduce gave wrong results {soak_when(out, wrong['t_s'])}",
            gpu=index,
            remedy="wrong collective results point to a faulty GPU or NVLink: run gpu_health and the nccl benchmark",
        )
        flags.add(FAIL, gpus.by_rank.get(rank))
    if not cpu:
        if sampler.get("error") or not sampler.get("per_gpu"):
            f.add(
                ERROR,
                f"could not read the error counters during the soak: {sampler.get('error') or 'no GPU sampled'}",
                remedy="check NVML (`nvidia-smi`) on the node and run the soak again",
            )
        moved: dict[tuple, list] = {}
        for e in sampler.get("events") or []:
            if e.get("kind") == "counter":
                moved.setdefault((e["index"], e["counter"]), []).append(e)
            elif e.get("kind") == "xid":
                status = FAIL if e.get("xid") in fail_codes else WARN
                where = "" if e.get("index") is not None else f"PCI {e.get('pci')}: "
                f.add(
                    status,
                    f"{where}Xid {e.get('xid')} {soak_when(out, e.get('t_s'))}",
                    gpu=e.get("index"),
                    remedy="look the Xid up in NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors); the message is in detail.events",
                )
                flags.add(status, gpus.by_index.get(str(e.get("index"))))
        for (index, counter), evs in sorted(moved.items()):
            status = FAIL if counter in SOAK_FAIL_COUNTERS else WARN
            first, last = evs[0], evs[-1]
            f.add(
                status,
                f"{counter} {first['from']} -> {last['to']}, first {soak_when(out, first['t_s'])}",
                gpu=index,
                remedy=(
                    "memory errors the GPU could not correct under load: drain the node, reset the GPU; replace it if they "
                    "come back"
                    if status == FAIL
                    else "errors corrected under load: the fleet layer judges their rate (fleet.counter_rates); a link or "
                    "memory whose counts keep growing needs service"
                ),
            )
            flags.add(status, gpus.by_index.get(str(index)))
        log = sampler.get("kernel_log") or {}
        if log.get("error"):
            f.add(
                ERROR,
                f"Xid events not watched: {log['error']}",
                remedy="run the soak as root so /dev/kmsg can be read, or allow dmesg (sysctl kernel.dmesg_restrict=0)",
            )
    if cpu and f.status == PASS:
        return result(
            "soak_errors",
            schema.SKIP,
            f"{len(out.get('gpus') or {})} CPU processes ran to the end, all_reduce results correct; {CPU_NOTE}",
            value=0,
            unit="events",
            detail=detail,
        )
    ok = f"no error counter moved, no Xid, every GPU held the load to the end over {out.get('ran_s'):g} s" + (
        f", {out['nccl']['rounds']} all_reduce rounds correct" if out.get("nccl") else ""
    )
    return flags.apply(f.result("soak_errors", ok, value=len(events), unit="events", detail=detail))
