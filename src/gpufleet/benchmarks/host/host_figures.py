"""The host benchmark's figures for the fleet: the slowest NUMA node's memory triad, the scratch drive's write and
read, the data loader's tokens/s/GPU (each its result's value)."""

from __future__ import annotations

from gpufleet.base.registry import BENCHMARK_GROUP, registers

# check -> metric key
HOST_CHECKS = {
    "host_memory_bandwidth": "host_memory_gbps",
    "disk_write_bandwidth": "disk_write_gbps",
    "disk_read_bandwidth": "disk_read_gbps",
    "data_loader": "loader_tokens_per_s_per_gpu",
}


@registers("host", "figures")
def figures(res: dict, fig) -> None:
    """A figure of the host's own, compared only with one measured the same way (the tier; for the drive also the
    tool and its folder); on a virtual machine it says why the host is one (`virtual`: host_measure's `machine`)."""
    detail = res.get("detail") or {}
    if res["group"] != BENCHMARK_GROUP or res["check"] not in HOST_CHECKS:
        return
    if not fig.finite(res.get("value")) or res.get("status") == "error":
        return
    context = fig.tier(detail)
    if res["check"].startswith("disk_"):
        context = (
            f"tier={(detail.get('method') or {}).get('tier')},tool={detail.get('tool')},at={detail.get('scratch')}"
        )
    machine = detail.get("machine") if isinstance(detail.get("machine"), dict) else {}
    virtual = {"virtual": machine["why"]} if machine.get("virtual") and machine.get("why") else {}
    fig.node_figure(HOST_CHECKS[res["check"]], res, context, **virtual)
