"""The NCCL benchmark's declaration: its checks, run tiers and metrics."""

from __future__ import annotations

from gpufleet.base.registry import (
    AGAIN,
    BAND_WORDS,
    CONFIGURATION,
    GB,
    HARDWARE,
    LIMIT,
    SCOPES,
    SIBLINGS,
    SOFTWARE,
    WHOLE_RUN,
    Benchmark,
    Check,
    Metric,
    Threshold,
    declare,
)

# The profile keys its checks alone judge against, with their defaults and sources (profiles.load_all merges
# them into generic.yml's).
THRESHOLDS = (
    Threshold(
        "nccl_allreduce_busbw_gbps_min",
        "number",
        None,
        min=0,
        source="depends on GPU count and fabric",
    ),
    Threshold(
        "nccl_sendrecv_pair_ratio_min",
        "number",
        0.8,
        min=0,
        max=1,
        source="project choice; a pair under 80% of the median pair names a slow link",
    ),
)

# fmt: off
declare(
    Benchmark("nccl", run_tiers=("smoke", "acceptance"), default=True, multinode=True, thresholds=THRESHOLDS, checks=(
        Check("nccl", SOFTWARE, text="the NCCL run ended: a timeout or a crash fails, with the log's tail"),
        Check("nccl_sendrecv", HARDWARE, ("nccl_sendrecv_pair_ratio_min",), against=(SIBLINGS,), **AGAIN,
              text="send/recv bandwidth of every GPU pair: a slow pair names a slow link"),
        Check("nccl_transport", CONFIGURATION,
              text="what NCCL used between nodes: InfiniBand with GPUDirect RDMA, InfiniBand alone or sockets"),
        Check("nccl_all_reduce", HARDWARE, ("nccl_allreduce_busbw_gbps_min",), against=(LIMIT,), **AGAIN,
              text="all_reduce bus bandwidth at the largest size; every size's result checked"),
        Check("nccl_all_gather", HARDWARE, text="all_gather bus bandwidth and correctness"),
        Check("nccl_reduce_scatter", HARDWARE, text="reduce_scatter bus bandwidth and correctness"),
        Check("nccl_all_to_all", HARDWARE, text="all_to_all bus bandwidth and correctness"),
    )),
    metrics=(
        Metric("nccl_{scope}_{collective}_busbw_gbps_{band}", "{collective} busbw {scope}, {band}", "GB/s",
               "gpufleet_nccl_busbw_bytes_per_second", GB, words={"scope": SCOPES, "band": BAND_WORDS},
               shared_when=WHOLE_RUN),
        Metric("nccl_node_sendrecv_gbps", "slowest send/recv pair inside the node", "GB/s",
               "gpufleet_nccl_sendrecv_bytes_per_second", GB),
    ),
)
# fmt: on

from gpufleet.benchmarks.nccl import nccl_figures  # noqa: E402, F401 (registers how the fleet reads its figures)
