"""The fleet layer's judgement: results of group `fleet`, per node, in the one result schema.

    gpu_vs_node                  each GPU against its node's median, per metric, and against its own place among
                                 its siblings in earlier runs (comparisons/character.py)
    node_vs_fleet                each node against this run's fleet median (3 nodes or more: fleet_min_nodes)
    node_vs_baseline             the node and each GPU (by uuid) against the baseline run's figure for them
    node_vs_baseline_fleet       the node against the baseline run's fleet median
    sample_spread                a GPU whose benchmark samples spread far more than its siblings': disturbed
    counters_during_run          counter growth from the snapshot before the benchmarks to the one after
    counters_since_previous_run  counter growth since this GPU's latest snapshot of an earlier run (the store)
    fabric_during_run            InfiniBand port error counters and PCIe AER counts (GPUs, HCAs, the bridges above
                                 them): growth from the fabric snapshot before the benchmarks to the one after
    fabric_since_previous_run    the same since the node's latest fabric snapshot of an earlier run (the store)
    ib_ports_vs_fleet            each InfiniBand port's rate and lanes against the same port on the other nodes
    rails_vs_fleet               the HCA beside each GPU (PCIe) against the one beside the same GPU on the other nodes
    returning_gpu                a GPU (uuid or serial) that failed in an earlier run and is back, in any node: hardware
                                 failures only (failure_class.py), so another process on a GPU does not follow it
    sdc                          the node's SDC hashes against the fleet's for the same model and versions (fleet/sdc_voters.py)
    versions                     a node whose software or firmware differs from the run's majority or the baseline
                                 run's (fleet/versions.py); a difference in NCCL or its net plugin fails

The comparisons of a node's figures (the first five) are made by the functions gpufleet.comparisons registers for
their declarations in registry.py, which the node's stage also made while it measured them, against the references handed to it (fleet/references.py): a
figure past a limit there was measured again. Here each comparison row past its limit stands only where the node's
record (detail.held) shows it past the limit in its last two measurements; otherwise it is `inconclusive`
(comparisons/confirm.py), as is every row of a figure no node could measure again alone (across nodes, or against
this run's fleet, which the node does not see while it measures): a warn or a fail never rests on one measurement.
registry.py declares, per check, what it holds a figure against, where, and how it is confirmed.

Comparisons are robust: the reference is a median, and each figure's robust z-score, 0.6745 * (x - median) /
MAD, is reported where the MAD is above zero, so one bad GPU or node does not move the reference. Two GPUs have
no robust median: each is held against the other (the slower one is the one named). Every metric is
higher-is-better: only a figure below its reference warns (more than `*_warn_pct` below) or fails (more than
`*_fail_pct` below); exactly at the threshold passes. Reasons put the numbers side by side, also where the
absolute thresholds of the node checks passed.

Counters are judged as growth, never as totals: any growth of uncorrected ECC errors, of rows remapped for
uncorrectable errors or of row remapping failures fails; the fabric's (NVLink CRC, replay and recovery, PCIe
replays, AER) are rates with DCGM's rules (checks/counter_rates.py: below the limit `info` with the rate); corrected
ECC, remapped rows and Xid warn when their growth per hour is over their `fleet_counter_*_per_h_max`, a window
shorter than `fleet_counter_min_window_h` judged by count against what that one window at the maximum rate would
give (the threshold times the minimum window). A counter that went down was reset (a driver reload, a GPU
reset, or a reboot: the boot id changed); its growth is then counted from the reset, and the reason says so.

A CPU run's results are `skip` ("CPU run"), with what they would have been in detail.would_be: the logic runs
in CI, no performance claim is made.
"""

from __future__ import annotations

from typing import Any

from gpufleet.fleet import sdc_voters, versions

