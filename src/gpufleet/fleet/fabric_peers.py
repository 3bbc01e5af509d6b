"""The fabric's layout compared across the nodes of a run: each InfiniBand port's rate and lanes against the same
port (HCA name and port number) on the other nodes, and the HCA beside each GPU (by its position in PCI bus order)
against the one beside the same GPU on the other nodes. Read from the node checks' detail
(host_hygiene.ib_port_speed, host_hygiene.gpu_nic_rails); the reference is what more than
`fleet_fabric_reference_share_min` of the nodes that have the port or the GPU show; with no such majority nothing
is named.
"""

from __future__ import annotations

from collections import Counter

from gpufleet.comparisons.findings import fleet_result, listed_text
from gpufleet.comparisons.thresholds import FABRIC_SHARE as SHARE, Thresholds
from gpufleet.base.schema import FAIL, PASS, SKIP, WARN


def _detail(results: list, check: str) -> dict | None:
    last = None
    for r in results or []:
        if isinstance(r, dict) and r.get("group") == "host_hygiene" and r.get("check") == check:
            last = r
    return last.get("detail") if last and isinstance(last.get("detail"), dict) else None


def fabric_layouts(nodes: dict[str, dict]) -> dict[str, dict]:
    """{host: {"ports": {"mlx5_0/1": {"rate", "rate_gbps", "lanes"}}, "rails": {gpu position: HCA name}}} of the nodes
    whose checks read them."""
    out = {}
    for host, node in nodes.items():
        speed = _detail(node.get("results"), "ib_port_speed") or {}
        rails = _detail(node.get("results"), "gpu_nic_rails") or {}
        ports = {
            p["port"]: {k: p.get(k) for k in ("rate", "rate_gbps", "lanes")}
            for p in speed.get("ports") or []
            if isinstance(p, dict) and p.get("port")
        }
        pairs = {r["gpu"]: r["hca"] for r in rails.get("rails") or [] if isinstance(r, dict) and r.get("hca")}
        if ports or pairs:
            out[host] = {"ports": ports, "rails": pairs}
    return out


def _reference(values: dict, share: float) -> tuple:
    """(the value more than `share` of the nodes show, those nodes), or (None, []) where no value has that share."""
    counts = Counter(values.values())
    value, n = counts.most_common(1)[0]
    if n <= share * len(values):
        return None, []
    return value, sorted(h for h, v in values.items() if v == value)


def ib_ports_vs_fleet(host: str, layouts: dict[str, dict], thresholds: Thresholds) -> dict:
    check = "ib_ports_vs_fleet"
    share, threshold = thresholds.value(SHARE) or 0.5, thresholds.field(SHARE)
    mine = (layouts.get(host) or {}).get("ports") or {}
    if not mine:
        return fleet_result(
            check, SKIP, "no active InfiniBand port on this node to compare (host_hygiene.ib_port_speed)"
        )
    peers = [h for h, lay in layouts.items() if h != host and lay["ports"]]
    if not peers:
        return fleet_result(check, SKIP, "no other node of this run has active InfiniBand ports to compare with")
    parts, rows = [], []
    for port, p in sorted(mine.items()):
        values = {h: layouts[h]["ports"][port] for h in [host, *peers] if port in layouts[h]["ports"]}
        ref, same = _reference({h: (v.get("rate_gbps"), v.get("lanes")) for h, v in values.items()}, share)
        if len(values) < 2 or ref is None:
            continue
        ref_text = values[same[0]].get("rate")
        low = [
            w
            for w, m, r in (("rate", p.get("rate_gbps"), ref[0]), ("lanes", p.get("lanes"), ref[1]))
            if r is not None and (m is None or m < r)
        ]
        rows.append(
            {
                "port": port,
                "rate": p.get("rate"),
                "reference": ref_text,
                "nodes_at_reference": same,
                "nodes": len(values),
                "status": FAIL if low else PASS,
            }
        )
        if low:
            parts.append(
                f"{port} at {p.get('rate')} while {len(same)} of {len(values)} nodes run it at {ref_text} "
                f"({', '.join(same[:4])}{'...' if len(same) > 4 else ''})"
            )
    if not rows:
        return fleet_result(
            check,
            SKIP,
            "no port of this node has a rate and lane count shared by a majority of the nodes "
            "with the same port (HCA name and port number)",
            threshold=threshold,
        )
    if parts:
        return fleet_result(
            check,
            FAIL,
            f"{len(parts)} port(s) slower than the same port on the other nodes: " + listed_text(parts),
            threshold=threshold,
            remedy="check the cable, transceiver and switch port of the named port (`mlxlink -d <hca> -m`); "
            "a port trained lower than its peers slows every collective that crosses it",
            detail={"ports": rows},
        )
    return fleet_result(
        check,
        PASS,
        f"{len(rows)} port(s) at the rate and lanes most nodes show",
        threshold=threshold,
        detail={"ports": rows},
    )


def rails_vs_fleet(host: str, layouts: dict[str, dict], thresholds: Thresholds) -> dict:
    check = "rails_vs_fleet"
    share, threshold = thresholds.value(SHARE) or 0.5, thresholds.field(SHARE)
    mine = (layouts.get(host) or {}).get("rails") or {}
    if not mine:
        return fleet_result(check, SKIP, "no GPU-HCA pairing read on this node (host_hygiene.gpu_nic_rails)")
    peers = [h for h, lay in layouts.items() if h != host and lay["rails"]]
    if not peers:
        return fleet_result(check, SKIP, "no other node of this run has a GPU-HCA pairing to compare with")
    parts, rows, undecided = [], [], []
    for gpu, hca in sorted(mine.items()):
        values = {h: layouts[h]["rails"][gpu] for h in [host, *peers] if gpu in layouts[h]["rails"]}
        ref, same = _reference(values, share)
        if ref is None:
            undecided.append(gpu)  # no majority: two nodes that differ cannot say which is odd
            continue
        n = len(same)
        rows.append(
            {
                "gpu": gpu,
                "hca": hca,
                "reference": ref,
                "nodes_at_reference": same,
                "nodes": len(values),
                "status": WARN if hca != ref else PASS,
            }
        )
        if hca != ref:
            parts.append(f"GPU {gpu} sits beside {hca} where {n} of {len(values)} nodes have {ref}")
    detail = {"rails": rows, "no_majority": undecided}
    if parts:
        return fleet_result(
            check,
            WARN,
            "the rails differ from the other nodes': " + listed_text(parts),
            threshold=threshold,
            remedy="the HCAs are cabled or enumerated in another order than on the other nodes: a rail-optimised "
            "fabric then routes this node's GPU n over another rail's switches; compare the slots "
            "and cabling with the reference node, or name the HCAs per GPU (NCCL_IB_HCA, udev rules)",
            detail=detail,
        )
    if not rows:
        return fleet_result(
            check,
            SKIP,
            f"no GPU's HCA is shared by a majority of the {len(peers) + 1} nodes",
            threshold=threshold,
            detail=detail,
        )
    return fleet_result(
        check, PASS, f"{len(rows)} GPU(s) beside the same HCA as on most nodes", threshold=threshold, detail=detail
    )
