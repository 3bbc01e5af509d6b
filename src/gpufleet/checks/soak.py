"""The soak's judgement (gpufleet.bench.soak.run()'s output): soak_throttle, soak_errors and soak_slowdown, each
naming the GPU and the time it happened."""

from __future__ import annotations

import statistics
import time

from gpufleet import calibration, judge, profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE, flag_gpus
from gpufleet.checks.gpu_inventory import Findings
from gpufleet.collect.nvml.clocks import HW_SLOWDOWN_EVENTS
from gpufleet.numbers import significant
from gpufleet.schema import ERROR, FAIL, PASS, WARN, result

# A GPU's best windows of a soak are its own reference: every window is judged against their median
# (at most half the windows, so that a short soak's slow stretch is not part of its own reference).
SOAK_BEST_WINDOWS = 3
# Counters whose growth during a soak fails it: memory the GPU could not correct or repair.
SOAK_FAIL_COUNTERS = (
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "row_remap_uncorrectable",
    "row_remap_pending",
    "row_remap_failure",
)
SLOWDOWN_KEY = "soak_slowdown_pct_max"
# A soak window's figures and the metric each is calibrated as (calibration.py's soak_window_pct).
WINDOW_METRICS = {
    "matmul_tflops": "matmul_bf16_tflops",
    "hbm_gbps": "hbm_copy_gbps",
    "busbw_gbps": "nccl_soak_all_reduce_busbw_gbps",
}
SOAK_REMEDY_THROTTLE = (
    "hardware slowdown under sustained load: check cooling (inlet temperature, fans, airflow for this "
    "GPU's slot) and power delivery (PSUs, BMC power capping); detail.per_gpu has clocks, temperature "
    "and power per window"
)


def _soak_when(out: dict, t_s: float | None, prep: str = "at") -> str:
    """ "at 2026-11-23T10:12:31Z (751 s into the soak)": the time in UTC and from the soak's start."""
    if t_s is None:
        return "at an unknown time"
    start = out.get("started_epoch")
    if start is None:
        return f"{prep} {t_s:.0f} s into the soak"
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + t_s))
    return f"{prep} {utc} ({t_s:.0f} s into the soak)"


class _SoakGpus:
    """Who each soak process loaded: NVML index, uuid, serial, and the label a reason gives it."""

    def __init__(self, out: dict):
        self.cpu = out["device"] == "cpu"
        sampler = (out.get("sampler") or {}).get("per_gpu") or {}
        self.by_rank = {}
        for rank, g in (out.get("gpus") or {}).items():
            index = g.get("nvml_index")
            serial = (sampler.get(str(index)) or {}).get("serial") if index is not None else None
            self.by_rank[rank] = {"index": index, "uuid": g.get("uuid"), "serial": serial}
        self.by_index = {
            str(i): {"index": int(i), "uuid": g.get("uuid"), "serial": g.get("serial")} for i, g in sampler.items()
        }

    def label(self, rank: str) -> tuple[int | None, str]:
        """(NVML index for Findings, or None with the label written into the text)."""
        if self.cpu:
            return None, f"process {rank}: "
        index = self.by_rank.get(rank, {}).get("index")
        return (index, "") if index is not None else (None, f"CUDA device {rank}: ")


class _Flags:
    """GPUs behind each status, to name them in detail.flagged_gpus (the worst status's)."""

    def __init__(self):
        self.by_status: dict[str, list] = {}

    def add(self, status: str, gpu: dict | None) -> None:
        if gpu:
            self.by_status.setdefault(status, []).append(gpu)

    def apply(self, res: dict) -> dict:
        res.get("detail", {}).pop("flagged_gpus", None)  # Findings' own has no uuid for these indices
        return flag_gpus(res, self.by_status.get(res["status"], []))


def disturbed_windows(out: dict) -> list[int]:
    """The soak's windows in which its sampler saw a foreign process on any GPU: every GPU of the node loads
    together (each round ends in an all_reduce), so such a window is no GPU's own figure."""
    per_gpu = (out.get("sampler") or {}).get("per_gpu") or {}
    return sorted({w["index"] for g in per_gpu.values() for w in g.get("windows") or [] if w.get("foreign_processes")})


