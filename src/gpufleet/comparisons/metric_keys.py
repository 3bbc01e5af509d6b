"""What a metric key means, as registry.METRICS declares it: its label, unit and Prometheus family, whether it is per
GPU or shared by the run.

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
with the baseline, never node against node. metrics.py reads them out of a host document, each benchmark's own through its `figures`.
"""

from __future__ import annotations

import functools
import itertools

from gpufleet.base import registry

# The values of a metric's fields as its declaration words them (registry.METRICS), and the per-GPU keys they make.
DTYPES = tuple(next(m for m in registry.METRICS if "{dtype}" in m.key).words["dtype"])


def _keys(which) -> tuple[str, ...]:
    """The keys of the declared metrics `which` holds to, each value of each field."""
    return tuple(
        m.key.format(**dict(zip(m.words, values)))
        for m in registry.METRICS
        if which(m)
        for values in itertools.product(*m.words.values())
    )


GPU_METRICS = _keys(lambda m: m.per_gpu)
HOST_METRICS = _keys(lambda m: m.of_host)  # figures of the host's own (comparisons/trusted.py)
BANDS = tuple(registry.NCCL_BANDS.items())
BAND_TEXT = registry.BAND_WORDS


@functools.lru_cache(maxsize=512)
def describe(key: str) -> dict:
    """What a metric key means (its declaration in registry.METRICS): label (for sentences), unit, Prometheus family
    (named in base units) and labels (the key's fields), to_base (the factor from the unit to the family's base
    unit), shared, per_gpu. One dict per key, shared by every caller (a fleet asks hundreds of thousands of times):
    read it, never change it."""
    found = registry.metric(key)
    if found is None:  # a figure nobody declared: in its own unit, under the catch-all family
        return {
            "label": key,
            "unit": None,
            "family": "gpufleet_metric",
            "to_base": 1,
            "labels": {"metric": key},
            "shared": False,
            "per_gpu": False,
        }
    m, fields = found
    words = {name: m.words.get(name, {}).get(value, value) for name, value in fields.items()}
    return {
        "label": m.label.format(**words),
        "unit": m.unit,
        "family": m.family,
        "to_base": m.to_base,
        "labels": fields,
        "shared": m.shared_when is not None and fields.get(m.shared_when[0]) == m.shared_when[1],
        "per_gpu": m.per_gpu,
    }


band_of = registry.band_of
