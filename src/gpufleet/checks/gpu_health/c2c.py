"""NVLink-C2C, a Grace superchip's link between its CPU and GPU (in place of PCIe): every link up, each at the speed
of the node's other links. gpu_health.pcie_link judges a GPU on C2C this way (base.host_platform tells which)."""

from __future__ import annotations

from gpufleet.base.schema import ERROR, FAIL

C2C_REMEDY = (
    "a Grace superchip's NVLink-C2C link down or slower than its siblings: `nvidia-smi c2c -s` shows each link; "
    "reset the GPU or power-cycle the node, and a link that stays so needs the superchip module serviced"
)


def fastest_link_gbps(gpus: list[dict]) -> float | None:
    """The fastest C2C link speed NVML gives on the node: what every link of the same superchips should run at."""
    speeds = [
        link["max_gbps"] for g in gpus for link in (g.get("c2c") or {}).get("links") or [] if link.get("max_gbps")
    ]
    return max(speeds) if speeds else None


def findings(f, g: dict, fastest: float | None) -> dict:
    """Add one GPU's C2C findings to `f` (gpu_inventory.Findings); its row for the result's detail."""
    i, c2c = g["index"], g.get("c2c") or {}
    links = c2c.get("links") or []
    row = {"index": i, "host_link": "nvlink_c2c", "c2c": c2c}
    if not c2c.get("link_count") or len(links) != c2c["link_count"]:
        f.add(
            ERROR, f"NVLink-C2C links unreadable ({c2c.get('reason') or 'NVML listed none'})", gpu=i, remedy=C2C_REMEDY
        )
        return row
    down = [link["link"] for link in links if link.get("up") is not True]
    if down:
        f.add(
            FAIL,
            f"NVLink-C2C link(s) {', '.join(map(str, down))} down ({len(links) - len(down)} of {len(links)} up)",
            gpu=i,
            remedy=C2C_REMEDY,
        )
    slow = sorted({link["max_gbps"] for link in links if link.get("up") and fastest and link["max_gbps"] < fastest})
    if slow:
        f.add(
            FAIL,
            f"NVLink-C2C links at {', '.join(f'{s:g}' for s in slow)} GB/s, the node's others at {fastest:g} GB/s",
            gpu=i,
            remedy=C2C_REMEDY,
        )
    return row


def summary(gpus: list[dict], fastest: float | None) -> str:
    counts = sorted({(g.get("c2c") or {}).get("link_count") for g in gpus} - {None})
    links = "/".join(map(str, counts)) or "its"
    speed = f" at {fastest:g} GB/s each" if fastest else ""
    return f"NVLink-C2C to the CPU on {len(gpus)} GPU(s): {links} links up{speed} (no PCIe link to train down)"
