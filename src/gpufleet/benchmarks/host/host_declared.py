"""The host benchmark's declaration (memory per NUMA node, the scratch drive, a data loader): its checks,
run tier and metrics."""

from __future__ import annotations

from gpufleet.base.registry import AGAIN, GB, HARDWARE, LIMIT, SIBLINGS, Benchmark, Check, Metric, declare

# fmt: off
HOST_MEMORY_KEYS, SCRATCH_FREE = ("host_memory_gbps_min", "host_memory_numa_below_pct_max"), "disk_scratch_free_gib_min"

declare(
    Benchmark("host", run_tiers=("acceptance",), default=True, checks=(
        Check("host_memory_bandwidth", HARDWARE, HOST_MEMORY_KEYS, against=(LIMIT, SIBLINGS), **AGAIN,
              text="the host's memory triad on each NUMA node, against its siblings"),
        Check("disk_write_bandwidth", HARDWARE, ("disk_write_gbps_min", SCRATCH_FREE), against=(LIMIT,), **AGAIN,
              text="direct-I/O write bandwidth of the scratch drive"),
        Check("disk_read_bandwidth", HARDWARE, ("disk_read_gbps_min", SCRATCH_FREE), against=(LIMIT,), **AGAIN,
              text="direct-I/O read bandwidth of the scratch drive"),
        Check("data_loader", HARDWARE, ("loader_tokens_per_s_per_gpu_min",), against=(LIMIT,), **AGAIN,
              text="tokens a second a GPU the host's CPUs decode into pinned memory"),
    )),
    metrics=(
        Metric("host_memory_gbps", "host memory triad, slowest NUMA node", "GB/s",
               "gpufleet_host_memory_bytes_per_second", GB),
        Metric("disk_{direction}_gbps", "scratch drive {direction}", "GB/s", "gpufleet_disk_bytes_per_second", GB,
               words={"direction": {"write": "write", "read": "read"}}),
        Metric("loader_tokens_per_s_per_gpu", "data loader", "tokens/s/GPU",
               "gpufleet_loader_tokens_per_second_per_gpu"),
    ),
)
# fmt: on
