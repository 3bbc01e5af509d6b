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
    declare,
)

# fmt: off
declare(
    Benchmark("nccl", run_tiers=("smoke", "acceptance"), default=True, multinode=True, checks=(
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
