"""The host benchmark's declaration (memory per NUMA node, the scratch drive, a data loader): its checks,
run tier and metrics."""

from __future__ import annotations

from gpufleet.base.registry import AGAIN, GB, HARDWARE, LIMIT, SIBLINGS, Benchmark, Check, Metric, Threshold, declare

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
DRIVES = (
    "depends on the node's drives; set it from a measured healthy fleet (docs/results/), else judged against the fleet"
)
THRESHOLDS = (
    Threshold(
        "host_memory_gbps_min",
        "number",
        None,
        min=0,
        source=(
            "depends on the host's CPUs and DIMMs: a NUMA node's triad (benchmarks.host.host_memory) is held against "
            "its siblings (host_memory_numa_below_pct_max) and the fleet; set it from a measured healthy fleet "
            "(docs/results/)"
        ),
    ),
    Threshold(
        "host_memory_numa_below_pct_max",
        "number",
        15,
        min=0,
        max=100,
        source=(
            "gpufleet default, provisional until calibrated: the sockets of a node have the same DIMMs and channels, "
            "so their triads differ by a few percent; a DIMM missing or a channel down on one takes its node's "
            "bandwidth down by an eighth (one of 8 channels) or more, and 15% below the nodes' median fails"
        ),
    ),
    Threshold(
        "disk_write_gbps_min",
        "number",
        None,
        min=0,
        source=DRIVES,
    ),
    Threshold(
        "disk_read_gbps_min",
        "number",
        None,
        min=0,
        source=DRIVES,
    ),
    Threshold(
        "disk_scratch_free_gib_min",
        "number",
        1,
        min=0,
        source=(
            "gpud's disk component marks a node degraded under 500 MB free (leptonai/gpud "
            "components/disk/component.go, defaultFreeSpaceThresholdBytesDegraded); gpufleet fails a scratch folder "
            "with less than 1 GiB free (and writes no test file that would leave less): a site sets what its jobs "
            "stage there"
        ),
    ),
    Threshold(
        "loader_tokens_per_s_per_gpu_min",
        "number",
        468000,
        min=0,
        source=(
            "the most a GPU of the seeds' training jobs eats: GPT-2 124M at llm.c's 468k tokens/s a GPU on 8 x H100 "
            "(the design notes' reference figures); the seeds' GPT-2 gate reached 41.5k and the LoRA fine-tune of "
            "Qwen2-7B 12.5k-14.1k (NeMo Automodel). benchmarks.host.host_loader's samples (4096 tokens from a "
            "zlib-compressed record, decoded and handed to pinned memory) under this a GPU cannot feed such a job"
        ),
    ),
)

# fmt: off
HOST_MEMORY_KEYS, SCRATCH_FREE = ("host_memory_gbps_min", "host_memory_numa_below_pct_max"), "disk_scratch_free_gib_min"

declare(
    Benchmark("host", run_tiers=("acceptance",), default=True, thresholds=THRESHOLDS, checks=(
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
               "gpufleet_host_memory_bytes_per_second", GB, of_host=True),
        Metric("disk_{direction}_gbps", "scratch drive {direction}", "GB/s", "gpufleet_disk_bytes_per_second", GB,
               words={"direction": {"write": "write", "read": "read"}}, of_host=True),
        Metric("loader_tokens_per_s_per_gpu", "data loader", "tokens/s/GPU",
               "gpufleet_loader_tokens_per_second_per_gpu", of_host=True),
    ),
)
# fmt: on

from gpufleet.benchmarks.host import host_figures  # noqa: E402, F401 (registers how the fleet reads its figures)
