"""The host's own throughput (benchmarks.host) judged: memory bandwidth per NUMA node, the scratch drive's write and
read bandwidth and its free space, a data loader's tokens a second a GPU against what the training jobs of the
seeds' shape need. A CPU run (no GPU on the machine) keeps every figure and judges none (`skip`, CPU_NOTE)."""

from __future__ import annotations

import statistics

from gpufleet.base.registry import registers
from gpufleet.base import calibration, profiles
from gpufleet.checks.benchmarks import CPU_NOTE
from gpufleet.collect.host.platform import allocation_text
from gpufleet.base.judge import MIN, Limit, below_pct, judge
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, result

NUMA_KEY = "host_memory_numa_below_pct_max"
MEMORY_KEY = "host_memory_gbps_min"
FREE_KEY = "disk_scratch_free_gib_min"
LOADER_KEY = "loader_tokens_per_s_per_gpu_min"
# What a GPU of a training job of the seeds' shape eats, tokens a second (the sources: LOADER_KEY in host_declared.py).
NEEDS = (
    ("GPT-2 124M at llm.c's pace", 468_000, "llm.c on 8 x H100, 1024-token samples: 457 samples/s a GPU"),
    ("the seeds' GPT-2 gate", 41_480, "8 x H100, 512-token samples, batch 8: 81 samples/s a GPU"),
    ("the LoRA fine-tune of Qwen2-7B", 14_100, "NeMo Automodel's best, 4096-token samples: 3.4 samples/s a GPU"),
)
MEMORY_REMEDY = (
    "a NUMA node's memory slower than its siblings' is a DIMM missing, failed or in the wrong slot, or a channel "
    "down: compare `dmidecode -t memory` (size, speed, locator) across the sockets and the BMC's event log"
)
DISK_REMEDY = (
    "check the drive's health (host_hygiene.nvme_health), its PCIe link (benchmark.pcie_links), that the scratch "
    "folder is on the local NVMe drive and not a network or root file system, and what else writes to it"
)
FULL_REMEDY = (
    "free the scratch drive (old checkpoints, datasets, core files: `du -xsh <scratch>/*`) or point "
    "gpufleet_scratch_dir at a drive with room; a job stages its data and checkpoints there"
)


def _cpu(check: str, what: str, value, unit: str, threshold: dict | None, detail: dict):
    return result(
        check, SKIP, f"{what} {value} {unit}; {CPU_NOTE}", value=value, unit=unit, threshold=threshold, detail=detail
    )


def memory_result(out: dict, profile: dict, cpu: bool) -> dict:
    check, part = "host_memory_bandwidth", out.get("memory") or {}
    siblings = calibration.entry(profile["thresholds"], NUMA_KEY, "host_memory_gbps")
    floor = profiles.value(profile, MEMORY_KEY)
    threshold = profiles.threshold(profile, MEMORY_KEY, **{NUMA_KEY: siblings})
    detail = {"per_node": part.get("per_node"), "method": part.get("method")}
    nodes = {n: v for n, v in (part.get("per_node") or {}).items() if "gbps" in v}
    broken = {n: v["error"] for n, v in (part.get("per_node") or {}).items() if "error" in v}
    if part.get("error") or broken or not nodes:
        why = part.get("error") or "; ".join(f"NUMA node {n}: {e}" for n, e in broken.items()) or "no figure"
        return result(check, ERROR, f"host memory bandwidth not measured: {why}", threshold=threshold, detail=detail)
    figures = ", ".join(f"NUMA node {n} {v['gbps']:g} GB/s ({v['threads']} threads)" for n, v in nodes.items())
    slowest = min(v["gbps"] for v in nodes.values())
    if cpu:
        return _cpu(check, f"host memory triad ({figures}), slowest node", slowest, "GB/s", threshold, detail)
    median = statistics.median(v["gbps"] for v in nodes.values())
    low = {n: below_pct(v["gbps"], median) for n, v in nodes.items()}
    detail["below_siblings_pct"] = low
    parts = []
    if len(nodes) > 1 and siblings["value"] is not None:
        limit = Limit(NUMA_KEY, siblings["value"])
        parts += [
            f"NUMA node {n} {nodes[n]['gbps']:g} GB/s is {pct:.1f}% below its siblings' median {median:g} GB/s "
            f"(more than {siblings['value']:g}%{calibration.uncalibrated_text(siblings)})"
            for n, pct in low.items()
            if judge(pct, limit).status != PASS
        ]
    if floor is not None:
        parts += [
            f"NUMA node {n} {v['gbps']:g} GB/s is under the minimum {floor:g} GB/s"
            for n, v in nodes.items()
            if judge(v["gbps"], Limit(MEMORY_KEY, floor, kind=MIN)).status != PASS
        ]
    if parts:
        return result(
            check,
            FAIL,
            "host memory triad: " + "; ".join(parts),
            value=slowest,
            unit="GB/s",
            threshold=threshold,
            remedy=MEMORY_REMEDY,
            detail=detail,
        )
    held = f"minimum {floor:g} GB/s a node" if floor is not None else f"no minimum set ({MEMORY_KEY})"
    same = f"; the nodes within {siblings['value']:g}% of their median" if len(nodes) > 1 else ""
    return result(
        check,
        PASS,
        f"host memory triad: {figures}; {held}{same}",
        value=slowest,
        unit="GB/s",
        threshold=threshold,
        detail=detail,
    )