from gpufleet.base import registry
from gpufleet.comparisons import confirm, metric_keys, metrics, peers  # noqa: F401 (peers, baseline: the comparisons)
from gpufleet.comparisons.against import Against
from gpufleet.comparisons.baseline import baseline_index, baseline_medians
from gpufleet.comparisons.character import past_deviations
from gpufleet.fleet.counter_growth import counters_during_run, counters_since_previous_run
from gpufleet.fleet.fabric_growth import fabric_during_run, fabric_since_previous_run
from gpufleet.fleet.facts import baseline_facts, settle
from gpufleet.fleet.fabric_peers import fabric_layouts, ib_ports_vs_fleet, rails_vs_fleet
from gpufleet.comparisons.peers import fleet_groups, fleet_stats
from gpufleet.fleet.returning import returning_gpu
from gpufleet.comparisons.thresholds import (
    KEYS as COMPARISON_KEYS,
    CONFIRM_MAX,
    FABRIC_SHARE,
    MIN_WINDOW,
    Thresholds,
    thresholds_for,
)
from gpufleet.fleet.counter_table import COUNTERS, FABRIC_COUNTERS
from gpufleet.fleet.references import baseline_rows
from gpufleet.fleet.report_rows import view_rows


def evaluate(
    run_id: str,
    nodes: dict[str, dict],
    *,
    store: Any = None,
    store_note: str | None = None,
    baseline: dict | None = None,
    extracted: dict[str, dict] | None = None,
) -> dict:
    """The fleet results of every node of a run.

    nodes: {host: {"results": [...], "profile": the document's profile (name and thresholds), "versions": the
    document's versions}} for the nodes whose document could be read. store: a fleet.store.Store (its history and the baseline), or None with
    store_note saying why there is none. baseline: {"run_id", "source"} or None. extracted: {host:
    metrics.extract() of its results} that the caller has already, for some or all of the nodes.

    Returns {"results": {host: [fleet results]}, "node_results": {host: its own results with the warnings about
    facts the baseline accepted turned into information (facts.py), where any}, "metrics": {host:
    metrics.extract()}, "fleet_medians", "baseline", "view", "versions": versions.table()}.
    """
    extracted = extracted or {}
    metrics_by_host = {
        host: extracted[host] if host in extracted else metrics.extract(n["results"]) for host, n in nodes.items()
    }
    sdc_rows = {host: sdc_voters.hash_rows(n["results"]) for host, n in nodes.items()}
    thresholds_by_host = {host: Thresholds(thresholds_for(n.get("profile"), KEYS_READ)) for host, n in nodes.items()}
    groups = fleet_groups(metrics_by_host)
    layouts = fabric_layouts(nodes)
    stats = fleet_stats(groups)
    sdc_votes: dict = {}  # (comparable keys, computation) -> votes, counted once for the run
    base_id = (baseline or {}).get("run_id")
    base_rows, base_note = baseline_rows(store, store_note, base_id, run_id)
    medians = baseline_medians(base_rows)
    past = past_deviations(store, metrics_by_host, run_id)  # each GPU's place among its siblings in earlier runs
    against = Against(
        past=past,
        base_id=base_id,
        base_rows=base_rows,
        base_index=baseline_index(base_rows),
        base_note=base_note,
        fleet_id=base_id,
        medians=medians,
        groups=groups,
        stats=stats,
    )
    # The baseline's versions come from its documents, whether or not it measured any figure.
    versions_base = base_id and store is not None and base_id != run_id and store.run(base_id)
    version_table = versions.table(
        {host: n.get("versions") or {} for host, n in nodes.items()},
        {
            "run_id": base_id,
            "note": base_note,
            "versions": versions.baseline_versions(store, base_id) if versions_base else {},
        },
    )
    # A warning about a fact the baseline accepted as it is now is information (fleet/facts.py).
    accepted = baseline_facts(store, base_id if versions_base else None, nodes)
    settled = {host: settle(n["results"], accepted.get(host) or {}, base_id) for host, n in nodes.items()}
    out: dict = {
        "node_results": {h: r for h, r in settled.items() if r is not None},
        "versions": version_table,
        "results": {},
        "metrics": metrics_by_host,
        "baseline": {**(baseline or {}), "note": base_note} if baseline or base_note else None,
    }
    before = figures_before(metrics_by_host, store, run_id)
    for host in nodes:
        node_metrics, thresholds = with_before(metrics_by_host[host], host, before), thresholds_by_host[host]
        fabric = node_metrics["snapshots"]["fabric"]
        version_res = [r for r in [versions.judge(host, version_table)] if r]
        if not (
            node_metrics["gpus"]
            or node_metrics["metrics"]
            or node_metrics["spreads"]
            or node_metrics["snapshots"].get("before")
            or node_metrics["snapshots"].get("after")
            or node_metrics["snapshots"]["problems"]
            or sdc_rows[host]
            or fabric.get("before")
            or fabric.get("after")
            or fabric["problems"]
            or layouts.get(host)
        ):
            if version_res:
                out["results"][host] = version_res
            continue  # nothing else the fleet layer reads (a host that never got to its checks)
        settle_row = settler(nodes[host]["results"], thresholds)
        # The comparisons, each by the function its module registered (registry.comparison_checks()).
        res = [
            registry.registered(f"fleet.{c.name}", "check")(host, node_metrics, thresholds, against, settle_row)
            for c in registry.comparison_checks()
        ]
        res.append(counters_during_run(host, node_metrics, thresholds))
        res.append(counters_since_previous_run(host, run_id, node_metrics, store, store_note, thresholds))
        res.append(fabric_during_run(host, node_metrics, thresholds))
        res.append(fabric_since_previous_run(host, run_id, node_metrics, store, store_note, thresholds))
        res.append(ib_ports_vs_fleet(host, layouts, thresholds))
        res.append(rails_vs_fleet(host, layouts, thresholds))
        res.append(returning_gpu(host, run_id, node_metrics, store, store_note))
        if sdc_rows[host]:
            res.append(sdc_voters.judge(host, run_id, sdc_rows, store, store_note, sdc_votes))
        out["results"][host] = res + version_res
    out["fleet_medians"] = {
        f"{k}|{c}": {
            "metric": k,
            "context": c,
            "value": stats[(k, c)][0],
            "n": len(v),
            "unit": next(iter(v.values()))["unit"],
        }
        for (k, c), v in groups.items()
    }
    out["baseline_medians"] = {f"{k}|{c}": {"metric": k, "context": c, **v} for (k, c), v in medians.items()}
    out["view"] = view_rows(metrics_by_host, groups, medians, base_rows, out["results"], stats)
    return out