def remeasure_plan(first: dict, profile: dict) -> dict:
    """bench.soak.run's options to measure a disturbed soak's windows again: as long as those windows (two at
    least, to compare), at most soak_remeasure_max_s, whatever the soak's own length."""
    cap = profiles.value(profile, "soak_remeasure_max_s") or 0
    window = min(first.get("window_s") or 30.0, cap / 2) if cap else first.get("window_s") or 30.0
    n = max(2, len(disturbed_windows(first)))
    duration = min(cap, n * window) if cap else n * window
    return {"duration_s": max(duration, 2 * window), "window_s": window}


def combined(first: dict, again: dict) -> dict:
    """What a disturbed soak is judged on: the first soak with its disturbed windows left out of the slowdown
    judgement (their figures kept apart), and the short soak that measured them again (soak() judges both)."""
    gone = set(disturbed_windows(first))
    gpus = {}
    for rank, g in (first.get("gpus") or {}).items():
        windows = [
            w
            if w["index"] not in gone
            else {
                **w,
                "matmul_tflops": None,
                "hbm_gbps": None,
                "disturbed": True,
                "disturbed_figures": {"matmul_tflops": w.get("matmul_tflops"), "hbm_gbps": w.get("hbm_gbps")},
            }
            for w in g.get("windows") or []
        ]
        kept = {k: [w[k] for w in windows if w.get(k) is not None] for k in ("matmul_tflops", "hbm_gbps")}
        gpus[rank] = {
            **g,
            "windows": windows,
            **{f"{k}_median": significant(statistics.median(v)) if v else None for k, v in kept.items()},
        }
    nccl = first.get("nccl")
    if nccl:
        nccl = {
            **nccl,
            "windows": [
                w if w["index"] not in gone else {**w, "busbw_gbps": None, "disturbed": True}
                for w in nccl.get("windows") or []
            ],
        }
    return {**first, "gpus": gpus, "nccl": nccl, "disturbed_windows": sorted(gone), "remeasured": again}


def soak(out: dict, profile: dict) -> list[dict]:
    """The soak's verdict: soak_throttle, soak_errors and soak_slowdown, each naming the GPU and the time.

    A soak that could not start is one `soak` result (fail). On the CPU (no CUDA) only a process that
    failed or an all_reduce that gave wrong results counts; the rest is `skip`, not a performance figure.
    A disturbed soak measured again (combined()) is judged on both parts, each check the worse of the two.
    """
    if out.get("remeasured") is not None:
        return _both(out, profile)
    return _one(out, profile)


def _both(out: dict, profile: dict) -> list[dict]:
    first = {k: v for k, v in out.items() if k != "remeasured"}
    again = out["remeasured"]
    windows = ", ".join(str(w) for w in out.get("disturbed_windows") or []) or "none"
    head = (
        f"the soak ({first.get('ran_s'):g} s; windows {windows} disturbed, left out of the slowdown judgement)",
        f"those windows measured again once the GPUs were quiet ({again.get('ran_s'):g} s)",
    )
    mine, theirs = {r["check"]: r for r in _one(first, profile)}, {r["check"]: r for r in _one(again, profile)}
    results = []
    for check in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(check), theirs.get(check)
        if a is None or b is None:
            results.append(a or b)
            continue
        worse = b if schema.severity(b["status"]) > schema.severity(a["status"]) else a
        remedy = "; ".join(
            dict.fromkeys(r["remedy"] for r in (a, b) if r.get("remedy") and r["status"] not in (PASS, schema.SKIP))
        )
        flagged = [g for r in (a, b) if r["status"] == worse["status"] for g in r["detail"].get("flagged_gpus") or []]
        values = [r["value"] for r in (a, b) if isinstance(r.get("value"), (int, float))]
        detail = {**a["detail"], "remeasured": b["detail"], "disturbed_windows": out.get("disturbed_windows")}
        detail.pop("flagged_gpus", None)
        res = result(
            check,
            worse["status"],
            f"{head[0]}: {a['reason']}; {head[1]}: {b['reason']}",
            value=max(values) if values else None,
            unit=worse.get("unit"),
            threshold=worse.get("threshold"),
            remedy=remedy or None,
            detail=detail,
        )
        results.append(flag_gpus(res, flagged))
    return results