def disk_results(out: dict, profile: dict, cpu: bool) -> list[dict]:
    part = out.get("disk") or {}
    free_min = profiles.value(profile, FREE_KEY)
    checks = ("disk_write_bandwidth", "disk_read_bandwidth")
    detail = {
        k: part.get(k)
        for k in ("scratch", "device", "tool", "free_bytes", "total_bytes", "method", "write", "read", "foreign")
    }
    if part.get("skipped"):
        return [result(c, SKIP, part["skipped"], detail=detail) for c in checks]
    if part.get("error") and not part.get("write"):
        bad_input = not part.get("scratch")  # the variable refused before anything was written
        return [
            result(
                c,
                ERROR,
                f"scratch drive not measured: {part['error']}",
                detail=detail,
                failure_class="configuration" if bad_input else None,
                remedy="set gpufleet_scratch_dir to a writable folder on the node's local NVMe drive"
                if bad_input
                else DISK_REMEDY,
            )
            for c in checks
        ]
    free_gib = (part.get("free_bytes") or 0) / 2**30
    full = part.get("refused") or (
        f"{part.get('scratch')} has {free_gib:.1f} GiB free, under the minimum {free_min:g} GiB"
        if free_min is not None and part.get("free_bytes") is not None and free_gib < free_min
        else None
    )
    out_list = []
    for check, phase in zip(checks, ("write", "read")):
        key = f"disk_{phase}_gbps_min"
        floor = profiles.value(profile, key)
        threshold = profiles.threshold(profile, key, **{FREE_KEY: profiles.threshold(profile, FREE_KEY)})
        fig = (part.get(phase) or {}).get("gbps")
        if full:
            out_list.append(
                result(
                    check,
                    FAIL,
                    f"the scratch drive is full: {full}",
                    value=fig,
                    unit="GB/s",
                    threshold=threshold,
                    remedy=FULL_REMEDY,
                    failure_class="environment",
                    detail=detail,
                )
            )
            continue
        if fig is None:
            out_list.append(
                result(
                    check,
                    ERROR,
                    f"scratch drive {phase} not measured: {part.get('error')}",
                    threshold=threshold,
                    remedy=DISK_REMEDY,
                    detail=detail,
                )
            )
            continue
        what = f"{part.get('tool')} {phase} of {part.get('scratch')} ({part.get('device')})"
        if cpu:
            out_list.append(_cpu(check, what, fig, "GB/s", threshold, detail))
        elif floor is not None and judge(fig, Limit(key, floor, kind=MIN)).status != PASS:
            out_list.append(
                result(
                    check,
                    FAIL,
                    f"{what} {fig:g} GB/s is under the minimum {floor:g} GB/s",
                    value=fig,
                    unit="GB/s",
                    threshold=threshold,
                    remedy=DISK_REMEDY,
                    detail=detail,
                )
            )
        else:
            held = f"minimum {floor:g}" if floor is not None else f"no minimum set ({key}): held against the fleet"
            out_list.append(
                result(
                    check,
                    PASS,
                    f"{what} {fig:g} GB/s ({held}); {free_gib:.0f} GiB free",
                    value=fig,
                    unit="GB/s",
                    threshold=threshold,
                    detail=detail,
                )
            )
    return out_list