# Every threshold key the fleet comparisons read: all of them are in generic.yml, none in a model profile.
KEYS_READ = (
    *COMPARISON_KEYS,
    MIN_WINDOW,
    FABRIC_SHARE,
    *sorted({c[4] for c in COUNTERS if c[4]} | {c[4] for c in FABRIC_COUNTERS}),
)
UNRECORDED = {
    registry.NODE: "the node's stage kept no record of it (no references handed to it, or they changed since)",
    registry.CONTROLLER: "only this run's other nodes show it, which no node sees while it measures",
}
ACROSS_NODES = "measured across nodes, where no node can measure it again alone"


def figures_before(metrics_by_host: dict[str, dict], store: Any, run_id: str) -> dict[tuple, dict]:
    """The previous run's host figures of the nodes that are virtual machines (store.node_figures_before): on such a
    node a host figure's drop is the environment's unless it repeats over runs (comparisons/trusted.py)."""
    hosts = [h for h, f in metrics_by_host.items() if any(m.get("virtual") for m in f["metrics"])]
    return (
        store.node_figures_before(hosts, run_id, list(metric_keys.HOST_METRICS)) if store is not None and hosts else {}
    )


def with_before(node_metrics: dict, host: str, before: dict[tuple, dict]) -> dict:
    """The node's figures, a virtual machine's host figures with their previous run's (`before`), where there is one."""
    if not any((host, m["key"], m["context"]) in before for m in node_metrics["metrics"]):
        return node_metrics
    found = [
        {**m, "before": before[(host, m["key"], m["context"])]} if (host, m["key"], m["context"]) in before else m
        for m in node_metrics["metrics"]
    ]
    return {**node_metrics, "metrics": found}


def settler(results: list[dict], thresholds: Thresholds):
    """settle(check, row) for one node: comparisons.confirm.settle with the node's record, by where registry.py
    says each check is judged."""
    record = confirm.record(results)
    confirming = (thresholds.value(CONFIRM_MAX) or 0) > 0
    where = {c.name: c.where for c in registry.comparison_checks()}

    def settle(check: str, row: dict) -> dict:
        across = metric_keys.describe(str(row.get("metric") or row.get("key")))["shared"]
        unrecorded = ACROSS_NODES if across else UNRECORDED[where[check]]
        return confirm.settle(check, row, record, confirming=confirming, unrecorded=unrecorded)

    return settle
