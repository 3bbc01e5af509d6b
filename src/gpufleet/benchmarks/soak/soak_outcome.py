"""What a soak's processes sent, made into its output: which rank ended a soak that stopped early (attribute), and
the windows of each GPU and of NCCL (finish)."""

from __future__ import annotations

import statistics
import time

from gpufleet.base.numbers import significant


def window_figures(bursts: list, window_s: float, n_windows: int, unit_scale: float) -> list:
    """[(t_end, seconds, work)] -> per window: work / timed seconds (scaled), and the burst count."""
    sums = [[0.0, 0.0, 0] for _ in range(n_windows)]
    for t_end, secs, work in bursts:
        w = min(int(t_end // window_s), n_windows - 1)
        sums[w][0] += work
        sums[w][1] += secs
        sums[w][2] += 1
    return [
        {
            "index": w,
            "start_s": round(w * window_s, 1),
            "value": significant(work / secs / unit_scale) if secs else None,
            "bursts": count,
        }
        for w, (work, secs, count) in enumerate(sums)
    ]


def attribute(
    out: dict, ranks: dict, reports: dict, procs: list, died_s: dict, cuda: bool, timeouts_s: tuple, t0: float
) -> None:
    """Which rank ended the soak, set as its `error`; what the others reported then goes to out["after_effects"].

    The ranks go round by round together, so a failure shows in every rank: the one whose own work failed,
    else one that died without a word while the others still worked, else the one that stopped first (fewer
    bursts than the others: it hung); a collective that failed in a rank waiting for it is an after-effect, and
    so is a rank that died a whole collective timeout after the one behind stopped (NCCL's watchdog ends a rank
    that waited that long). A rank that is merely slow also has fewer bursts when another is killed: the death
    decides, not the count.
    """
    step_timeout_s, grace_s = timeouts_s
    what = "GPU" if cuda else "process"
    now = round(time.monotonic() - t0, 1)
    unfinished = [r for r in ranks if ranks[r]["done_s"] is None]
    dead = {r: procs[r].exitcode for r in unfinished if procs[r].exitcode is not None and r not in reports}
    bursts = {r: len(ranks[r]["matmul"]) + len(ranks[r]["copy"]) for r in ranks}
    most = max(bursts.values())
    own = [r for r in unfinished if r in reports and reports[r]["where"] != "collective"]
    behind = [r for r in unfinished if bursts[r] < most]
    waited = [
        r
        for r in dead
        if r not in behind and any(died_s.get(r, now) - (ranks[b]["last_s"] or 0.0) >= step_timeout_s for b in behind)
    ]
    died_first = [r for r in dead if r not in waited]
    culprits = own or died_first or behind or list(dead) or sorted(reports, key=lambda r: reports[r]["t_s"] or 0)[:1]
    for r in culprits:
        if r in reports:
            ranks[r]["error"] = {"t_s": reports[r]["t_s"], "error": reports[r]["error"]}
        elif r in dead:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"process exited with code {dead[r]} during the soak",
            }
        elif reports:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": "fell behind the others: no burst after this time while "
                "they went on, and a collective waiting for it failed",
            }
        else:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"stopped answering: no burst after this time, and "
                f"not finished {grace_s:g} s after the end; killed",
            }
    if not culprits:  # nobody reported, died or fell behind: every rank still working past the grace
        for r in unfinished:
            ranks[r]["error"] = {
                "t_s": ranks[r]["last_s"],
                "error": f"not finished {grace_s:g} s after the end; killed",
            }
        culprits = unfinished
    out["after_effects"] = [{"rank": r, **reports[r]} for r in sorted(reports) if r not in culprits] + [
        {"rank": r, "t_s": now, "error": f"process exited with code {code}", "where": "exit"}
        for r, code in sorted(dead.items())
        if r not in culprits
    ]
    first = culprits[0]
    out["stop_reason"] = f"{what} {first} failed: {ranks[first]['error']['error']}"


