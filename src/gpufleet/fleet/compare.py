"""The fleet layer's judgement: results of group `fleet`, per node, in the one result schema.

    gpu_vs_node                  each GPU against its node's median, per metric
    node_vs_fleet                each node against this run's fleet median (3 nodes or more: fleet_min_nodes)
    node_vs_baseline             the node and each GPU (by uuid) against the baseline run's figure for them
    node_vs_baseline_fleet       the node against the baseline run's fleet median
    sample_spread                a GPU whose benchmark samples spread far more than its siblings': disturbed
    counters_during_run          counter growth from the snapshot before the benchmarks to the one after
    counters_since_previous_run  counter growth since this GPU's latest snapshot of an earlier run (the store)
    returning_gpu                a GPU (uuid or serial) that failed in an earlier run and is back, in any node: hardware
                                 failures only (failure_class.py), so another process on a GPU does not follow it
    sdc                          the node's SDC hashes against the fleet's for the same model and versions (fleet/sdc.py)

Comparisons are robust: the reference is a median, and each figure's robust z-score, 0.6745 * (x - median) /
MAD, is reported where the MAD is above zero, so one bad GPU or node does not move the reference. Two GPUs have
no robust median: each is held against the other (the slower one is the one named). Every metric is
higher-is-better: only a figure below its reference warns (more than `*_warn_pct` below) or fails (more than
`*_fail_pct` below); exactly at the threshold passes. Reasons put the numbers side by side, also where the
absolute thresholds of the node checks passed.

Counters are judged as growth, never as totals: any growth of uncorrected ECC errors, of rows remapped for
uncorrectable errors or of row remapping failures fails; the others warn when their growth per hour is over
their `fleet_counter_*_per_h_max`. A window shorter than `fleet_counter_min_window_h` is too short to
extrapolate to a rate: its growth is judged by count, against what that one window at the maximum rate would
give (the threshold times the minimum window). A counter that went down was reset (a driver reload, a GPU
reset, or a reboot: the boot id changed); its growth is then counted from the reset, and the reason says so.

A CPU run's results are `skip` ("CPU run"), with what they would have been in detail.would_be: the logic runs
in CI, no performance claim is made.
"""

from __future__ import annotations

import datetime as dt
import functools
import statistics
from typing import Any

from gpufleet import profiles, schema
from gpufleet.fleet import GROUP, flagged, gpu_text, metrics as fm, num
from gpufleet.schema import FAIL, PASS, SKIP, WARN

CPU_PREFIX = "CPU run: logic check only, not a performance figure"
_MAX_LISTED = 6  # findings named in a reason; all of them are in detail

# Keys of files/profiles/generic.yml this module reads.
GPU_WARN, GPU_FAIL = "fleet_gpu_below_node_warn_pct", "fleet_gpu_below_node_fail_pct"
NODE_WARN, NODE_FAIL = "fleet_node_below_fleet_warn_pct", "fleet_node_below_fleet_fail_pct"
BASE_WARN, BASE_FAIL = "fleet_below_baseline_warn_pct", "fleet_below_baseline_fail_pct"
MIN_NODES = "fleet_min_nodes"
SPREAD_RATIO, SPREAD_FLOOR = "fleet_sample_spread_ratio_max", "fleet_sample_spread_pct_floor"
MIN_WINDOW = "fleet_counter_min_window_h"

