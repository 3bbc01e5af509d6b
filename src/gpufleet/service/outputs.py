"""What keeping the fleet in service did in a run, and what it costs (fleet/service_log.py), as the run's outputs:
one function an output, each from the same gathered data, so each can be registered with the report's others.

    md_section(data)       report.md's section "## Fleet in service": the sweep (nodes swept, skipped and why, jobs
                           that left no verdict), the ladder's records of the run, the costs per node and fleet
    json_section(data)     report.json's "service"
    prometheus_text(data)  prometheus/gpufleet-service.prom, node_exporter's textfile format:

        gpufleet_sweeps{node}                              sweep jobs of the node in the store
        gpufleet_sweep_gpu_seconds{node,window}            GPU-seconds its sweep jobs held (GPUs x seconds); window:
                                                           all | 7d (the report says GPU-hours)
        gpufleet_fault_to_drain_seconds{node}              its latest fault: first sign to drain
        gpufleet_return_to_service_seconds{node}           its latest repair: drain to resume
        gpufleet_out_of_service{node}                      1 from its drain for a fault until it is back, whoever resumes it
        gpufleet_ladder_steps_taken{node}                  steps taken since its ladder last cleared
        gpufleet_fleet_sweep_gpu_seconds{window}           gpufleet_fleet_median_fault_to_drain_seconds
        gpufleet_fleet_median_return_to_service_seconds    gpufleet_fleet_nodes_out_of_service
    (base units, as export.py's: seconds, not hours)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from gpufleet.base import paths, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet import figure_text, service_log
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet import store as fleet_store
from gpufleet.fleet.export import exposition
from gpufleet.fleet.run_files import put_md_section, read_json, read_md
from gpufleet.service import ladder, policy, sweep

HEADING = "## Fleet in service"
PROM_FILE = "gpufleet-service.prom"


class Gauge(NamedTuple):
    """One gauge family, as export.exposition writes it."""

    name: str
    doc: str
    labelnames: tuple
    series: dict


def gather(run_dir: Path, store) -> dict:
    """The run's sweep and ladder records and the costs of every node with an event, from the store."""
    run_dir = Path(run_dir)
    costs = service_log.costs(store)
    rungs = {
        h: len(
            [s for s in ladder.open_steps(store.events(h, "ladder")) if s.get("done") and s.get("step") in policy.STEPS]
        )
        for h in costs["nodes"]
    }
    # A damaged record is left out here: the report and `gpufleet store rebuild` name it.
    judgements = (service_log.read_record(run_dir / ladder.LADDER_FILE)[0] or {}).get("judgements") or []
    return {
        "run_id": run_dir.name,
        "sweep": service_log.read_record(run_dir / sweep.SWEEP_FILE)[0],
        "ladder": judgements[-1] if judgements else None,
        "costs": costs,
        "steps_taken": rungs,
    }


def _hours(s: float | None) -> str:
    return "-" if s is None else f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def sweep_lines(sw: dict) -> list[str]:
    planned = sw.get("plan") or {}
    lines = [
        f"Sweep, tier {sw.get('tier')}: {len(sw.get('jobs') or [])} job(s) on {len(planned.get('idle') or [])} idle "
        f"node(s) of {', '.join(planned.get('partitions') or [])}, at most {planned.get('share')} at once."
    ]
    lines += [f"- skipped {n}: {why}" for n, why in (planned.get("skipped") or {}).items()]
    lines += [f"- deferred {n}: {why}" for n, why in (planned.get("deferred") or {}).items()]
    for j in sw.get("jobs") or []:
        verdict = "judged" if j.get("judged") else j.get("note") or "not judged"
        where = f" (re-test of the drained node in {j['retest']['reservation']})" if j.get("retest") else ""
        lines.append(
            f"- job {j.get('job_id', '-')} on {j['node']}{where}: {j.get('state', 'submitted')}, "
            f"{_hours(j.get('elapsed_s'))}, {j.get('gpu_hours', 0)} GPU-h; {verdict}"
        )
    return lines


def ladder_lines(lad: dict) -> list[str]:
    mode = f"acting on {', '.join(lad['act'])}" if lad.get("act") else "proposing only (no --act)"
    lines = [f"Remediation ladder, {mode}, {lad['at']}."]
    if (lad.get("breaker") or {}).get("tripped"):
        lines.append(f"Breaker tripped: {lad['breaker']['why']}.")
    for s in lad.get("steps") or []:
        if s["step"] in lad.get("act", []) and s["step"] in policy.ACTABLE:
            did = (
                "done" if s.get("done") else "NOT done: " + (s.get("not_done") or s.get("note") or "its command failed")
            )
        else:
            did = "proposed" if s.get("proposed") else "recorded"
        command = f"; command `{s['command']}`" if s.get("command") and not s.get("done") else ""
        lines.append(f"- {s['host']}: {s['step']} ({did}): {s['why']}{command}")
    return lines