def _one(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    base = {
        k: out.get(k)
        for k in (
            "method",
            "versions",
            "started",
            "duration_s",
            "ran_s",
            "window_s",
            "n_windows",
            "world_size",
            "stopped_early",
            "stop_reason",
            "after_effects",
        )
    }
    if out.get("setup_error"):
        return [
            result(
                "soak",
                FAIL,
                f"soak could not start: {out['setup_error']}",
                detail=base,
                remedy="read the error: a GPU that cannot hold a sustained load (out of memory beside another "
                "process, a CUDA or NCCL error) is not fit for training; run gpu_health",
            )
        ]
    gpus = _SoakGpus(out)
    return [
        _soak_throttle(out, profile, base, gpus, Findings, cpu),
        _soak_errors(out, profile, base, gpus, Findings, cpu),
        _soak_slowdown(out, profile, base, gpus, Findings, cpu),
    ]


def _soak_throttle(out, profile, base, gpus, Findings, cpu) -> dict:
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
    f, flags = Findings(), _Flags()
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
                FAIL, f"{names} {_soak_when(out, first)}, {seconds:g} s in all", gpu=int(i), remedy=SOAK_REMEDY_THROTTLE
            )
            flags.add(FAIL, gpus.by_index.get(i))
        if g.get("error"):
            f.add(PASS, f"some readings failed: {g['error']}", gpu=int(i))
    ok = f"no hardware or thermal slowdown on {len(sampler['per_gpu'])} GPU(s) over {out.get('ran_s'):g} s" + (
        f" (lowest SM clock {min(clocks)} MHz)" if clocks else ""
    )
    return flags.apply(f.result("soak_throttle", ok, value=worst, unit="s", threshold=threshold, detail=detail))


