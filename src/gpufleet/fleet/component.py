"""The component a finding is about, in the words a drain reason and an RMA desk use: `GPU 3 SN 1653724061230`,
`host data loader`, `host memory triad`, `GPU 1 pid 650 gpu_disturb`, `host pid 650 python3`.

component(res) reads what the result already holds, in this order: the comparison that decided it (a GPU's index
and serial, or a node's figure), the GPUs its detail flags (detail.flagged_gpus), the foreign processes its steps
saw (detail.attempts[].foreign: on a GPU or on the host's CPUs), else its check. The Slurm drain reason names the
component of the node's first cause with it (slurm_action.drain_reason and export.drain_line call component_of()).
"""

from __future__ import annotations

from gpufleet.base import causes
from gpufleet.comparisons.metric_keys import describe

HOST_METRICS = ("host_", "disk_", "loader_")  # figures of the host, not of a GPU or the node's links
MAX_NAMED = 3  # GPUs or processes named in one component; the report has them all


def _check_id(res: dict) -> str:
    return f"{res['group']}.{res['check']}" if res.get("group") else str(res.get("check"))


def gpu_name(gpu: dict) -> str:
    """`GPU 3 SN 1653724061230`, or `GPU 3 GPU-ab12...` without a serial."""
    index = gpu.get("index")
    name = f"GPU {index}" if index is not None else "GPU"
    ident = f"SN {gpu['serial']}" if gpu.get("serial") else (str(gpu.get("uuid"))[:12] if gpu.get("uuid") else "")
    return f"{name} {ident}".strip()


def figure_name(metric: str) -> str:
    """A node's figure by what it measures: `host data loader`, `node all_reduce busbw, over 64 MiB`."""
    label = describe(metric)["label"]
    if metric.startswith(HOST_METRICS):
        return label if label.startswith("host") else f"host {label}"
    return label


def _process_name(p: dict) -> str:
    if p.get("kind") == "host_cpu":
        many = p.get("processes") or 1
        who = f"pid {p.get('pid')} {p.get('name') or ''}" if many == 1 else f"{many} processes {p.get('name') or ''}"
        return f"host {who}".strip() + (f" of user {p['user']}" if p.get("user") else "")
    return f"GPU {p.get('index')} pid {p.get('pid')} {p.get('name') or ''}".strip()


def _named(parts: list[str]) -> str:
    parts = list(dict.fromkeys(parts))
    more = len(parts) - MAX_NAMED
    return ", ".join(parts[:MAX_NAMED]) + (f" +{more} more" if more > 0 else "")


def _gpus(gpus: list[dict], serials: dict) -> str:
    """The GPUs a finding flags, each with its serial (from the result, else the node's inventory); more than
    MAX_NAMED by their indices only."""
    if len(gpus) > MAX_NAMED:
        return f"{len(gpus)} GPUs ({', '.join(str(g.get('index')) for g in gpus)})"
    return _named(
        [
            gpu_name({**g, "serial": g.get("serial") or serials.get(g.get("uuid")) or serials.get(g.get("index"))})
            for g in gpus
        ]
    )


def _worst_row(detail: dict) -> dict | None:
    rows = [c for c in detail.get("comparisons") or [] if isinstance(c, dict) and c.get("metric")]
    bad = [c for c in rows if c.get("status") not in (None, "pass")]
    return min(bad, key=lambda c: c.get("deviation_pct") or 0.0) if bad else None


def serials_of(results: list[dict]) -> dict:
    """{uuid or NVML index: serial} of a node's GPUs (gpu_inventory.gpu_count's inventory), for findings whose own
    detail names a GPU by uuid or index alone."""
    count = next((r for r in results if r.get("group") == "gpu_inventory" and r.get("check") == "gpu_count"), None)
    detail = (count or {}).get("detail") if isinstance((count or {}).get("detail"), dict) else {}
    gpus = [g for g in (detail.get("inventory") or {}).get("gpus") or [] if isinstance(g, dict) and g.get("serial")]
    return {**{g["uuid"]: g["serial"] for g in gpus if g.get("uuid")}, **{g.get("index"): g["serial"] for g in gpus}}


def component(res: dict, serials: dict | None = None) -> str:
    """What the finding is about (module docstring); the check's name when the result says nothing more. serials:
    serials_of() the node's results, for a GPU the result names without its serial."""
    serials = serials or {}
    detail = res.get("detail") if isinstance(res.get("detail"), dict) else {}
    row = _worst_row(detail)
    if row is not None:
        if row.get("index") is not None or row.get("uuid"):
            return _gpus(
                [row],
                {
                    **serials,
                    **{g.get("index"): g.get("serial") for g in detail.get("flagged_gpus") or [] if g.get("serial")},
                },
            )
        return figure_name(row["metric"])
    gpus = [g for g in detail.get("flagged_gpus") or [] if isinstance(g, dict)]
    if gpus:
        return _gpus(gpus, serials)
    seen = [p for a in detail.get("attempts") or [] if isinstance(a, dict) for p in a.get("foreign") or []]
    procs = [p for p in seen if isinstance(p, dict)]
    if procs:
        return _named([_process_name(p) for p in procs])
    return _check_id(res)


def of_cause(group: dict, results: list[dict]) -> str:
    """The component of one cause (causes.grouped): the first of its results that names more than its check."""
    serials = serials_of(results)
    names = [component(r, serials) for r in causes.results_of(group, results)]
    return next((n for n in names if n not in group["checks"]), names[0] if names else causes.label(group))


def component_of(node: dict) -> str | None:
    """The component of a node's first failing cause (causes.grouped: hardware first), for its drain reason; None
    for a node with no failing result."""
    results = [r for r in node.get("results") or [] if isinstance(r, dict)]
    groups = node.get("causes") if isinstance(node.get("causes"), list) else causes.grouped(results)
    return of_cause(groups[0], results) if groups else None
