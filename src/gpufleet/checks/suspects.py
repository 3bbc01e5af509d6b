"""Who may have pulled a figure down: every other process the step's GPU and host watches saw while it was measured,
over their limits or under them, each with its share, and a virtual machine's CPU steal. A figure judged unstable
(its samples fell: checks.figures) or disturbed (measure.watched) names them, so that a neighbour under the limits
(three memory-copying processes at 9.4% of the CPUs, under the 10% limit) is named beside the figure it may have
pulled down, not only kept in the watch's detail.

    of(monitor, index)   [{"who", "where", "share", "over_limit"}]: on GPU `index` (None: any) and on the host
    under(suspects)      those under the limits (a reason names those over them as what disturbed the figure)
    text(suspects)       the words a reason gives those under the limits
"""

from __future__ import annotations

from collections import defaultdict

# The host watch's limits as its summary keys them (bench.host_watch; the controller, which judges recorded
# documents again, imports no bench module).
CPU_KEY, STEAL_KEY = "host_foreign_cpu_share_max", "host_cpu_steal_pct_max"


def of(monitor: dict, index: int | None = None) -> list[dict]:
    """The processes (and the steal) the watches of one measurement saw (monitor: the step's sampler summary):
    over a limit (a process on GPU `index`, or on any GPU with index None; the host's neighbours over theirs) and
    under them (the host's busiest other processes at the watch's peak, grouped by user and name)."""
    out = [
        {
            "who": p["label"] if p.get("index") is None and p.get("label") else _gpu_process(p),
            "where": "host" if p.get("index") is None else f"GPU {p['index']}",
            "share": p.get("label") or f"{p.get('used_memory_mib')} MiB of GPU memory",
            "over_limit": True,
        }
        for p in monitor.get("foreign") or []
        if index is None or p.get("index") in (index, None)
    ]
    host = monitor.get("host") or {}
    limits, cpus = host.get("limits") or {}, host.get("cpus")
    peak = host.get("peak") or {}
    cpu_limit = limits.get(CPU_KEY)
    if peak.get("processes") and cpus and not (cpu_limit is not None and peak.get("cpu_pct", 0) > cpu_limit):
        groups: dict[tuple, list] = defaultdict(list)
        for p in peak["processes"]:
            groups[(p.get("user"), p.get("name"))].append(p)
        under = f"under the limit {cpu_limit:g}%" if cpu_limit is not None else "not judged"
        for (user, name), members in sorted(groups.items(), key=lambda kv: -sum(p["cores"] for p in kv[1])):
            members = sorted(members, key=lambda p: p["pid"])
            cores = sum(p["cores"] for p in members)
            who = (
                f"pid {members[0]['pid']} ({name}, user {user})"
                if len(members) == 1
                else f"{len(members)} processes {name} of user {user} (pids {', '.join(str(p['pid']) for p in members)})"
            )
            out.append(
                {
                    "who": who,
                    "where": "host",
                    "share": f"{cores:.3g} cores, {100 * cores / cpus:.3g}% of the host's {cpus} CPUs; the host's other "
                    f"processes {peak['cpu_pct']:g}% together at most, {under}",
                    "over_limit": False,
                }
            )
    steal = (host.get("steal") or {}).get("peak_pct") or 0
    steal_limit = limits.get(STEAL_KEY)
    if steal and not (steal_limit is not None and steal > steal_limit):
        out.append(
            {
                "who": "the hypervisor's other guests (CPU steal)",
                "where": "host",
                "share": f"up to {steal:g}% of the host's {cpus} CPUs"
                + (f", under the limit {steal_limit:g}%" if steal_limit is not None else ""),
                "over_limit": False,
            }
        )
    return out


def _gpu_process(p: dict) -> str:
    mem = f"{p['used_memory_mib']} MiB" if p.get("used_memory_mib") is not None else "memory not reported"
    return f"pid {p.get('pid')} ({p.get('name') or 'name unknown'}, {mem}) on GPU {p.get('index')}"


def under(suspects: list[dict]) -> list[dict]:
    """Those under the limits: the reasons name the ones over them already, as what disturbed the figure."""
    return [s for s in suspects if not s["over_limit"]]


def text(suspects: list[dict]) -> str:
    """ "suspects seen while it was measured, under the limits: ..." or what says that none was."""
    if not under(suspects):
        return "no other process seen on the GPU or the host while it was measured"
    return "suspects seen while it was measured, under the limits: " + "; ".join(
        f"{s['who']} ({s['share']})" for s in under(suspects)
    )
