"""The evidence bundle's pages a person reads (service/evidence.py writes the archive): summary.md, the first page of
an RMA ticket (what failed, each finding with the component it is about and the recommended action, since when, what
this fault's ladder tried, the Slurm drain record, the machine's and every GPU's identity, the versions or why one is
not read), figures.md and counters.md."""

from __future__ import annotations

from gpufleet.base import causes
from gpufleet.fleet import component, figure_text
from gpufleet.fleet.remediation import THEIRS, recommended
from gpufleet.service import policy


def figures_md(figs: dict, host: str, gpu: dict | None) -> str:
    who = f"{host} GPU {gpu['index']} ({gpu.get('uuid')}, serial {gpu.get('serial')})" if gpu else host
    lines = [f"# Figures of {who}", "", f"Baseline run: {figs['baseline_run'] or 'none set'}.", ""]
    for key, points in figs["figures"].items():
        lines += [
            f"## {key} ({points[0].get('unit') or ''})",
            "",
            "| run | started | value | fleet median | baseline median |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {p['run_id']} | {p['started']} | {figure_text(p['value'])}{' (cpu)' if p.get('cpu') else ''} | "
            f"{figure_text(p['fleet_median']) if p['fleet_median'] is not None else '-'} | "
            f"{figure_text(p['baseline_median']) if p['baseline_median'] is not None else '-'} |"
            for p in points
        ]
        lines.append("")
    if not figs["figures"]:
        lines += ["(no benchmark figure recorded)", ""]
    readings = figs.get("readings") or {}
    if readings:
        run_ids = list(dict.fromkeys(p["run_id"] for points in readings.values() for p in points))
        lines += [
            "## What the checks read of the GPU, run by run",
            "",
            "| reading | " + " | ".join(run_ids) + " |",
            "| --- |" + " --- |" * len(run_ids),
        ]
        for key, points in readings.items():
            by_run = {p["run_id"]: figure_text(p["value"]) for p in points}
            lines.append(f"| {key} | " + " | ".join(by_run.get(r, "-") for r in run_ids) + " |")
        lines.append("")
    return "\n".join(lines)


def counters_md(rows: list[dict]) -> str:
    shown = [r for r in rows if r["after"] or r["during_run"] or r["since_previous_run"]]
    lines = [
        "# Error counters",
        "",
        "Counters above zero or that grew; counters.json has every one.",
        "",
        "| run | device | counter | before | after | growth in the run | since the run before |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['run_id']} | {r['device']} | {r['counter']} | {r['before'] if r['before'] is not None else '-'} | {r['after']} | "
        f"{r['during_run'] if r['during_run'] is not None else '-'} | "
        f"{r['since_previous_run'] if r['since_previous_run'] is not None else '-'} |"
        for r in shown
    ]
    return "\n".join(lines) + "\n"


def summary_md(
    host: str,
    gpu: dict | None,
    first: dict | None,
    chosen: list[str],
    docs: list[tuple[str, dict]],
    steps: list[dict],
    ids: dict,
    bug_note: str,
    drains: list[dict] | None = None,
) -> str:
    """The page a vendor reads first: each cause once (causes.grouped: a node without a driver is one cause of 18
    checks, not 18 lines) with the component it is about and the recommended action, since when, what this episode of
    the ladder tried, the Slurm drain record, the machine and its GPUs, the versions (or why one is not read)."""
    by_run = dict(docs)
    failed: dict = {}  # cause -> [its line, its class, the runs it failed in, its component, its action]
    for run_id in chosen:
        doc = by_run.get(run_id) or {}
        results = doc.get("results") or []
        for g in causes.grouped(results):
            members = causes.results_of(g, results)
            act = recommended(members[0], (doc.get("profile") or {}).get("name")) if members else None
            entry = failed.setdefault(g["cause"], [causes.line(g), g["class"], [], component.of_cause(g, results), act])
            entry[2].append(run_id)
    who = f"{host}, GPU {gpu['index']} ({gpu.get('uuid')}, serial {gpu.get('serial')})" if gpu else host
    tried = [
        f"{s['step']} in run {s.get('run_id')} ({s.get('at')}): "
        + ("done" if s.get("done") else "proposed, not done")
        + (f", {s['outcome']}" if s.get("outcome") else "")
        for s in steps
        if s.get("step") in policy.ACTABLE
    ]
    lines = [f"# Evidence: {who}", "", "- What failed" + (":" if failed else ": nothing failed in the runs given")]
    for line, cls, ran, what, act in failed.values():
        lines.append(f"  - {line} [{cls}], in run(s) {', '.join(ran)}")
        lines.append(f"    - component: {what}")
        if act:
            lines.append(f"    - recommended action: {act['action']} ({act['why']}; as {THEIRS[act['action']]})")
    lines += [
        f"- Since: run {first['run_id']} ({first['started']}), the first run that failed it; runs here: {', '.join(chosen)}"
        if first
        else f"- Since: no run failed it; runs here: {', '.join(chosen)}",
        "- Already tried in this fault's ladder: " + ("; ".join(tried) or "nothing yet"),
        "- Slurm: " + slurm_text(drains or []),
        "- " + ", ".join(f"{what} {_version(ids, key, gpu)}" for what, key in VERSIONS),
        f"- nvidia-bug-report.log: {bug_note}",
        "",
        *machine_md(ids.get("machine") or {}),
        *gpus_md(ids, gpu),
        "Files: documents/ (host documents of those runs), figures.md (against the fleet and the baseline"
        + (", and what the checks read of the GPU" if gpu else "")
        + "), counters.md, identity.json (the machine's and each GPU's, run by run), slurm.json (every Slurm action "
        "on the node), kernel_log.txt, ladder.json (every record of the node's ladder), manifest.json (what was "
        "removed, by key).",
    ]
    return "\n".join(lines) + "\n"