def cost_lines(costs: dict, steps_taken: dict) -> list[str]:
    f = costs["fleet"]
    lines = [
        f"Costs over the store: {f['sweeps']} sweep job(s), {f['sweep_gpu_hours']} GPU-h ({f['sweep_gpu_hours_7d']} in the "
        f"last 7 days); {f['faults']} fault(s) drained, first sign to drain median {_hours(f['fault_to_drain_s_median'])}, "
        f"back in service median {_hours(f['return_s_median'])}; out of service now: {', '.join(f['out_of_service']) or 'none'}."
    ]
    if costs["nodes"]:
        lines += [
            "",
            "| node | sweeps | GPU-h (7 d) | faults | last: first sign to drain | last: back in service | ladder steps |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for host, n in costs["nodes"].items():
            last = n["faults"][-1] if n["faults"] else {}
            back = (
                _hours(last.get("return_s"))
                + (" (resumed by hand, seen)" if last.get("resumed_by", "gpufleet") != "gpufleet" else "")
                if last.get("resumed_at")
                else ("still out" if n["out_of_service"] else "-")
            )
            lines.append(
                f"| {host} | {n['sweeps']} | {figure_text(n['sweep_gpu_hours'])} ({figure_text(n['sweep_gpu_hours_7d'])}) | {len(n['faults'])} "
                f"| {_hours(last.get('fault_to_drain_s'))} | {back} | {steps_taken.get(host, 0)} |"
            )
    return lines


def md_section(data: dict) -> list[str]:
    lines = [HEADING, ""]
    if isinstance(data.get("sweep"), dict):
        lines += sweep_lines(data["sweep"]) + [""]
    if isinstance(data.get("ladder"), dict):
        lines += ladder_lines(data["ladder"]) + [""]
    return lines + cost_lines(data["costs"], data["steps_taken"])


def json_section(data: dict) -> dict:
    return {
        "sweep": data.get("sweep"),
        "ladder": data.get("ladder"),
        "costs": data["costs"],
        "steps_taken": data["steps_taken"],
    }


def prometheus_text(data: dict) -> str:
    def gauge(name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, labels, {})

    sweeps = gauge("gpufleet_sweeps", "Sweep jobs of the node in the store", "node")
    gpu_s = gauge(
        "gpufleet_sweep_gpu_seconds",
        "GPU-seconds the node's sweep jobs held (GPUs x seconds): all, or the last 7 days",
        "node",
        "window",
    )
    to_drain = gauge(
        "gpufleet_fault_to_drain_seconds", "The node's latest fault: seconds from its first sign to its drain", "node"
    )
    back = gauge(
        "gpufleet_return_to_service_seconds", "The node's latest repair: seconds from its drain to its resume", "node"
    )
    out = gauge(
        "gpufleet_out_of_service",
        "1 from the node's drain for a fault by gpufleet until it is back in service, whoever resumed it",
        "node",
    )
    steps = gauge("gpufleet_ladder_steps_taken", "Remediation steps taken since the node's ladder last cleared", "node")
    fleet = [
        gauge("gpufleet_fleet_sweep_gpu_seconds", "GPU-seconds all sweep jobs held: all, or the last 7 days", "window"),
        gauge("gpufleet_fleet_median_fault_to_drain_seconds", "Median seconds from a fault's first sign to its drain"),
        gauge("gpufleet_fleet_median_return_to_service_seconds", "Median seconds from a drain to the resume"),
        gauge("gpufleet_fleet_nodes_out_of_service", "Nodes gpufleet keeps drained for a fault"),
    ]
    for host, n in data["costs"]["nodes"].items():
        sweeps.series[(host,)] = float(n["sweeps"])
        gpu_s.series[(host, "all")], gpu_s.series[(host, "7d")] = n["sweep_gpu_seconds"], n["sweep_gpu_seconds_7d"]
        out.series[(host,)] = float(n["out_of_service"])
        steps.series[(host,)] = float(data["steps_taken"].get(host, 0))
        last = n["faults"][-1] if n["faults"] else {}
        if last.get("fault_to_drain_s") is not None:
            to_drain.series[(host,)] = last["fault_to_drain_s"]
        closed = [x for x in n["faults"] if x.get("return_s") is not None]
        if closed:
            back.series[(host,)] = closed[-1]["return_s"]
    f = data["costs"]["fleet"]
    fleet[0].series[("all",)], fleet[0].series[("7d",)] = f["sweep_gpu_seconds"], f["sweep_gpu_seconds_7d"]
    for g, value in zip(fleet[1:], (f["fault_to_drain_s_median"], f["return_s_median"], len(f["out_of_service"]))):
        if value is not None:
            g.series[()] = float(value)
    return exposition([sweeps, gpu_s, to_drain, back, out, steps, *fleet])


def write(run_dir: Path, db: Path | None = None) -> dict:
    """Every output into the run folder: report.md's section and report.json's "service" (when reported), and the
    Prometheus file, after Slurm's own state is read (a node back in service ends its episode, fleet/slurm_action.py
    seen_back). The gathered data."""
    run_dir = Path(run_dir)
    read_md(run_dir / "report.md")  # named before anything is written
    store_path = Path(db) if db else fleet_store.default_path(run_dir.resolve().parent)
    with ladder.writer_store(store_path, run_dir) as store:
        store.index_events(run_dir)
        try:
            shown = slurm.show_nodes()  # Slurm's own state: a node resumed by hand is back, whoever resumed it
        except InputError:
            shown = None  # no Slurm here: the episodes stand as the records left them
        if shown is not None and fleet_slurm.seen_back(run_dir, shown, service_log.costs(store)):
            store.index_events(run_dir)
        data = gather(run_dir, store)
    report_json = read_json(run_dir / "report.json")
    if isinstance(report_json, dict):
        report_json["service"] = json_section(data)
        paths.write_atomic(run_dir / "report.json", json.dumps(report_json, default=str) + "\n")
    put_md_section(run_dir / "report.md", HEADING, md_section(data))
    folder = paths.make_dir(run_dir / "prometheus")
    paths.write_atomic(folder / PROM_FILE, prometheus_text(data))
    return data
