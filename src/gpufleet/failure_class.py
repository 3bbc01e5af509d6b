"""What kind of failure a result that is not pass or skip is: the key `class` of the one result schema.

    hardware       the board, its memory, its links or its cooling: follows the GPU (uuid, serial) from run to run
    environment    something beside the node's own state: another process on the GPU, the node lock, a full disk
    configuration  a setting of the node or the inventory (power limit, MIG, ACS, NCCL variables, thresholds)
    software       driver, firmware, packages, or the engine itself: a check that could not run

Only `hardware` follows a GPU: fleet.returning_gpu, the store's GPU history and the drain line lead with it, so
a GPU that failed only because another process held its memory is not "a GPU that failed before".

DEFAULTS is the class of each check when it warns or fails; a check that could not run (`error`) is software
unless its default is environment (the lock, processes: what stopped it is beside the node). A result made with
schema.result(..., failure_class=...) keeps its own class: that is where the cause is known (wrong data moved
by a copy is hardware, whatever the check).
"""

from __future__ import annotations

HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE = "hardware", "environment", "configuration", "software"
CLASSES = (HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE)

# check name (or group.check where a name is shared) -> class of its warn and fail
DEFAULTS = {
    # gpu_inventory
    "gpu_count": HARDWARE, "gpu_model": CONFIGURATION, "gpu_memory": HARDWARE, "driver_version": SOFTWARE,
    "vbios": SOFTWARE, "persistence_mode": CONFIGURATION, "mig_mode": CONFIGURATION, "compute_mode": CONFIGURATION,
    "profile": CONFIGURATION,
    # gpu_health
    "ecc": HARDWARE, "row_remapping": HARDWARE, "retired_pages": HARDWARE, "xid": HARDWARE, "clock_events": HARDWARE,
    "temperature": HARDWARE, "power_limit": CONFIGURATION, "pcie_link": HARDWARE, "nvlink": HARDWARE,
    "processes": ENVIRONMENT,
    # the GPUs' processes listed while each watched step measured, and again after the benchmarks
    "matmul_processes": ENVIRONMENT, "memory_processes": ENVIRONMENT, "soak_processes": ENVIRONMENT,
    "nccl_processes": ENVIRONMENT, "train_gpt2_processes": ENVIRONMENT, "finetune_processes": ENVIRONMENT,
    "processes_after": ENVIRONMENT,
    # host_hygiene
    "pcie_acs": CONFIGURATION, "numa_affinity": CONFIGURATION, "infiniband": HARDWARE, "ib_port_speed": HARDWARE,
    "gpu_nic_rails": HARDWARE, "pcie_aer": HARDWARE, "peermem": SOFTWARE,
    "iommu": CONFIGURATION, "numa_balancing": CONFIGURATION, "cpu_governor": CONFIGURATION, "fabric_manager": SOFTWARE,
    "nccl_env": CONFIGURATION, "bringup_drift": CONFIGURATION,
    # benchmarks
    "matmul_bf16": HARDWARE, "memory_bandwidth": HARDWARE, "hbm_bandwidth": HARDWARE, "pcie_h2d_bandwidth": HARDWARE,
    "pcie_d2h_bandwidth": HARDWARE, "nccl": SOFTWARE, "nccl_sendrecv": HARDWARE, "nccl_transport": CONFIGURATION,
    "nccl_all_reduce": HARDWARE, "nccl_all_gather": HARDWARE, "nccl_reduce_scatter": HARDWARE, "nccl_all_to_all": HARDWARE,
    "train_gpt2": SOFTWARE, "train_scaling": HARDWARE, "soak": SOFTWARE, "soak_throttle": HARDWARE,
    "soak_errors": HARDWARE, "soak_slowdown": HARDWARE, "sdc": HARDWARE, "finetune": SOFTWARE,
    # counters, lock, the engine and the report
    "snapshot_before": SOFTWARE, "snapshot_after": SOFTWARE, "fabric_before": SOFTWARE, "fabric_after": SOFTWARE,
    "node_lock": ENVIRONMENT, "reachable": ENVIRONMENT,
    "engine": SOFTWARE,
    "results_file": SOFTWARE,
    # fleet
    "gpu_vs_node": HARDWARE, "node_vs_fleet": HARDWARE, "node_vs_baseline": HARDWARE, "node_vs_baseline_fleet": HARDWARE,
    "sample_spread": ENVIRONMENT, "counters_during_run": HARDWARE, "counters_since_previous_run": HARDWARE,
    "fabric_during_run": HARDWARE, "fabric_since_previous_run": HARDWARE, "ib_ports_vs_fleet": HARDWARE,
    "rails_vs_fleet": HARDWARE,
    "returning_gpu": HARDWARE, "fleet.sdc": HARDWARE, "fleet.versions": CONFIGURATION,
}


def default(check: str, status: str, group: str | None = None) -> str | None:
    """The class of a `status` result of this check when nothing more is known; None for pass, skip and info."""
    if status in ("pass", "skip", "info"):
        return None
    cls = DEFAULTS.get(f"{group}.{check}") or DEFAULTS.get(check) or SOFTWARE
    return cls if status != "error" or cls == ENVIRONMENT else SOFTWARE


def of(res: dict) -> str | None:
    """The class of a result: its own where it has a valid one, else the default (documents made before results
    carried a class, or a status changed after the result was made)."""
    if res.get("status") in ("pass", "skip", "info"):
        return None
    own = res.get("class")
    return own if own in CLASSES else default(res.get("check") or "", res.get("status") or "", res.get("group"))


def stamp(res: dict) -> dict:
    """Set `class` to what of() says: where results are stamped with their group and time."""
    res["class"] = of(res)
    return res