def finish(out: dict, ranks: dict, nccl_bytes: int) -> dict:
    """Windows per GPU and for NCCL, from what each rank sent."""
    window_s, n_windows = out["window_s"], out["n_windows"]
    sampled = ((out.get("sampler") or {}).get("per_gpu") or {}).items()
    by_uuid = {(g.get("uuid") or "").lower(): int(i) for i, g in sampled if g.get("uuid")}
    by_pci = {(g.get("pci_bus_id") or "")[:-2]: int(i) for i, g in sampled if g.get("pci_bus_id")}
    for r, rank in ranks.items():
        info = rank["info"] or {}
        mm = window_figures(rank["matmul"], window_s, n_windows, 1e12)
        hbm = window_figures(rank["copy"], window_s, n_windows, 1e9)
        windows = [
            {
                "index": m["index"],
                "start_s": m["start_s"],
                "matmul_tflops": m["value"],
                "hbm_gbps": h["value"],
                "matmul_bursts": m["bursts"],
                "copy_bursts": h["bursts"],
            }
            for m, h in zip(mm, hbm)
        ]
        mm_vals = [w["matmul_tflops"] for w in windows if w["matmul_tflops"] is not None]
        hbm_vals = [w["hbm_gbps"] for w in windows if w["hbm_gbps"] is not None]
        out["gpus"][str(r)] = {
            **{
                k: info.get(k)
                for k in ("name", "uuid", "pci_bus_id", "pid", "matmul_ops_per_burst", "copy_ops_per_burst")
            },
            # NVML's index of this CUDA device: by UUID, else by PCI bus id (torch gives "0000:18:00", NVML adds ".0").
            "nvml_index": by_uuid.get((info.get("uuid") or "").lower(), by_pci.get(info.get("pci_bus_id") or "-")),
            "windows": windows,
            "matmul_tflops_median": significant(statistics.median(mm_vals)) if mm_vals else None,
            "hbm_gbps_median": significant(statistics.median(hbm_vals)) if hbm_vals else None,
            "bursts": len(rank["matmul"]) + len(rank["copy"]),
            "last_burst_s": rank["last_s"],
            "done_s": rank["done_s"],
            "error": rank["error"],
        }
    world = out["world_size"]
    rounds = ranks[0]["nccl"] if world > 1 else []
    # The first all_reduce round is the soak's warm-up, kept apart: on a healthy 2 x H200 it read 13% below the
    # rounds after it (docs/results/2026-11-27-h200-x2-one-judge), and a window of two rounds took it for a slowdown.
    warm_up, rounds = (rounds[:1], rounds[1:]) if len(rounds) > 1 else ([], rounds)
    if world > 1:
        nbytes = nccl_bytes
        factor = 2 * (world - 1) / world
        per_window: dict[int, list] = {}
        for t_end, secs, _ in rounds:
            per_window.setdefault(min(int(t_end // window_s), n_windows - 1), []).append(nbytes / secs / 1e9 * factor)
        wrong = sorted({(round(t, 1), r) for r, rank in ranks.items() for t, _, ok in rank["nccl"] if not ok})
        busbw = [nbytes / secs / 1e9 * factor for _, secs, _ in rounds]
        out["nccl"] = {
            "size_bytes": nbytes,
            "rounds": len(warm_up) + len(rounds),  # each checked for correctness, the warm-up's too
            "windows": [
                {
                    "index": w,
                    "start_s": round(w * window_s, 1),
                    "busbw_gbps": significant(statistics.median(per_window[w])) if w in per_window else None,
                }
                for w in range(n_windows)
            ],
            "busbw_gbps_median": significant(statistics.median(busbw)) if busbw else None,
            "warm_up": [
                {"t_s": round(t, 1), "busbw_gbps": significant(nbytes / s / 1e9 * factor)} for t, s, _ in warm_up
            ],
            "wrong": [{"t_s": t, "rank": r} for t, r in wrong],
        }
    return out
