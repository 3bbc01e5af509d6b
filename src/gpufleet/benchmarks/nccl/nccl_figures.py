"""The NCCL benchmark's figures for the fleet: each collective's bus bandwidth per size band, inside the node and
across nodes, and the node's slowest send/recv pair.

A band's figure is the busbw at the largest size measured in it; that size and the world size are the metric's
`context`, so a figure is only ever compared with one measured the same way."""

from __future__ import annotations

from gpufleet.base.registry import BENCHMARK_GROUP, band_of, registers

NOT_COLLECTIVES = ("nccl", "nccl_transport", "nccl_sendrecv")


@registers("nccl", "figures")
def figures(res: dict, fig) -> None:
    if res["check"] == "nccl_sendrecv":
        if res["group"] == BENCHMARK_GROUP:
            _sendrecv(res, fig)
    elif res["check"] not in NOT_COLLECTIVES:
        _collective(res, "node" if res["group"] == BENCHMARK_GROUP else "multinode", fig)


def _collective(res: dict, scope: str, fig) -> None:
    detail = res.get("detail") or {}
    collective = res["check"][len("nccl_") :]
    rows = [
        r
        for r in detail.get("rows") or []
        if isinstance(r, dict)
        and r.get("correct", True)
        and isinstance(r.get("size_bytes"), int)
        and fig.finite(r.get("busbw_gbps"))
    ]
    best: dict[str, dict] = {}
    for r in rows:
        band = band_of(r["size_bytes"])
        if band not in best or r["size_bytes"] > best[band]["size_bytes"]:
            best[band] = r
    for band, r in best.items():
        fig.add(
            f"nccl_{scope}_{collective}_busbw_gbps_{band}",
            r["busbw_gbps"],
            gpu=None,
            context=f"size={r['size_bytes']},world={detail.get('world_size')}",
            source=f"{res['group']}.{res['check']}",
            size_bytes=r["size_bytes"],
            trust=res.get("trust"),
        )


def _sendrecv(res: dict, fig) -> None:
    detail = res.get("detail") or {}
    matrix = detail.get("matrix") if isinstance(detail.get("matrix"), dict) else {}
    cells = [
        c.get("gbps") for row in matrix.get("gbps") or [] for c in row or [] if isinstance(c, dict) and c.get("correct")
    ]
    cells = [c for c in cells if fig.finite(c)]
    if cells:
        fig.add(
            "nccl_node_sendrecv_gbps",
            min(cells),
            gpu=None,
            context=f"size={matrix.get('size_bytes')},world={detail.get('world_size')}",
            source=f"{res['group']}.{res['check']}",
        )