def needs_text(tokens_per_s: float) -> str:
    return ", ".join(f"{tokens_per_s / need:,.3g} x {what} ({need / 1000:g}k)" for what, need, _ in NEEDS)


def loader_result(out: dict, profile: dict, cpu: bool) -> dict:
    check, part = "data_loader", out.get("loader") or {}
    minimum = profiles.value(profile, LOADER_KEY)
    threshold = profiles.threshold(profile, LOADER_KEY, min=minimum)
    detail = {
        **{k: v for k, v in part.items() if k != "method"},
        "method": part.get("method"),
        "needs_tokens_per_s_per_gpu": [{"job": w, "tokens_per_s": n, "shape": how} for w, n, how in NEEDS],
    }
    fig = part.get("tokens_per_s_per_gpu")
    if part.get("error") or not fig:
        return result(
            check,
            ERROR,
            f"data loader not measured: {part.get('error') or 'no figure'}",
            threshold=threshold,
            detail=detail,
        )
    per = f"a GPU of {part['gpus']}" if part.get("gpus") else "the whole host (no GPU here)"
    what = (
        f"data loader: {fig:,.0f} tokens/s ({part.get('samples_per_s_per_gpu'):,.0f} samples of 4096 tokens) for "
        f"{per}, {part.get('workers')} workers at {part.get('cpu_us_per_sample')} us of CPU a sample; what a GPU "
        f"needs, tokens/s: {needs_text(fig)}"
    )
    if cpu:
        return _cpu(check, what, fig, "tokens/s/GPU", threshold, detail)
    if minimum is not None and judge(fig, Limit(LOADER_KEY, minimum, kind=MIN)).status != PASS:
        return result(
            check,
            FAIL,
            f"{what}: under the minimum {minimum:,.0f} tokens/s a GPU",
            value=fig,
            unit="tokens/s/GPU",
            threshold=threshold,
            detail=detail,
            remedy="the host's CPUs cannot feed its GPUs: look for a neighbour on the CPUs "
            "(benchmark.host_processes), the CPU governor (host_hygiene.cpu_governor), CPUs offline or "
            "throttled (turbostat), and the memory (host_hygiene.memory_available)",
        )
    return result(check, PASS, what, value=fig, unit="tokens/s/GPU", threshold=threshold, detail=detail)


def with_allocation(res: dict, alloc: dict | None) -> dict:
    """A figure that depends on the host's CPUs with the CPUs it ran on beside it (collect.host.platform): a job
    given 72 of 288 CPUs measures 72 CPUs' worth."""
    if not alloc:
        return res
    said = allocation_text(alloc)
    return res.replace(
        reason=f"{res['reason']}; {said}" if said else res["reason"], detail={**res["detail"], "cpu_allocation": alloc}
    )


@registers("host", "judge")
def host(out: dict, profile: dict) -> list[dict]:
    """Each figure's result, with the CPUs it ran on where they matter and what the host is in its detail
    (`machine`: a virtual machine's host figures are held to their past otherwise, comparisons.trusted)."""
    cpu, alloc = out.get("device") == "cpu", out.get("cpu_allocation")
    res = [
        with_allocation(memory_result(out, profile, cpu), alloc),
        *disk_results(out, profile, cpu),
        with_allocation(loader_result(out, profile, cpu), alloc),
    ]
    machine = out.get("machine")
    return [r.replace(detail={**r["detail"], "machine": machine}) for r in res] if machine else res