def slurm_text(decisions: list[dict]) -> str:
    """The node's last drain in Slurm (its reason and when), and the latest action if it came after."""
    drains = [d for d in decisions if d.get("do") == "drain"]
    if not decisions:
        return "no Slurm action recorded in the node's runs (slurm.json)"
    said = f"last drain: {drain_text(drains[-1])}" if drains else "never drained by gpufleet"
    return said + (f"; latest: {drain_text(decisions[-1])}" if decisions[-1] is not (drains or [None])[-1] else "")


def drain_text(d: dict) -> str:
    """One Slurm decision in words: what was done, when, with which reason, the state before and after."""
    done = f"{d.get('do') or 'nothing'} {'done ' + str(d['done']) if d.get('done') else '(' + str(d.get('why') or 'not done') + ')'}"
    reason = f' with reason "{d["reason"]}"' if d.get("reason") else ""
    state = f"; state {d.get('state')} -> {d.get('state_after')}" if d.get("state_after") else ""
    return f"{done} in run {d.get('run_id')} ({d.get('action')}){reason}{state}"


MACHINE = (
    ("system", ("sys_vendor", "product_name", "product_serial", "product_uuid")),
    ("board", ("board_vendor", "board_name", "board_serial")),
    ("chassis", ("chassis_vendor", "chassis_type", "chassis_serial", "chassis_asset_tag")),
    ("BIOS", ("bios_vendor", "bios_version", "bios_date")),
)


def machine_md(machine: dict) -> list[str]:
    """The machine's identity (the host document's `machine`: DMI), each field or why it was not read."""
    not_read = machine.get("not_read") or {}
    lines = ["## The machine", ""]
    for part, fields in MACHINE:
        said = [
            f"{f} {machine[f]}"
            if machine.get(f)
            else f"{f} not read ({not_read.get(f) or not_read.get('dmi') or 'not recorded'})"
            for f in fields
        ]
        lines.append(f"- {part}: " + "; ".join(said))
    return lines + [""]


def gpus_md(latest: dict, gpu: dict | None) -> list[str]:
    """Every GPU of the node as the latest run saw it (identity()'s `latest`): index, UUID, serial, bus id, VBIOS,
    InfoROM."""
    gpus = [g for g in latest.get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return ["## GPUs", "", "(no GPU listed in the latest run's inventory)", ""]
    inforom = latest.get("inforom_image") if isinstance(latest.get("inforom_image"), list) else []
    lines = [
        "## GPUs",
        "",
        "| GPU | UUID | serial | bus id | VBIOS | InfoROM |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for pos, g in enumerate(gpus):
        mark = " (this one)" if gpu is not None and g.get("index") == gpu.get("index") else ""
        rom = inforom[pos] if pos < len(inforom) and inforom[pos] else f"not read ({_why(latest, 'inforom_image')})"
        lines.append(
            f"| {g.get('index')}{mark} | {g.get('uuid')} | {g.get('serial')} | {g.get('pci_bus_id')} | "
            f"{g.get('vbios') or g.get('vbios_version')} | {rom} |"
        )
    return lines + [""]


VERSIONS = (
    ("Driver", "driver"),
    ("CUDA driver", "cuda_driver"),
    ("VBIOS", "vbios"),
    ("InfoROM", "inforom_image"),
    ("kernel", "kernel"),
)


def _version(ids: dict, key: str, gpu: dict | None) -> str:
    """A version as the latest run read it (per GPU: that GPU's, or each GPU's), else `not read` and why."""
    value = ids.get(key)
    if isinstance(value, list):
        if gpu is not None and isinstance(gpu.get("index"), int) and gpu["index"] < len(value):
            value = value[gpu["index"]]
        else:
            value = ", ".join(f"GPU {i}: {v}" for i, v in enumerate(value) if v) or None
    if value:
        return str(value)
    return f"not read ({_why(ids, key)})"


def _why(ids: dict, key: str) -> str:
    return (ids.get("not_read") or {}).get(key) or "the host document does not say why"