# (name, what it counts, source counters, how the sources combine, threshold key; None: any growth fails)
COUNTERS = (
    ("ecc_uncorrected", "uncorrected ECC errors", ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"), max, None),
    ("row_remap_uncorrectable", "rows remapped for uncorrectable errors", ("row_remap_uncorrectable",), sum, None),
    ("row_remap_failure", "row remapping failures", ("row_remap_failure",), sum, None),
    ("ecc_corrected", "corrected ECC errors", ("ecc_corrected_volatile", "ecc_corrected_aggregate"), max,
     "fleet_counter_ecc_corrected_per_h_max"),
    ("row_remap_correctable", "rows remapped for correctable errors", ("row_remap_correctable",), sum,
     "fleet_counter_row_remap_per_h_max"),
    ("nvlink_crc", "NVLink CRC errors", ("nvlink_crc_data", "nvlink_crc_flit"), sum, "fleet_counter_nvlink_crc_per_h_max"),
    ("nvlink_replay", "NVLink replays", ("nvlink_replay",), sum, "fleet_counter_nvlink_replay_recovery_per_h_max"),
    ("nvlink_recovery", "NVLink recoveries", ("nvlink_recovery",), sum, "fleet_counter_nvlink_replay_recovery_per_h_max"),
    ("pcie_replay", "PCIe replays", ("pcie_replay",), sum, "fleet_counter_pcie_replay_per_h_max"),
    ("xid", "Xid events", ("xid",), sum, "fleet_counter_xid_per_h_max"),
)
# Kept across reboots and driver reloads (the InfoROM); every other counter starts again from zero.
PERSISTENT = {"ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "row_remap_correctable", "row_remap_uncorrectable",
              "row_remap_failure", "row_remap_pending"}

# The fleet view: what report.html and report.md show per node (the first metric a node has of each list).
VIEW_COLUMNS = (
    ("matmul", "bf16 matmul, slowest GPU", ("matmul_bf16_tflops",)),
    ("hbm", "HBM copy, slowest GPU", ("hbm_copy_gbps",)),
    ("busbw", "all_reduce busbw, largest sizes", ("nccl_node_all_reduce_busbw_gbps_gt_64MiB", "nccl_multinode_all_reduce_busbw_gbps_gt_64MiB")),
    ("tokens", "GPT-2 tokens/s per GPU", ("train_gpt2_node_tokens_per_s_per_gpu", "train_gpt2_multinode_tokens_per_s_per_gpu")),
)


# ---------------------------------------------------------------- thresholds


@functools.lru_cache(maxsize=16)
def _profile_thresholds(name: str | None) -> dict:
    try:
        return profiles.resolve(None, profile_name=name or profiles.GENERIC)["thresholds"]
    except profiles.ProfileError:
        return profiles.resolve(None, profile_name=profiles.GENERIC)["thresholds"]


def thresholds_for(profile: Any) -> dict:
    """A node's thresholds: its document's (the effective values on the node, inventory overrides included)
    over its profile's file, over generic.yml, so documents from before a key existed still get its default."""
    name = profile.get("name") if isinstance(profile, dict) else profile if isinstance(profile, str) else None
    out = dict(_profile_thresholds(name))
    own = profile.get("thresholds") if isinstance(profile, dict) else None
    for key, entry in (own or {}).items():
        if isinstance(entry, dict) and "value" in entry:
            out[key] = {"value": entry["value"], "source": entry.get("source")}
    return out


class _Thr:
    def __init__(self, table: dict):
        self.table = table

    def value(self, key: str) -> Any:
        return (self.table.get(key) or {}).get("value")

    def field(self, key: str, **extra) -> dict:
        entry = self.table.get(key) or {}
        return {"key": key, "value": entry.get("value"), "source": entry.get("source"), **extra}

    def pair(self, warn: str, fail: str) -> dict:
        """The result's threshold: the warn key, with the fail key inside it."""
        return self.field(warn, fail=self.field(fail))


# ---------------------------------------------------------------- robust statistics and one comparison


def robust(values: list[float]) -> tuple[float, float]:
    """(median, MAD)."""
    med = statistics.median(values)
    return med, statistics.median(abs(v - med) for v in values)


def robust_z(x: float, med: float, mad: float) -> float | None:
    return round(0.6745 * (x - med) / mad, 2) if mad > 0 else None


def judge(value: float, reference: float, warn_pct: float | None, fail_pct: float | None) -> tuple[str, float]:
    """(status, deviation %): negative deviation is below the reference; more than warn_pct below warns."""
    deviation = (value - reference) / reference * 100
    below = round(-deviation, 9)  # 5% below is 5%, not 5.000000000000004%
    if fail_pct is not None and below > fail_pct:
        return FAIL, deviation
    if warn_pct is not None and below > warn_pct:
        return WARN, deviation
    return PASS, deviation


def _comparison(m: dict, reference: float, ref_text: str, thr: _Thr, warn: str, fail: str, **extra) -> dict:
    status, deviation = judge(m["value"], reference, thr.value(warn), thr.value(fail))
    return {"metric": m["key"], "label": m["label"], "unit": m["unit"], "index": m.get("index"), "uuid": m.get("uuid"),
            "serial": m.get("serial"), "cuda_index": m.get("cuda_index"), "mapped_by": m.get("mapped_by"),
            "value": m["value"], "reference": reference, "reference_is": ref_text,
            "deviation_pct": round(deviation, 2), "status": status, "cpu": m.get("cpu", False), **extra}


def _sentence(c: dict, thr: _Thr, warn: str, fail: str, who: str = "") -> str:
    below = -c["deviation_pct"]
    which = fail if c["status"] == FAIL else warn
    limit = thr.value(which)
    words = "fail threshold" if c["status"] == FAIL else "threshold"
    head = f"{who}{c['label']} {num(c['value'])} {c['unit']}"
    z = f", robust z {c['robust_z']}" if c.get("robust_z") is not None else ""
    return f"{head} is {_pct(below, limit)}% below {c['reference_is']} {num(c['reference'])}{z} ({words} {num(limit)}%)"


def _pct(value: float, limit: Any = None) -> str:
    """One decimal, two where one would read as the threshold itself (5.02% over a 5% threshold is not '5.0%')."""
    text = f"{value:.1f}"
    return f"{value:.2f}" if isinstance(limit, (int, float)) and float(text) == float(limit) else text


def _listed(parts: list[str]) -> str:
    more = len(parts) - _MAX_LISTED
    return "; ".join(parts[:_MAX_LISTED]) + (f"; and {more} more (detail.comparisons)" if more > 0 else "")


def _result(check: str, status: str, reason: str, *, cpu: bool = False, **fields) -> dict:
    """One fleet result; on a CPU run a would-be pass, warn or fail becomes skip, saying so."""
    detail = fields.pop("detail", {}) or {}
    if cpu and status in (PASS, WARN, FAIL):
        detail = {**detail, "would_be": status, "cpu_run": True}
        status, reason = SKIP, f"{CPU_PREFIX}: {reason}"
        fields.pop("remedy", None)
    if status == PASS:
        fields.pop("remedy", None)
    res = schema.result(check, status, reason, group=GROUP, detail=detail, **fields)
    res.update(started=schema.utc_now(), seconds=0.0)
    return res


_KEEP = ("metric", "index", "uuid", "serial", "value", "reference", "deviation_pct", "robust_z", "n", "status", "baseline_host")


def _evidence(comparisons: list[dict]) -> list[dict]:
    """The comparisons as detail keeps them: the numbers and who, without what the metric key already says."""
    out = []
    for c in comparisons:
        e = {k: c[k] for k in _KEEP if c.get(k) is not None}
        if c.get("index") is None and c.get("cuda_index") is not None:
            e["cuda_index"] = c["cuda_index"]
        if c.get("mapped_by") == "position":
            e["mapped_by"] = "position"
        out.append(e)
    return out


def _worst(comparisons: list[dict]) -> str:
    return schema.worst((c["status"] for c in comparisons), default=PASS)


def _judged(comparisons: list[dict], thr: _Thr, warn: str, fail: str, who) -> tuple[str, str | None, float]:
    """The worst status; the sentences of the comparisons that did not pass, the largest gap first (None when every
    one passed), each led by who(comparison); and the largest gap below the reference in % (0 when none is below)."""
    bad = sorted((c for c in comparisons if c["status"] != PASS), key=lambda c: c["deviation_pct"])
    reason = _listed([_sentence(c, thr, warn, fail, who=who(c)) for c in bad]) if bad else None
    below_pct = max(max((-c["deviation_pct"] for c in comparisons), default=0.0), 0.0)
    return _worst(comparisons), reason, round(below_pct, 2)


def _flagged_from(comparisons: list[dict]) -> list[dict]:
    seen, out = set(), []
    for c in comparisons:
        if c["status"] in (WARN, FAIL) and (c.get("index") is not None or c.get("uuid")):
            key = (c.get("index"), c.get("uuid"))
            if key not in seen:
                seen.add(key)
                out.append(flagged(c))
    return out


def _gap_text(comparisons: list[dict]) -> str:
    worst = min(comparisons, key=lambda c: c["deviation_pct"])
    if worst["deviation_pct"] >= 0:
        return "none below its reference"
    who = f"{gpu_text(worst)} " if worst.get("index") is not None or worst.get("uuid") else ""
    return f"largest gap: {who}{worst['label']} {-worst['deviation_pct']:.1f}% below {worst['reference_is']}"


# ---------------------------------------------------------------- GPU against its node


def gpu_vs_node(host: str, found: dict, thr: _Thr) -> dict:
    comparisons = []
    for key in fm.GPU_METRICS:
        rows = [m for m in found["metrics"] if m["key"] == key and m["scope"] == "gpu"]
        if len(rows) < 2:
            continue
        if min(m["value"] for m in rows) <= 0:
            continue  # a figure of zero is no measurement to hold others against
        if len(rows) == 2:
            for m, other in (rows, rows[::-1]):
                comparisons.append(_comparison(m, other["value"], f"its only sibling {gpu_text(other).split(' (')[0]} at", thr,
                                               GPU_WARN, GPU_FAIL, n=2, robust_z=None))
            continue
        med, mad = robust([m["value"] for m in rows])
        for m in rows:
            comparisons.append(_comparison(m, med, "the node median", thr, GPU_WARN, GPU_FAIL, n=len(rows), mad=round(mad, 4),
                                           robust_z=robust_z(m["value"], med, mad)))
    cpu = any(c["cpu"] for c in comparisons)
    threshold = thr.pair(GPU_WARN, GPU_FAIL)
    if not comparisons:
        gpus = {m.get("cuda_index") for m in found["metrics"] if m["scope"] == "gpu"}
        why = ("one GPU measured on this node: no sibling to compare it with" if len(gpus) == 1 else
               "no per-GPU benchmark figures in this node's results (matmul and memory did not run or gave no figure)")
        return _result("gpu_vs_node", SKIP, why, threshold=threshold)
    status, reason, below_pct = _judged(comparisons, thr, GPU_WARN, GPU_FAIL, lambda c: f"{gpu_text(c)} ")
    if reason is None:
        n_gpus = max(c["n"] for c in comparisons)
        keys = sorted({c["metric"] for c in comparisons}, key=fm.GPU_METRICS.index)
        within = "of each other" if n_gpus == 2 else "of the node median"
        reason = (f"all {n_gpus} GPUs within {num(thr.value(GPU_WARN))}% {within} on {len(keys)} metric(s) "
                  f"({', '.join(fm.describe(k)['label'] for k in keys)}); {_gap_text(comparisons)}")
    return _result("gpu_vs_node", status, reason, cpu=cpu, value=below_pct, unit="% below", threshold=threshold,
                   remedy="compare that GPU's clocks, power and temperature in the benchmark's monitor detail and its health "
                          "checks; re-run the node's benchmarks; a GPU that stays slow needs service (reseat, RMA)",
                   detail={"comparisons": _evidence(comparisons), "flagged_gpus": _flagged_from(comparisons)})


# ---------------------------------------------------------------- node against the fleet


def _node_rows(found: dict, *, shared: bool = False) -> list[dict]:
    return [m for m in found["metrics"] if m["scope"] == "node" and (shared or not m["shared"])]


def fleet_groups(founds: dict[str, dict]) -> dict[tuple, dict[str, dict]]:
    """(metric, context) -> {host: node-level metric} over the nodes of the run, shared metrics left out."""
    groups: dict[tuple, dict[str, dict]] = {}
    for host, found in founds.items():
        for m in _node_rows(found):
            groups.setdefault((m["key"], m["context"]), {})[host] = m
    return groups


def fleet_stats(groups: dict) -> dict[tuple, tuple[float, float]]:
    """(metric, context) -> (median, MAD) of the nodes' figures: once per run, not once per node."""
    return {k: robust([m["value"] for m in members.values()]) for k, members in groups.items()}


def node_vs_fleet(host: str, found: dict, groups: dict, thr: _Thr, stats: dict | None = None) -> dict:
    min_nodes = thr.value(MIN_NODES) or 3
    threshold = thr.field(NODE_WARN, fail=thr.field(NODE_FAIL), min_nodes=thr.field(MIN_NODES))
    mine = _node_rows(found)
    if not mine:
        return _result("node_vs_fleet", SKIP, "no node-level benchmark figures in this node's results to compare with the fleet",
                       threshold=threshold)
    comparisons, too_few = [], {}
    for m in mine:
        members = groups.get((m["key"], m["context"]), {})
        if len(members) < min_nodes:
            too_few[m["key"]] = len(members)
            continue
        key = (m["key"], m["context"])
        med, mad = stats[key] if stats and key in stats else robust([x["value"] for x in members.values()])
        if med <= 0:
            continue
        comparisons.append(_comparison(m, med, f"the fleet median of {len(members)} nodes", thr, NODE_WARN, NODE_FAIL,
                                       n=len(members), mad=round(mad, 4), robust_z=robust_z(m["value"], med, mad)))
    cpu = any(m["cpu"] for m in mine)
    if not comparisons:
        n = max(too_few.values(), default=0)
        why = (f"{n} node(s) of this run have these figures; a fleet median needs at least {min_nodes} ({MIN_NODES})"
               + (": with two, the median cannot tell which one is off" if n == 2 else ""))
        return _result("node_vs_fleet", SKIP, why, threshold=threshold, detail={"nodes_with_figures": too_few})
    status, reason, below_pct = _judged(comparisons, thr, NODE_WARN, NODE_FAIL, lambda c: f"node {host} ")
    if reason is None:
        reason = (f"node {host} within {num(thr.value(NODE_WARN))}% of the fleet median on {len(comparisons)} metric(s); "
                  f"{_gap_text(comparisons)}")
    return _result("node_vs_fleet", status, reason, cpu=cpu, value=below_pct, unit="% below", threshold=threshold,
                   remedy="compare this node's checks (clocks, power limit, PCIe link, NVLink, host tuning) with a node near "
                          "the median; re-run validate.yml --limit for it; a node that stays slow holds back every job it joins",
                   detail={"comparisons": _evidence(comparisons), "too_few_nodes": too_few})


# ---------------------------------------------------------------- against the baseline


def _comparable(m: dict, b: dict) -> str | None:
    """Why a figure cannot be held against a baseline figure, or None."""
    if bool(m.get("cpu")) != bool(b.get("cpu")):
        return "one of the two is a CPU run"
    if m["context"] != b.get("context"):
        return f"measured differently (baseline {b.get('context')}, this run {m['context']})"
    return None


def baseline_index(base: list[dict]) -> tuple[dict, dict]:
    """({host: {metric: node-level row}}, {(uuid, metric): GPU row}) of the baseline's rows, built once per run."""
    node_base: dict[str, dict] = {}
    for b in base:
        if b["gpu_index"] is None:
            node_base.setdefault(b["host"], {})[b["metric"]] = b
    return node_base, {(b["uuid"], b["metric"]): b for b in base if b["gpu_index"] is not None and b["uuid"]}


def node_vs_baseline(host: str, found: dict, base: list[dict], base_id: str, thr: _Thr, index: tuple | None = None) -> dict:
    """index: baseline_index(base), so that a run of many nodes does not go through every baseline row per node."""
    threshold = thr.pair(BASE_WARN, BASE_FAIL)
    comparisons, not_comparable = [], []
    by_host, gpu_base = index or baseline_index(base)
    node_base = by_host.get(host, {})
    for m in found["metrics"]:
        if m["scope"] == "node":
            b, what = node_base.get(m["key"]), f"baseline run {base_id}'s figure for this node"
        elif m.get("uuid"):
            b = gpu_base.get((m["uuid"], m["key"]))
            what = f"baseline run {base_id}'s figure for this GPU" + (f" (then in node {b['host']})" if b and b["host"] != host else "")
        else:
            continue
        if b is None:
            continue
        why = _comparable(m, {"cpu": b["cpu"], "context": b["context"]})
        if why:
            not_comparable.append({"metric": m["key"], "index": m.get("index"), "uuid": m.get("uuid"), "why": why})
            continue
        if b["value"] > 0:
            comparisons.append(_comparison(m, b["value"], what, thr, BASE_WARN, BASE_FAIL, baseline_host=b["host"]))
    if not comparisons:
        why = (f"nothing comparable: {not_comparable[0]['why']}" if not_comparable else
               f"node {host} and its GPUs are not in baseline run {base_id} (node_vs_baseline_fleet holds it against that run's fleet)")
        return _result("node_vs_baseline", SKIP, why, threshold=threshold, detail={"baseline": base_id, "not_comparable": not_comparable})
    status, reason, below_pct = _judged(
        comparisons, thr, BASE_WARN, BASE_FAIL,
        lambda c: f"{gpu_text(c)} " if c.get("index") is not None or c.get("uuid") else f"node {host} ")
    if reason is None:
        reason = (f"node {host} and its GPUs within {num(thr.value(BASE_WARN))}% of baseline run {base_id} on "
                  f"{len(comparisons)} figure(s); {_gap_text(comparisons)}")
    return _result("node_vs_baseline", status, reason, cpu=any(c["cpu"] for c in comparisons), value=below_pct,
                   unit="% below", threshold=threshold,
                   remedy="the node or GPU got slower than when the baseline was taken: compare this run's health checks and "
                          "versions (driver, firmware) with the baseline's; re-run the benchmarks; service what stays slow",
                   detail={"baseline": base_id, "comparisons": _evidence(comparisons), "not_comparable": not_comparable,
                           "flagged_gpus": _flagged_from(comparisons)})


def baseline_medians(base: list[dict]) -> dict[tuple, dict]:
    """(metric, context) -> {"value" (median over the baseline's nodes), "n", "cpu", "unit"} of node-level rows."""
    groups: dict[tuple, list[dict]] = {}
    for b in base:
        if b["gpu_index"] is None:
            groups.setdefault((b["metric"], b["context"]), []).append(b)
    return {k: {"value": statistics.median(r["value"] for r in rows), "n": len(rows), "cpu": any(r["cpu"] for r in rows),
                "unit": rows[0]["unit"]} for k, rows in groups.items()}


def node_vs_baseline_fleet(host: str, found: dict, medians: dict, base_id: str, thr: _Thr) -> dict:
    threshold = thr.pair(BASE_WARN, BASE_FAIL)
    comparisons, not_comparable = [], []
    by_metric: dict[str, list] = {}
    for (key, context), med in medians.items():
        by_metric.setdefault(key, []).append((context, med))
    for m in _node_rows(found, shared=True):
        options = by_metric.get(m["key"]) or []
        match = next((med for context, med in options if context == m["context"]), None)
        if match is None:
            if options:
                not_comparable.append({"metric": m["key"], "why": f"measured differently (baseline {options[0][0]}, this run {m['context']})"})
            continue
        if bool(match["cpu"]) != bool(m["cpu"]):
            not_comparable.append({"metric": m["key"], "why": "one of the two is a CPU run"})
            continue
        if match["value"] > 0:
            comparisons.append(_comparison(m, match["value"], f"baseline run {base_id}'s fleet median of {match['n']} node(s)",
                                           thr, BASE_WARN, BASE_FAIL, n=match["n"]))
    if not comparisons:
        why = (f"nothing comparable: {not_comparable[0]['why']}" if not_comparable else
               f"baseline run {base_id} has none of this node's figures")
        return _result("node_vs_baseline_fleet", SKIP, why, threshold=threshold, detail={"baseline": base_id, "not_comparable": not_comparable})
    status, reason, below_pct = _judged(comparisons, thr, BASE_WARN, BASE_FAIL, lambda c: f"node {host} ")
    if reason is None:
        reason = (f"node {host} within {num(thr.value(BASE_WARN))}% of baseline run {base_id}'s fleet median on "
                  f"{len(comparisons)} metric(s); {_gap_text(comparisons)}")
    return _result("node_vs_baseline_fleet", status, reason, cpu=any(c["cpu"] for c in comparisons), value=below_pct,
                   unit="% below", threshold=threshold,
                   remedy="this node is slower than the fleet was at the baseline: compare its checks with a node of the "
                          "baseline run; a replacement node that is slower than the nodes it joins holds back every job",
                   detail={"baseline": base_id, "comparisons": _evidence(comparisons), "not_comparable": not_comparable})


# ---------------------------------------------------------------- sample spread


def sample_spread(host: str, found: dict, thr: _Thr) -> dict:
    ratio_max, floor = thr.value(SPREAD_RATIO), thr.value(SPREAD_FLOOR)
    threshold = thr.field(SPREAD_FLOOR, ratio=thr.field(SPREAD_RATIO))
    spreads = found["spreads"]
    if not spreads:
        return _result("sample_spread", SKIP, "no per-sample figures in this node's benchmark results", threshold=threshold)
    rows = []
    for key in dict.fromkeys(s["key"] for s in spreads):
        mine = [s for s in spreads if s["key"] == key]
        for s in mine:
            siblings = [o["spread_pct"] for o in mine if o is not s]
            sib = statistics.median(siblings) if siblings else None
            ratio = None if sib is None else (s["spread_pct"] / sib if sib > 0 else (float("inf") if s["spread_pct"] > 0 else 1.0))
            disturbed = (sib is not None and floor is not None and ratio_max is not None
                         and s["spread_pct"] > floor and ratio > ratio_max)
            shown = None if ratio is None else "inf" if ratio == float("inf") else round(ratio, 2)
            rows.append({**s, "siblings_median_spread_pct": sib, "ratio": shown, "status": WARN if disturbed else PASS})
    keep = ("key", "index", "uuid", "serial", "n", "min", "median", "max", "spread_pct", "siblings_median_spread_pct", "ratio", "status")
    cpu = any(s["cpu"] for s in spreads)
    bad = [r for r in rows if r["status"] == WARN]
    if not any(r["siblings_median_spread_pct"] is not None for r in rows):
        worst = max(rows, key=lambda r: r["spread_pct"])
        return _result("sample_spread", SKIP, f"one GPU measured: no sibling to compare its sample spread with (largest: "
                       f"{worst['label']} {worst['spread_pct']:.1f}%)", threshold=threshold,
                       detail={"spreads": [{k: r[k] for k in keep} for r in rows]})
    if bad:
        parts = []
        for r in sorted(bad, key=lambda r: -r["spread_pct"]):
            unit = fm.describe(r["key"])["unit"]
            ratio = ("with siblings at 0%" if r["ratio"] == "inf" else
                     f"{r['ratio']:.1f} times its siblings' median spread {r['siblings_median_spread_pct']:.1f}%")
            parts.append(f"{gpu_text(r)} {r['label']} samples spread {r['spread_pct']:.1f}% ({num(r['min'])} to {num(r['max'])} {unit}"
                         f" over {r['n']} samples), {ratio} (thresholds: over {num(floor)}% and over {num(ratio_max)} times): "
                         "disturbed while measured, its median is not the GPU's figure")
        reason = _listed(parts)
    else:
        worst = max(rows, key=lambda r: r["spread_pct"])
        reason = (f"no GPU's samples spread far more than its siblings' ({len(rows)} figure(s); largest: {gpu_text(worst)} "
                  f"{worst['label']} {worst['spread_pct']:.1f}%)")
    return _result("sample_spread", WARN if bad else PASS, reason, cpu=cpu, value=max(r["spread_pct"] for r in rows), unit="%",
                   threshold=threshold,
                   remedy="look for another process on that GPU (gpu_health.processes) or a throttle in the benchmark's monitor "
                          "detail; re-run the node's benchmarks on an idle node",
                   detail={"spreads": [{k: r[k] for k in keep} for r in rows], "flagged_gpus": [flagged(r) for r in bad]})


# ---------------------------------------------------------------- counters


def _time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _hours(a: Any, b: Any) -> float | None:
    ta, tb = _time(a), _time(b)
    return None if ta is None or tb is None else (tb - ta).total_seconds() / 3600


def _window_text(hours: float | None) -> str:
    if hours is None:
        return "an unknown time"
    return f"{hours * 60:.0f} min" if hours < 2 else f"{hours:.1f} h"


def _growth(old: dict, new: dict, rebooted: bool) -> dict:
    """Growth of every logical counter from `old` to `new` (source counter -> value)."""
    out = {}
    for name, label, sources, combine, key in COUNTERS:
        growths, totals, notes, unreadable = [], [], [], []
        for src in sources:
            a, b = old.get(src), new.get(src)
            if not isinstance(b, int):
                unreadable.append(src)
                continue
            totals.append(b)
            if not isinstance(a, int):
                unreadable.append(src)
                continue
            if rebooted and src not in PERSISTENT:
                growths.append(b)
                notes.append(f"{src} counted since the reboot")
            elif b < a:
                growths.append(b)
                notes.append(f"{src} went down from {a} to {b} (a driver reload or GPU reset cleared it): counted from the reset")
            else:
                growths.append(b - a)
        out[name] = {"counter": name, "label": label, "threshold_key": key, "sources": list(sources),
                     "total": combine(totals) if totals else None, "growth": combine(growths) if growths else None,
                     "notes": notes, "unreadable": unreadable}
    return out


def _judge_growth(entry: dict, hours: float | None, thr: _Thr) -> dict:
    g, key = entry["growth"], entry["threshold_key"]
    min_window = thr.value(MIN_WINDOW) or 1.0
    entry = dict(entry, window_h=None if hours is None else round(hours, 4), per_h=None, judged_by=None, status=PASS)
    if g is None:
        entry["status"] = SKIP
        return entry
    if hours is not None and hours > 0:
        entry["per_h"] = round(g / hours, 3)
    if key is None:
        entry.update(status=FAIL if g > 0 else PASS, judged_by="any growth fails")
        return entry
    limit = thr.value(key)
    entry["limit_per_h"] = limit
    if limit is None:
        entry["judged_by"] = f"not judged ({key} is null)"
        return entry
    if hours is None or hours < min_window:
        # Too short to extrapolate: the growth against what min_window at the maximum rate gives.
        allowed = limit * min_window
        entry.update(status=WARN if g > allowed else PASS, allowed_count=allowed, judged_by="count")
    else:
        entry.update(status=WARN if g / hours > limit else PASS, judged_by="rate")
    return entry


def _how_judged(thr: _Thr) -> str:
    min_window = thr.value(MIN_WINDOW) or 1.0
    return (f"uncorrected ECC, rows remapped for uncorrectable errors and remap failures: any growth fails; the others: growth "
            f"per hour against their fleet_counter_*_per_h_max, and over a window shorter than {num(min_window)} h (too short "
            f"to extrapolate) the count against what {num(min_window)} h at that rate gives")


def _snap_gpus(snap: dict) -> dict:
    """uuid (or index) -> GPU of a snapshot, visible ones only."""
    out = {}
    for g in snap.get("gpus") or []:
        if isinstance(g, dict) and g.get("visible", True) is not False:
            out[g.get("uuid") or f"index-{g.get('index')}"] = g
    return out


def _counter_evidence(entries: dict) -> dict:
    """Per counter: the total, the growth and its rate; how it was judged only where it did not pass; notes when any."""
    out = {}
    for name, e in entries.items():
        keep = {k: e.get(k) for k in ("total", "growth", "per_h", "status", "judged_by")}
        for k in ("notes", "unreadable"):
            if e.get(k):
                keep[k] = e[k]
        out[name] = keep
    return out


def _counter_findings(gpus: list[tuple[dict, dict]], thr: _Thr) -> tuple[str, list[str], list[dict]]:
    """(status, finding sentences, flagged GPUs) over [(GPU, {counter: judged entry})]."""
    status, parts, flags = PASS, [], []
    for g, entries in gpus:
        bad = [e for e in entries.values() if e["status"] in (WARN, FAIL)]
        if not bad:
            continue
        flags.append(flagged(g))
        for e in bad:
            status = schema.worst([status, e["status"]])
            rate = f", {num(e['per_h'])}/h" if e.get("per_h") is not None else ""
            if e["threshold_key"] is None:
                limit = "any growth fails"
            elif e["judged_by"] == "count":
                limit = (f"{e['threshold_key']} {num(e.get('limit_per_h'))}/h; judged by count, the window being too short to "
                         f"extrapolate: at most {num(e['allowed_count'])}")
            else:
                limit = f"{e['threshold_key']} {num(e.get('limit_per_h'))}/h; judged by rate"
            parts.append(f"{gpu_text(g)}: {e['label']} grew by {e['growth']} in {_window_text(e['window_h'])}{rate} "
                         f"(now {e['total']}; {limit})" + (f"; {'; '.join(e['notes'])}" if e["notes"] else ""))
    return status, parts, flags


def _totals_text(gpus: list[tuple[dict, dict]]) -> str:
    """The cumulative totals that are not zero, as evidence: 'NVLink CRC errors 216 (GPU 0), 262 (GPU 1)'."""
    by: dict[str, list[str]] = {}
    for g, entries in gpus:
        for e in entries.values():
            if e.get("total"):
                by.setdefault(e["label"], []).append(f"{e['total']} (GPU {g.get('index')})")
    return "; ".join(f"{label} {', '.join(v)}" for label, v in by.items())


def counters_during_run(host: str, found: dict, thr: _Thr) -> dict:
    snaps = found["snapshots"]
    threshold = thr.field(MIN_WINDOW)
    before, after = snaps.get("before"), snaps.get("after")
    if not before or not after:
        problems = snaps.get("problems") or {}
        if problems:
            why = "; ".join(problems.values())
        elif before or after:
            why = f"only the {'before' if before else 'after'} snapshot is in this node's results (the run stopped between them?)"
        else:
            why = ("no counter snapshots in this node's results (gpufleet.cluster.gpu_counters did not run before and after "
                   "the benchmarks; documents from before it existed have none)")
        return _result("counters_during_run", SKIP, f"no growth during the run to judge: {why}", threshold=threshold)
    hours = _hours(before.get("read_at"), after.get("read_at"))
    rebooted = bool(before.get("boot_id") and after.get("boot_id") and before["boot_id"] != after["boot_id"])
    b_gpus, judged = _snap_gpus(before), []
    for ident, g in _snap_gpus(after).items():
        old = b_gpus.get(ident)
        if old is None:
            continue
        entries = {n: _judge_growth(e, hours, thr) for n, e in _growth(old.get("counters") or {}, g.get("counters") or {}, rebooted).items()}
        judged.append((g, entries))
    if not judged:
        return _result("counters_during_run", SKIP, "the snapshots before and after name no GPU in common", threshold=threshold)
    status, parts, flags = _counter_findings(judged, thr)
    window = f"{before.get('read_at')} to {after.get('read_at')} ({_window_text(hours)})"
    totals = _totals_text(judged)
    if parts:
        reason = f"during this run, {window}: " + _listed(parts)
    else:
        reason = f"no counter grew beyond its limit during this run on {len(judged)} GPU(s), {window}"
        reason += f"; cumulative: {totals}" if totals else "; every counter at 0"
    if rebooted:
        reason += "; the node rebooted between the snapshots (boot id changed): counters that a reboot clears are counted since it"
    return _result("counters_during_run", status, reason, threshold=threshold,
                   remedy=_COUNTER_REMEDY[status] if status != PASS else None,
                   detail={"window": {"from": before.get("read_at"), "to": after.get("read_at"), "hours": hours, "rebooted": rebooted},
                           "judged": _how_judged(thr),
                           "per_gpu": [{**flagged(g), "counters": _counter_evidence(e)} for g, e in judged],
                           "unreadable": {**(before.get("unreadable") or {}), **(after.get("unreadable") or {})},
                           "flagged_gpus": flags})


_COUNTER_REMEDY = {
    FAIL: "an uncorrectable memory error happened on that GPU: drain the node, reset the GPU (row remapping needs it) and "
          "run the checks again; a GPU whose uncorrectable errors or remap failures keep growing needs an RMA",
    WARN: "the error rate of that GPU or link is over what a healthy one shows: watch it in the next runs (gpufleet history "
          "GPU-UUID); service the NVLink or PCIe path (reseat, firmware), or the GPU, if it keeps growing",
}


def counters_since_previous_run(host: str, run_id: str, found: dict, store: Any, store_note: str | None, thr: _Thr) -> dict:
    snaps = found["snapshots"]
    threshold = thr.field(MIN_WINDOW)
    now = snaps.get("before") or snaps.get("after")
    if not now:
        why = "; ".join((snaps.get("problems") or {}).values()) or (
            "no counter snapshots in this node's results (gpufleet.cluster.gpu_counters did not run; documents from "
            "before it existed have none)")
        return _result("counters_since_previous_run", SKIP, f"no growth since the previous run to judge: {why}", threshold=threshold)
    if store is None:
        return _result("counters_since_previous_run", SKIP, f"no growth since the previous run to judge: {store_note or 'no store'}",
                       threshold=threshold)
    judged, first, since = [], [], {}
    for g in _snap_gpus(now).values():
        prev = store.previous_after(g["uuid"], run_id, now.get("read_at")) if g.get("uuid") else None
        if prev is None:
            first.append(g)
            continue
        rebooted = bool(prev.get("boot_id") and now.get("boot_id") and prev["boot_id"] != now["boot_id"])
        hours = _hours(prev["read_at"], now.get("read_at"))
        entries = {n: _judge_growth(e, hours, thr) for n, e in _growth(prev["counters"], g.get("counters") or {}, rebooted).items()}
        for e in entries.values():
            e.update(since_run=prev["run_id"], since_node=prev["host"], since_read_at=prev["read_at"], rebooted=rebooted)
        judged.append((g, entries))
        since[prev["run_id"]] = prev
    if not judged:
        return _result("counters_since_previous_run", SKIP,
                       f"no earlier snapshot of this node's {len(first)} GPU(s) in the store: this is their first run with counter "
                       "snapshots; this run's totals are the reference for the next", threshold=threshold,
                       detail={"first_seen": [flagged(g) for g in first]})
    status, parts, flags = _counter_findings(judged, thr)
    runs = ", ".join(f"run {r} (node {p['host']}, read {p['read_at']}, "
                     f"{'accepted' if p.get('verdict') in ('pass', 'warn') else 'not accepted' if p.get('verdict') else 'not reported'})"
                     for r, p in since.items())
    totals = _totals_text(judged)
    if parts:
        reason = f"since {runs}: " + _listed(parts)
    else:
        moved = any(e["growth"] for _, entries in judged for e in entries.values() if e["status"] == PASS and e.get("growth"))
        reason = (f"{'counters grew within their limits' if moved else 'no counter moved'} on {len(judged)} GPU(s) since {runs}"
                  + (f"; cumulative: {totals}" if totals else ""))
    if any(e.get("rebooted") for _, entries in judged for e in entries.values()):
        reason += "; the node rebooted since (boot id changed): counters that a reboot clears are counted since the reboot"
    if first:
        reason += f"; first snapshot of {', '.join(gpu_text(g) for g in first)}"
    return _result("counters_since_previous_run", status, reason, threshold=threshold,
                   remedy=_COUNTER_REMEDY[status] if status != PASS else None,
                   detail={"since": {r: {k: p.get(k) for k in ("host", "read_at", "boot_id", "verdict")} for r, p in since.items()},
                           "judged": _how_judged(thr),
                           "per_gpu": [{**flagged(g), "since_run": next(iter(e.values()))["since_run"],
                                        "window_h": next(iter(e.values()))["window_h"], "counters": _counter_evidence(e)}
                                       for g, e in judged],
                           "first_seen": [flagged(g) for g in first], "flagged_gpus": flags})


# ---------------------------------------------------------------- GPUs that failed before


def returning_gpu(host: str, run_id: str, found: dict, store: Any, store_note: str | None) -> dict:
    gpus = [g for g in found["gpus"] if g.get("uuid") or g.get("serial")]
    if store is None:
        return _result("returning_gpu", SKIP, f"no history to look GPUs up in: {store_note or 'no store'}")
    if not gpus:
        return _result("returning_gpu", SKIP, "no GPU uuid or serial in this node's results (gpu_inventory did not run)")
    back, cleared = [], []
    for g in gpus:
        fails = store.gpu_failures(g.get("uuid"), g.get("serial"), run_id)
        pending = [f for f in fails if not f["accepted_since"]]
        if pending:
            back.append((g, pending[0], fails))
        elif fails:
            cleared.append((g, fails[0]))
    if not back:
        reason = f"none of this node's {len(gpus)} GPU(s) failed in an earlier run"
        if cleared:
            reason = ("no GPU of this node is back from a failure without an acceptance since; "
                      + "; ".join(f"{gpu_text(g)} failed in run {f['run_id']} and was accepted in run {f['accepted_since']['run_id']}"
                                  for g, f in cleared))
        return _result("returning_gpu", PASS, reason,
                       detail={"cleared": [{**flagged(g), "failed_in": f["run_id"], "accepted_in": f["accepted_since"]["run_id"]}
                                           for g, f in cleared]})
    parts = []
    for g, f, _ in back:
        by = "serial" if f.get("uuid") != g.get("uuid") else "uuid"
        where = "the same node" if f["host"] == host else f"node {f['host']}"
        parts.append(f"{gpu_text(g)} failed before: run {f['run_id']} ({f['started'] or 'start unknown'}) in {where} as GPU "
                     f"{f['gpu_index']}, {f['check_id']} {f['status']} ({f['class']}); now in node {host} as GPU {g['index']} "
                     f"(recognised by {by}; not accepted since)")
    return _result("returning_gpu", WARN, _listed(parts),
                   remedy="a GPU that failed before is back: check that it was repaired (reset, RMA record), watch this run's "
                          "health, counters and figures for it, and drain the node if it fails again",
                   detail={"returning": [{**flagged(g), "failures": fails} for g, _, fails in back],
                           "flagged_gpus": [flagged(g) for g, _, _ in back]})


# ---------------------------------------------------------------- the whole run


def evaluate(run_id: str, nodes: dict[str, dict], *, store: Any = None, store_note: str | None = None,
             baseline: dict | None = None) -> dict:
    """The fleet results of every node of a run.

    nodes: {host: {"results": [...], "profile": the document's profile (name and thresholds)}} for the nodes
    whose document could be read. store: a fleet.store.Store (its history and the baseline), or None with
    store_note saying why there is none. baseline: {"run_id", "source"} or None.

    Returns {"results": {host: [fleet results]}, "metrics": {host: metrics.extract()}, "fleet_medians",
    "baseline", "view"}.
    """
    from gpufleet.fleet import sdc

    founds = {host: fm.extract(n["results"]) for host, n in nodes.items()}
    sdc_rows = {host: sdc.hash_rows(n["results"]) for host, n in nodes.items()}
    thrs = {host: _Thr(thresholds_for(n.get("profile"))) for host, n in nodes.items()}
    groups = fleet_groups(founds)
    stats = fleet_stats(groups)
    sdc_votes: dict = {}  # (comparable keys, computation) -> votes, counted once for the run
    base_id = (baseline or {}).get("run_id")
    base_rows: list[dict] = []
    base_note = None
    if store is None:
        base_note = f"no baseline to compare with: {store_note or 'no store'}"
    elif not base_id:
        base_note = "no baseline run set (gpufleet baseline set RUN_ID, or gpufleet_baseline for validate.yml)"
    elif base_id == run_id:
        base_note = f"this run ({run_id}) is the baseline"
    elif not store.run(base_id):
        base_note = f"baseline run {base_id} is not in the store {store.path}"
    else:
        base_rows = store.run_metrics(base_id)
        if not base_rows:
            base_note = f"baseline run {base_id} has no benchmark figures in the store"
    medians = baseline_medians(base_rows)
    base_index = baseline_index(base_rows)
    out: dict = {"results": {}, "metrics": founds, "baseline": {**(baseline or {}), "note": base_note} if baseline or base_note else None}
    for host in nodes:
        found, thr = founds[host], thrs[host]
        if not (found["gpus"] or found["metrics"] or found["spreads"] or found["snapshots"].get("before")
                or found["snapshots"].get("after") or found["snapshots"]["problems"] or sdc_rows[host]):
            continue  # nothing the fleet layer reads (a host that never got to its checks): nothing to say
        res = [gpu_vs_node(host, found, thr), node_vs_fleet(host, found, groups, thr, stats)]
        if base_note:
            for check in ("node_vs_baseline", "node_vs_baseline_fleet"):
                res.append(_result(check, SKIP, base_note, threshold=thr.pair(BASE_WARN, BASE_FAIL)))
        else:
            res.append(node_vs_baseline(host, found, base_rows, base_id, thr, base_index))
            res.append(node_vs_baseline_fleet(host, found, medians, base_id, thr))
        res.append(sample_spread(host, found, thr))
        res.append(counters_during_run(host, found, thr))
        res.append(counters_since_previous_run(host, run_id, found, store, store_note, thr))
        res.append(returning_gpu(host, run_id, found, store, store_note))
        if sdc_rows[host]:
            res.append(sdc.judge(host, run_id, sdc_rows, store, store_note, sdc_votes))
        out["results"][host] = res
    out["fleet_medians"] = {f"{k}|{c}": {"metric": k, "context": c, "value": stats[(k, c)][0],
                                         "n": len(v), "unit": next(iter(v.values()))["unit"]} for (k, c), v in groups.items()}
    out["baseline_medians"] = {f"{k}|{c}": {"metric": k, "context": c, **v} for (k, c), v in medians.items()}
    out["view"] = _view(founds, groups, medians, base_rows, out["results"], stats)
    return out


def _view(founds: dict, groups: dict, medians: dict, base_rows: list[dict], results: dict, stats: dict | None = None) -> list[dict]:
    """Per node, the fleet view's columns: value, fleet median, baseline figure, deviations, worst status."""
    rows = []
    stats = stats if stats is not None else fleet_stats(groups)
    base_node = {(b["host"], b["metric"], b["context"]): b for b in base_rows if b["gpu_index"] is None}
    for host, found in founds.items():
        by_key = {m["key"]: m for m in found["metrics"] if m["scope"] == "node"}
        checks = {r["check"]: r for r in results.get(host, [])}
        cols = {}
        for col, title, keys in VIEW_COLUMNS:
            m = next((by_key[k] for k in keys if k in by_key), None)
            if m is None:
                cols[col] = None
                continue
            members = groups.get((m["key"], m["context"]), {})
            # A median of one node is that node: nothing to show against.
            fleet_med = stats[(m["key"], m["context"])][0] if len(members) > 1 and not m["shared"] else None
            b = base_node.get((host, m["key"], m["context"]))
            bmed = medians.get((m["key"], m["context"]))
            statuses = []
            for check in ("node_vs_fleet", "node_vs_baseline", "node_vs_baseline_fleet"):
                for c in (checks.get(check, {}).get("detail") or {}).get("comparisons") or []:
                    if c["metric"] == m["key"] and c.get("index") is None:
                        statuses.append(c["status"])
            gpu_outliers = [c for c in (checks.get("gpu_vs_node", {}).get("detail") or {}).get("comparisons") or []
                            if c["metric"] == m["key"] and c["status"] != PASS]
            cols[col] = {
                "title": title, "metric": m["key"], "label": m["label"], "value": m["value"], "unit": m["unit"], "cpu": m["cpu"],
                "fleet_median": fleet_med, "fleet_n": len(members) if fleet_med is not None else 0,
                "vs_fleet_pct": None if not fleet_med else round((m["value"] - fleet_med) / fleet_med * 100, 2),
                "baseline": b["value"] if b else None,
                "vs_baseline_pct": round((m["value"] - b["value"]) / b["value"] * 100, 2) if b and b["value"] else None,
                "baseline_fleet_median": bmed["value"] if bmed else None,
                "status": schema.worst(statuses + [c["status"] for c in gpu_outliers], default=PASS),
                "gpu_outliers": [{**flagged(c), "deviation_pct": c["deviation_pct"], "status": c["status"]} for c in gpu_outliers],
            }
        rows.append({"host": host, "columns": cols, "cpu": found["cpu"]})
    return rows
