"""soak_errors: a GPU's load that stopped, an all_reduce that gave wrong results, error counters that moved and Xid
events during the soak, each with its time. NVLink CRC and PCIe replay counts are judged as rates over the soak and
NVLink replays and recoveries as increases, by checks.counter_rates' rule (the node stage's, on the controller)."""

from __future__ import annotations

from gpufleet.base import profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.checks.counter_rates import (
    INCREASE,
    RATES,
    REPLAY_RECOVERY_KEY,
    judge_increase,
    judge_rate,
    limit_text,
    link_growth,
    rate_text,
    seconds_text,
)
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.benchmarks.soak.soak_naming import Flags, soak_when
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN, result

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
            i: {k: g.get(k) for k in ("uuid", "serial", "name", "counters_start", "counters_end")}
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
        window_s = out.get("ran_s")  # the sampler reads the counters just before the soak starts and once it ended
        rates: dict = {}
        for (index, counter), evs in sorted(moved.items()):
            status, text = _counter_finding(out, profile, sampler, index, counter, evs, window_s, rates)
            f.add(status, text, gpu=index, remedy=_REMEDY.get((status, counter), _REMEDY.get(status)))
            if status in (WARN, FAIL):
                flags.add(status, gpus.by_index.get(str(index)))
        detail["counter_rates"] = rates
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
    moved_any = any(e.get("kind") == "counter" for e in sampler.get("events") or [])
    ok = (
        f"no error counter {'past its limit' if moved_any else 'moved'}, no Xid, every GPU held the load to the end over {out.get('ran_s'):g} s"
        + (f", {out['nccl']['rounds']} all_reduce rounds correct" if out.get("nccl") else "")
    )
    return flags.apply(f.result("soak_errors", ok, value=len(events), unit="events", detail=detail))


_NVLINK_REMEDY = (
    "an NVLink past DCGM's limits under load: `nvidia-smi nvlink -e -i <index>` shows each link's counters; reset the "
    "GPUs and run the soak again; a link that keeps erring needs the baseboard or NVSwitch tray serviced"
)
# The remedy of a counter's finding: (status, counter) first, then the status's.
_REMEDY = {
    FAIL: "memory errors the GPU could not correct under load: drain the node, reset the GPU; replace it if they come "
    "back",
    WARN: "errors corrected under load: watch the GPU in the next runs (gpufleet history GPU-UUID); a link or memory "
    "whose counts keep growing needs service",
    **{(FAIL, c): _NVLINK_REMEDY for c in (*INCREASE, "nvlink_crc_flit", "nvlink_crc_data")},
    (WARN, "pcie_replay"): "PCIe replays past DCGM's rate under load: reseat the GPU or its riser or cable, update the "
    "firmware, and watch it in the next runs",
}


def _counter_finding(out, profile, sampler, index, counter, evs, window_s, rates) -> tuple[str, str]:
    """(status, text) of one counter of one GPU that moved during the soak: its rate or increase by
    checks.counter_rates' rule (each link's rate where the sampler read the links), uncorrectable memory errors fail,
    corrected ones warn. Records a rate in `rates` {index: {counter: judged}}."""
    first, last = evs[0], evs[-1]
    moved = f"{counter} {first['from']} -> {last['to']}, first {soak_when(out, first['t_s'])}"
    growth = last["to"] - first["from"]
    if counter in RATES:
        g = (sampler.get("per_gpu") or {}).get(str(index)) or {}
        links = link_growth(
            (g.get("counters_start") or {}).get("nvlink_links"),
            (g.get("counters_end") or {}).get("nvlink_links"),
            counter,
        )
        rated = judge_rate(counter, growth, window_s, profiles.value(profile, RATES[counter].key), links)
        rates.setdefault(str(index), {})[counter] = rated
        over = f"over {seconds_text(window_s)}" if window_s else "over an unknown time"
        return rated["status"], f"{moved}: {rate_text(counter, rated)} {over}, {limit_text(counter, rated['limit'])}"
    if counter in INCREASE:
        return judge_increase(growth, profiles.value(profile, REPLAY_RECOVERY_KEY), watched=True), moved
    return (FAIL if counter in SOAK_FAIL_COUNTERS else WARN), moved