def _soak_errors(out, profile, base, gpus, Findings, cpu) -> dict:
    fail_codes = set(profiles.value(profile, "xid_fail_codes") or [])
    sampler = out.get("sampler") or {}
    events = [
        dict(e, utc=_soak_when(out, e.get("t_s")))
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
    f, flags = Findings(), _Flags()
    for rank, g in sorted((out.get("gpus") or {}).items(), key=lambda kv: int(kv[0])):
        if g.get("error"):
            index, prefix = gpus.label(rank)
            err = g["error"]
            f.add(
                FAIL,
                f"{prefix}the load stopped {_soak_when(out, err.get('t_s'))}: {err.get('error')}",
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
            f"{prefix}all_reduce gave wrong results {_soak_when(out, wrong['t_s'])}",
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
                    f"{where}Xid {e.get('xid')} {_soak_when(out, e.get('t_s'))}",
                    gpu=e.get("index"),
                    remedy="look the Xid up in NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors); the message is in detail.events",
                )
                flags.add(status, gpus.by_index.get(str(e.get("index"))))
        for (index, counter), evs in sorted(moved.items()):
            status = FAIL if counter in SOAK_FAIL_COUNTERS else WARN
            first, last = evs[0], evs[-1]
            f.add(
                status,
                f"{counter} {first['from']} -> {last['to']}, first {_soak_when(out, first['t_s'])}",
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


def _drop_pct(base: float, value: float) -> float:
    return round(100 * (base - value) / base, 1) if base else 0.0


def _stretches(drops: list, limit: float | None) -> list[list]:
    """[(window, drop %)] -> runs of consecutive windows more than `limit`% down."""
    stretches: list[list] = []
    for w, d in drops:
        if limit is None or judge.judge(d, judge.Limit(SLOWDOWN_KEY, limit)).status == PASS:
            continue
        if stretches and stretches[-1][-1][0]["index"] == w["index"] - 1:
            stretches[-1].append((w, d))
        else:
            stretches.append([(w, d)])
    return stretches


def _slowed(windows: list, key: str, limit: float | None) -> tuple[list, float | None, list]:
    """(stretches of consecutive windows more than `limit`% below the median of the best windows, that median,
    every window's drop). The reference is the best windows, not the first: a slow stretch at the start would
    lower its own reference and hide."""
    vals = [(w, w[key]) for w in windows if w.get(key) is not None]
    if len(vals) < 2:
        return [], None, []
    n_best = min(SOAK_BEST_WINDOWS, max(1, len(vals) // 2))
    best = statistics.median(sorted((v for _, v in vals), reverse=True)[:n_best])
    drops = [(w, _drop_pct(best, v)) for w, v in vals]
    return _stretches(drops, limit), best, drops


def _behind_siblings(per_gpu: dict, rank: str, key: str, limit: float | None) -> tuple[list, dict]:
    """(stretches of this GPU's windows more than `limit`% below the median of every GPU in the same window,
    {window index: that median}); a node of one GPU has no siblings."""
    if len(per_gpu) < 2:
        return [], {}
    node: dict[int, float] = {}
    for w in range(max(len(g.get("windows") or []) for g in per_gpu.values())):
        vals = [
            g["windows"][w][key]
            for g in per_gpu.values()
            if w < len(g.get("windows") or []) and g["windows"][w].get(key) is not None
        ]
        if len(vals) >= 2:
            node[w] = statistics.median(vals)
    drops = [
        (w, _drop_pct(node[w["index"]], w[key]))
        for w in per_gpu[rank].get("windows") or []
        if w.get(key) is not None and w["index"] in node
    ]
    return _stretches(drops, limit), node


def _stretch_text(out: dict, g: dict, prefix: str, what: str, unit: str, key: str, stretch: list, against: str) -> str:
    """ "GPU 1: bf16 matmul 700 TFLOPS in the window from <when> and 2 window(s) after it, <against>; the sampler saw..." """
    first = stretch[0][0]
    span = f" and {len(stretch) - 1} window(s) after it" if len(stretch) > 1 else ""
    return (
        f"{prefix}{what} {first[key]:g} {unit} in the window {_soak_when(out, first['start_s'], 'from')}{span}, "
        f"{against}; {_sampler_saw(out, g.get('nvml_index'), [w for w, _ in stretch])}"
    )


def _sampler_saw(out: dict, index: int | None, windows: list) -> str:
    """What the soak's sampler saw on one GPU over these windows: clocks, reasons, power and foreign processes."""
    sampled = (((out.get("sampler") or {}).get("per_gpu") or {}).get(str(index)) or {}).get("windows") or []
    rows = [sampled[w["index"]] for w in windows if w["index"] < len(sampled)]
    if not rows:
        return "the sampler saw nothing of this GPU then"
    sm = [r["sm_clock_median_mhz"] for r in rows if r.get("sm_clock_median_mhz") is not None]
    power = [r["power_median_w"] for r in rows if r.get("power_median_w") is not None]
    reasons = sorted({n for r in rows for n in r.get("reasons") or []})
    procs = {p["pid"]: p for r in rows for p in r.get("foreign_processes") or []}
    saw = [
        f"SM clock median {min(sm):g} MHz" if sm else "SM clock unread",
        f"power median {min(power):g} W" if power else "power unread",
        f"clock event reasons {', '.join(reasons)}" if reasons else "no clock event reason",
    ]
    saw.append(
        "foreign process(es) "
        + ", ".join(
            f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {p.get('used_memory_mib')} MiB)"
            for p in procs.values()
        )
        if procs
        else "no foreign process"
    )
    return "the sampler saw then: " + "; ".join(saw)


def _soak_slowdown(out, profile, base_detail, gpus, Findings, cpu) -> dict:
    limit = profiles.value(profile, SLOWDOWN_KEY)
    threshold = profiles.threshold(profile, SLOWDOWN_KEY, max=limit, best_windows=SOAK_BEST_WINDOWS)
    # A calibrated model's limit is per figure: its healthy windows' spread (calibration.py, soak_window_pct).
    limits = {k: calibration.entry(profile["thresholds"], SLOWDOWN_KEY, m)["value"] for k, m in WINDOW_METRICS.items()}
    per_gpu = {
        r: {k: g.get(k) for k in ("uuid", "nvml_index", "name", "windows", "matmul_tflops_median", "hbm_gbps_median")}
        for r, g in (out.get("gpus") or {}).items()
    }
    detail = {**base_detail, "per_gpu": per_gpu, "nccl": out.get("nccl")}
    n_windows = out.get("n_windows") or 0
    if cpu:
        return result(
            "soak_slowdown",
            schema.SKIP,
            f"{n_windows} windows of {out.get('window_s'):g} s on {len(per_gpu)} CPU processes; {CPU_NOTE}",
            threshold=threshold,
            detail=detail,
        )
    f, flags = Findings(), _Flags()
    worst = 0.0
    judged = False
    metrics = (("matmul_tflops", "bf16 matmul", "TFLOPS"), ("hbm_gbps", "HBM copy", "GB/s"))
    remedy = (
        "a GPU that cannot hold its throughput: compare its clocks, temperature and power per window "
        "(soak_throttle detail) with the other GPUs; check cooling and power, and whether another process "
        "used the GPU (gpu_health.processes)"
    )
    for rank, g in sorted(per_gpu.items(), key=lambda kv: int(kv[0])):
        index, prefix = gpus.label(rank)
        for key, what, unit in metrics:
            stretches, best, drops = _slowed(g.get("windows") or [], key, limits[key])
            if best is None:
                continue
            judged = True
            worst = max([worst] + [d for _, d in drops])
            for stretch in stretches:
                low, low_drop = max(stretch, key=lambda wd: wd[1])
                head = stretch[0][0][key]
                f.add(
                    FAIL,
                    _stretch_text(
                        out,
                        g,
                        prefix,
                        what,
                        unit,
                        key,
                        stretch,
                        f"{_drop_pct(best, head):g}% below its best windows' median {significant(best):g} {unit} "
                        f"(lowest {low[key]:g} {unit}, {low_drop:g}% below)",
                    ),
                    gpu=index,
                    remedy=remedy,
                )
                flags.add(FAIL, gpus.by_rank.get(rank))
            # Window by window against its siblings: a stretch the whole node shared is not this GPU's.
            own = {w["index"] for stretch in stretches for w, _ in stretch}
            behind, node = _behind_siblings(per_gpu, rank, key, limits[key])
            for stretch in behind:
                if all(w["index"] in own for w, _ in stretch):
                    continue  # named already against its own best windows
                first, drop = stretch[0]
                worst = max([worst] + [d for _, d in stretch])
                f.add(
                    FAIL,
                    _stretch_text(
                        out,
                        g,
                        prefix,
                        what,
                        unit,
                        key,
                        stretch,
                        f"{drop:g}% below the node's median GPU in that window "
                        f"({significant(node[first['index']]):g} {unit})",
                    ),
                    gpu=index,
                    remedy=remedy,
                )
                flags.add(FAIL, gpus.by_rank.get(rank))
    # Against its siblings over the soak: a GPU slow from the first window on is not slower than itself.
    for key, what, unit in metrics:
        medians = {r: g[f"{key}_median"] for r, g in per_gpu.items() if g.get(f"{key}_median") is not None}
        if len(medians) < 2:
            continue
        node = statistics.median(medians.values())
        for rank, m in sorted(medians.items(), key=lambda kv: int(kv[0])):
            drop = _drop_pct(node, m)
            worst = max(worst, drop)
            if limits[key] is not None and judge.judge(drop, judge.Limit(SLOWDOWN_KEY, limits[key])).status != PASS:
                index, prefix = gpus.label(rank)
                f.add(
                    FAIL,
                    f"{prefix}{what} median {m:g} {unit} over the soak, {drop:g}% below the node's median GPU "
                    f"({significant(node):g} {unit})",
                    gpu=index,
                    remedy=remedy,
                )
                flags.add(FAIL, gpus.by_rank.get(rank))
    nccl = out.get("nccl") or {}
    stretches, best, drops = _slowed(nccl.get("windows") or [], "busbw_gbps", limits["busbw_gbps"])
    if best is not None:
        worst = max([worst] + [d for _, d in drops])
        for stretch in stretches:
            first = stretch[0][0]
            f.add(
                FAIL,
                f"all_reduce busbw {first['busbw_gbps']:g} GB/s in the window {_soak_when(out, first['start_s'], 'from')}, "
                f"{_drop_pct(best, first['busbw_gbps']):g}% below the best windows' median {significant(best):g} GB/s",
                remedy="NVLink or NVSwitch bandwidth fell under load: check gpu_health.nvlink and the NVLink error counters "
                "(soak_errors), and the fabric manager",
            )
    if not judged:
        return result(
            "soak_slowdown",
            schema.SKIP,
            f"{n_windows} window(s) of {out.get('window_s'):g} s: a slowdown needs two or more, to compare "
            "each window with the best; soak longer",
            threshold=threshold,
            detail=detail,
        )
    ok = (
        f"every window of every GPU within {limit:g}% of its best windows and of its siblings over {n_windows} windows of "
        f"{out.get('window_s'):g} s"
        if limit is not None
        else f"{n_windows} windows judged"
    )
    return flags.apply(f.result("soak_slowdown", ok, value=worst, unit="%", threshold=threshold, detail=detail))
