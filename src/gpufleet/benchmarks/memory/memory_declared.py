"""The memory benchmark's declaration (HBM and host copies): its checks, run tiers and metrics."""

from __future__ import annotations

from gpufleet.base.registry import GB, HARDWARE, SAMPLED, SAMPLED_FIGURE, Benchmark, Check, Metric, Threshold, declare

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "hbm_copy_gbps_min",
        "number",
        None,
        min=0,
        source="depends on the GPU model",
    ),
    Threshold(
        "pcie_h2d_gbps_min",
        "number",
        None,
        min=0,
        source="depends on the host interface",
    ),
    Threshold(
        "pcie_d2h_gbps_min",
        "number",
        None,
        min=0,
        source="depends on the host interface",
    ),
)

# fmt: off
declare(
    # A confirmation measures again only the figures that asked (one GPU, one way of its link: memory_again.py).
    Benchmark("memory", run_tiers=("smoke", "acceptance"), default=True, thresholds=THRESHOLDS, checks=(
        Check("memory_bandwidth", HARDWARE, text="every HBM and PCIe copy ran and moved the right data"),
        Check("hbm_bandwidth", HARDWARE, ("hbm_copy_gbps_min",) + SAMPLED, **SAMPLED_FIGURE,
              text="HBM copy bandwidth of the slowest GPU"),
        Check("pcie_h2d_bandwidth", HARDWARE, ("pcie_h2d_gbps_min",) + SAMPLED, **SAMPLED_FIGURE,
              text="host-to-device copy bandwidth of the slowest GPU"),
        Check("pcie_d2h_bandwidth", HARDWARE, ("pcie_d2h_gbps_min",) + SAMPLED, **SAMPLED_FIGURE,
              text="device-to-host copy bandwidth of the slowest GPU"),
    )),
    metrics=(
        Metric("hbm_copy_gbps", "HBM copy", "GB/s", "gpufleet_hbm_copy_bytes_per_second", GB, per_gpu=True),
        Metric("pcie_{direction}_gbps", "PCIe {direction}", "GB/s", "gpufleet_pcie_copy_bytes_per_second", GB,
               per_gpu=True, words={"direction": {"h2d": "host-to-device", "d2h": "device-to-host"}}),
    ),
)
# fmt: on

from gpufleet.benchmarks.memory import memory_figures  # noqa: E402, F401 (registers how the fleet reads its figures)
