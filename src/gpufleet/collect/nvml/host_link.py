"""How a GPU reaches its host's CPU and memory, through NVML: NVLink-C2C on a Grace superchip (GH200, GB200), whose
links' state and speed NVML gives, and the NUMA node of the GPU's own memory where the platform makes it one
(a coherent Grace node); elsewhere PCIe, which the GPU's `pcie` fields read.

    c2c                 {"enabled": bool | None, "link_count": int | None,
                         "links": [{"link": int, "up": bool | None, "max_gbps": float | None}], "reason": str | None}
                        enabled None: NVML could not say (a driver or binding without C2C), which counts as PCIe;
                        a link's max_gbps is NVML's NVML_FI_DEV_C2C_LINK_GET_MAX_BW (MB/s) / 1000
    memory_numa_node    int: the GPU memory's NUMA node (nvmlDeviceGetNumaNodeId); None where it is none, the
                        reason in the GPU's `unreadable`
"""

from __future__ import annotations

from gpufleet.collect.nvml.binding import field_value, pynvml, read_field


def read_c2c(handle) -> dict:
    """The GPU's NVLink-C2C: whether it is on, and each link's state and speed. Where NVML has no C2C (a PCIe GPU, an
    older driver or binding) that is no fault: the reason stays here, not in the GPU's `unreadable`."""
    mode_fn = getattr(pynvml, "nvmlDeviceGetC2cModeInfoV", None)
    if mode_fn is None:
        return {"enabled": None, "link_count": None, "links": [], "reason": "the installed nvidia-ml-py has no C2C"}
    info, err = read_field(mode_fn, handle)
    if err:
        return {"enabled": None, "link_count": None, "links": [], "reason": err}
    if not info.isC2cEnabled:
        return {"enabled": False, "link_count": None, "links": [], "reason": None}
    count, err = read_field(lambda: int(field_value(handle, pynvml.NVML_FI_DEV_C2C_LINK_COUNT)))
    links = []
    for link in range(count or 0):
        up, up_err = read_field(lambda: bool(field_value(handle, pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS, link)))
        mbps, bw_err = read_field(lambda: field_value(handle, pynvml.NVML_FI_DEV_C2C_LINK_GET_MAX_BW, link))
        links.append(
            {
                "link": link,
                "up": up,
                "max_gbps": round(mbps / 1000, 3) if mbps is not None else None,
                **({"reason": up_err or bw_err} if up_err or bw_err else {}),
            }
        )
    return {"enabled": True, "link_count": count, "links": links, "reason": err}


def read_memory_numa_node(handle, unreadable: dict) -> int | None:
    """The NUMA node of the GPU's memory on a platform that makes it one; None elsewhere, the reason in
    `unreadable` (NVML says Not Supported on a PCIe GPU)."""
    fn = getattr(pynvml, "nvmlDeviceGetNumaNodeId", None)
    node, err = read_field(fn, handle) if fn else (None, "the installed nvidia-ml-py has no nvmlDeviceGetNumaNodeId")
    if err is None and (node is None or int(node) < 0):
        err = f"NVML gave no NUMA node ({node})"
    if err:
        unreadable["memory_numa_node"] = err
        return None
    return int(node)
