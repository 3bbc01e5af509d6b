"""What a metric key means: its label, unit and Prometheus family, whether it is per GPU or shared by the run.

Every metric is higher-is-better. Per GPU (NVML index, uuid, serial):

    matmul_<dtype>_tflops       bf16, fp16, tf32, fp8: the best shape's median (benchmark.matmul_bf16)
    hbm_copy_gbps               HBM copy, read + write (benchmark.hbm_bandwidth)
    pcie_h2d_gbps, pcie_d2h_gbps  pinned host <-> device copies (benchmark.pcie_*_bandwidth)

Per node (no GPU): each per-GPU metric again, as its slowest GPU, and

    nccl_<scope>_<collective>_busbw_gbps_<band>   busbw in one size band, scope `node` (inside the node, group
                                 benchmark) or `multinode` (across the nodes of the run, group benchmark_multinode)
    nccl_node_sendrecv_gbps      the slowest GPU pair's send/recv bandwidth
    train_gpt2_<scope>_tokens_per_s_per_gpu       the GPT-2 training gate, inside the node or across the nodes
    finetune_<scope>_tokens_per_s_per_gpu         the LoRA fine-tune
    host_memory_gbps             the host's memory triad, its slowest NUMA node (benchmark.host_memory_bandwidth)
    disk_write_gbps, disk_read_gbps   the scratch drive (benchmark.disk_*_bandwidth)
    loader_tokens_per_s_per_gpu  the data loader's tokens a second a GPU (benchmark.data_loader)

NCCL size bands: `le_1MiB` (latency-bound), `le_64MiB` (in between) and `gt_64MiB` (bandwidth-bound).

A metric of the whole run (scope `multinode`: every node records the same figure) is `shared`: it is compared
with the baseline, never node against node. metrics.py reads them out of a host document.
"""

from __future__ import annotations

import functools
import re

DTYPES = ("bf16", "fp16", "tf32", "fp8")
GPU_METRICS = tuple(f"matmul_{d}_tflops" for d in DTYPES) + ("hbm_copy_gbps", "pcie_h2d_gbps", "pcie_d2h_gbps")
BANDS = (("le_1MiB", 1 << 20), ("le_64MiB", 64 << 20), ("gt_64MiB", None))
BAND_TEXT = {
    "le_1MiB": "sizes up to 1 MiB",
    "le_64MiB": "sizes over 1 MiB up to 64 MiB",
    "gt_64MiB": "sizes over 64 MiB",
}

# The host's own figures (bench.host): key -> (label, unit, family, to_base, labels).
HOST_METRICS = {
    "host_memory_gbps": (
        "host memory triad, slowest NUMA node",
        "GB/s",
        "gpufleet_host_memory_bytes_per_second",
        1e9,
        {},
    ),
    "disk_write_gbps": ("scratch drive write", "GB/s", "gpufleet_disk_bytes_per_second", 1e9, {"direction": "write"}),
    "disk_read_gbps": ("scratch drive read", "GB/s", "gpufleet_disk_bytes_per_second", 1e9, {"direction": "read"}),
    "loader_tokens_per_s_per_gpu": ("data loader", "tokens/s/GPU", "gpufleet_loader_tokens_per_second_per_gpu", 1, {}),
}
_NCCL = re.compile(r"nccl_(node|multinode)_(\w+?)_busbw_gbps_(le_1MiB|le_64MiB|gt_64MiB)")
_TRAIN = re.compile(r"(train_gpt2|finetune)_(node|multinode)_tokens_per_s_per_gpu")


@functools.lru_cache(maxsize=512)
def describe(key: str) -> dict:
    """What a metric key means: label (for sentences), unit, Prometheus family (named in base units) and labels,
    to_base (the factor from the unit to the family's base unit), shared, per_gpu. One dict per key, shared by
    every caller (a fleet asks hundreds of thousands of times): read it, never change it."""
    m = re.fullmatch(r"matmul_(\w+)_tflops", key)
    if m:
        return {
            "label": f"{m[1]} matmul",
            "unit": "TFLOPS",
            "family": "gpufleet_matmul_flops",
            "to_base": 1e12,
            "labels": {"dtype": m[1]},
            "shared": False,
            "per_gpu": True,
        }
    if key == "hbm_copy_gbps":
        return {
            "label": "HBM copy",
            "unit": "GB/s",
            "family": "gpufleet_hbm_copy_bytes_per_second",
            "to_base": 1e9,
            "labels": {},
            "shared": False,
            "per_gpu": True,
        }
    if key in ("pcie_h2d_gbps", "pcie_d2h_gbps"):
        way = key.split("_")[1]
        return {
            "label": "PCIe host-to-device" if way == "h2d" else "PCIe device-to-host",
            "unit": "GB/s",
            "family": "gpufleet_pcie_copy_bytes_per_second",
            "to_base": 1e9,
            "labels": {"direction": way},
            "shared": False,
            "per_gpu": True,
        }
    m = _NCCL.fullmatch(key)
    if m:
        where = "inside the node" if m[1] == "node" else "across nodes"
        return {
            "label": f"{m[2]} busbw {where}, {BAND_TEXT[m[3]]}",
            "unit": "GB/s",
            "family": "gpufleet_nccl_busbw_bytes_per_second",
            "to_base": 1e9,
            "labels": {"scope": m[1], "collective": m[2], "band": m[3]},
            "shared": m[1] == "multinode",
            "per_gpu": False,
        }
    if key == "nccl_node_sendrecv_gbps":
        return {
            "label": "slowest send/recv pair inside the node",
            "unit": "GB/s",
            "family": "gpufleet_nccl_sendrecv_bytes_per_second",
            "to_base": 1e9,
            "labels": {},
            "shared": False,
            "per_gpu": False,
        }
    m = _TRAIN.fullmatch(key)
    if m:
        what = "GPT-2 training" if m[1] == "train_gpt2" else "LoRA fine-tune"
        where = "inside the node" if m[2] == "node" else "across nodes"
        family = (
            "gpufleet_train_tokens_per_second_per_gpu"
            if m[1] == "train_gpt2"
            else "gpufleet_finetune_tokens_per_second_per_gpu"
        )
        return {
            "label": f"{what} {where}",
            "unit": "tokens/s/GPU",
            "family": family,
            "to_base": 1,
            "labels": {"scope": m[2]},
            "shared": m[2] == "multinode",
            "per_gpu": False,
        }
    if key in HOST_METRICS:
        label, unit, family, to_base, labels = HOST_METRICS[key]
        return {
            "label": label,
            "unit": unit,
            "family": family,
            "to_base": to_base,
            "labels": labels,
            "shared": False,
            "per_gpu": False,
        }
    return {
        "label": key,
        "unit": None,
        "family": "gpufleet_metric",
        "to_base": 1,
        "labels": {"metric": key},
        "shared": False,
        "per_gpu": False,
    }


def band_of(size_bytes: int) -> str:
    for band, limit in BANDS:
        if limit is None or size_bytes <= limit:
            return band
    return BANDS[-1][0]
