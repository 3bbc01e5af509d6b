"""The text of `gpufleet history`: a node's, a GPU's or a serial's runs as a table, with the node's time in service."""

from __future__ import annotations

from gpufleet.base import causes
from gpufleet.fleet import figure_text


_NODE_COLUMNS = (
    ("bf16 TFLOPS", "matmul_bf16_tflops"),
    ("HBM GB/s", "hbm_copy_gbps"),
    ("H2D GB/s", "pcie_h2d_gbps"),
    ("D2H GB/s", "pcie_d2h_gbps"),
    ("all_reduce GB/s", "nccl_node_all_reduce_busbw_gbps_gt_64MiB"),
    ("across nodes GB/s", "nccl_multinode_all_reduce_busbw_gbps_gt_64MiB"),
    ("GPT-2 tok/s/GPU", "train_gpt2_node_tokens_per_s_per_gpu"),
)
_GPU_COLUMNS = _NODE_COLUMNS[:4]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def history_text(hist: dict) -> str:
    base = hist.get("baseline")
    mark = lambda run: f"{run} *" if run == base else run  # noqa: E731
    fig = lambda m, key: figure_text(m[key]["value"]) + (" (cpu)" if m[key]["cpu"] else "") if key in m else "-"  # noqa: E731
    if hist["kind"] == "node":
        cols = [c for c in _NODE_COLUMNS if any(c[1] in r["metrics"] for r in hist["runs"])]
        header = ["run", "started", "verdict", *(c[0] for c in cols), "not passing"]
        rows = [
            [
                mark(r["run_id"]),
                r["started"] or "?",
                (r["verdict"] or "?") + ("" if r["document"] == "ok" else " (no document)"),
                *(fig(r["metrics"], c[1]) for c in cols),
                _not_passing(r["not_passing"]),
            ]
            for r in hist["runs"]
        ]
        title = f"node {hist['key']}: {len(rows)} run(s)"
    else:
        cols = [c for c in _GPU_COLUMNS if any(c[1] in r["metrics"] for r in hist["runs"])]
        header = ["run", "started", "node", "GPU", "node verdict", *(c[0] for c in cols), "flagged by"]
        rows = [
            [
                mark(r["run_id"]),
                r["started"] or "?",
                r["node"],
                str(r["index"]),
                r["verdict"] or "?",
                *(fig(r["metrics"], c[1]) for c in cols),
                ", ".join(f"{f['check_id']} {f['status']} ({f['class']})" for f in r["flags"]) or "-",
            ]
            for r in hist["runs"]
        ]
        ids = {(r["uuid"], r["serial"]) for r in hist["runs"]}
        title = f"{'GPU' if hist['kind'] == 'gpu' else 'serial'} {hist['key']}: {len(rows)} run(s); " + "; ".join(
            f"uuid {u}, serial {s}" for u, s in sorted(ids, key=str)
        )
    lines = [
        title + (f" (* baseline {base})" if base else ""),
        "",
        _table(header, rows),
        "",
        *_service_lines(hist.get("service")),
        f"store: {hist['store']}",
    ]
    return "\n".join(lines)


def _not_passing(results: list[dict], shown: int = 4) -> str:
    """A run's results that did not pass, each cause once (causes.grouped: a node without a driver is one cause of
    18 checks), then the warnings by check."""
    named = [
        f"{causes.label(g)} {g['status']} ({g['class']})"
        for g in causes.grouped([dict(r, group=None) for r in results])
    ]
    named += [f"{x['check']} {x['status']} ({x['class']})" for x in results if x["status"] not in causes.FAILING]
    return ", ".join(named[:shown]) + (" …" if len(named) > shown else "")


def _service_lines(service: dict | None) -> list[str]:
    """A node's sweeps, faults and remediation steps (fleet/service_log.py), when it has any."""
    if not service or not (service["costs"]["sweeps"] or service["costs"]["faults"] or service["ladder"]):
        return []
    c = service["costs"]
    lines = [
        f"in service: sweeps {c['sweeps']} ({c['sweep_gpu_hours']} GPU-h, {c['sweep_gpu_hours_7d']} in the last 7 days)"
        + ("; out of service now" if c["out_of_service"] else "")
    ]
    for f in c["faults"]:
        back = (
            f"back in service {f['resumed_at']} ({figure_text(f['return_s'])} s later)"
            if f["resumed_at"]
            else "not back yet"
        )
        lines.append(
            f"  fault: first sign run {f['first_sign_run']} {f['first_sign']}, drained {f['drained_at']} "
            f"({figure_text(f['fault_to_drain_s'])} s later), {back}"
        )
    lines += [
        f"  ladder: {s.get('at')} run {s.get('run_id')}: {s.get('step')}"
        + (" (done)" if s.get("done") else "")
        + f": {s.get('why')}"
        for s in service["ladder"]
    ]
    return lines + [""]
