"""The fleet layer: every run remembered, every node and GPU judged against its peers, its past and a baseline.

    store.py    the SQLite store (<reports_dir>/gpufleet.db): runs, host documents, GPUs, results, metrics,
                counter snapshots, GPU flags and the baseline; an index that `rebuild()` recreates from the run folders
                (store_tables.py its tables, store_folders.py the run folders, store_baseline.py, store_queries.py)
    repair.py   a damaged or missing store moved aside and rebuilt before a run indexes into it (open_for_run), or
                when a run meets the damage while it uses the store (use_for_run)
    run_files.py  run.json and baseline.json, the files the store reads beside it and in the run folders
    metrics.py  the comparable figures of one host document (matmul per dtype, HBM, PCIe, NCCL busbw per
                collective and size band, training tokens/s), each per GPU where it is one, with its unit
                (metric_keys.py: what each key means)
    compare.py  the results of group `fleet` per node, each from its own module: peers.py (GPU against its
                node's median, node against the fleet median, sample spread), baseline.py (against the baseline
                run), counter_growth.py (counter rates, over counter_table.py), fabric_growth.py (InfiniBand port
                and PCIe AER counters as rates), fabric_peers.py (port speed and rails against the other nodes),
                returning.py (GPUs that failed before), sdc.py; thresholds.py (the node's thresholds, from its document), robust.py (median,
                MAD, one figure judged), findings.py (comparison rows, sentences, results), view.py (the
                report's fleet view), versions.py (the software and firmware table, fleet.versions, the nodes
                the NCCL run across nodes leaves out)
    export.py   a Prometheus textfile per node and the Slurm drain lines
    cli.py      `gpufleet record | history | baseline | store | versions`
                (document_writer.py: a host document written into its run folder; history_text.py)

The node side never imports this package: it runs on the controller only.
"""

from __future__ import annotations

import math
from typing import Any

GROUP = "fleet"  # group of the results this layer adds to each node
DB_NAME = "gpufleet.db"
BASELINE_FILE = "baseline.json"  # beside the store, so `store rebuild` keeps the baseline


def short_uuid(uuid: str | None) -> str | None:
    """GPU-df63b106-711b-... -> GPU-df63b106…: enough to tell GPUs apart in a sentence; detail has the whole."""
    if not uuid:
        return None
    head = uuid.split("-")
    return f"{head[0]}-{head[1]}…" if len(head) > 2 and head[0] == "GPU" else uuid


def gpu_text(gpu: dict) -> str:
    """'GPU 3 (GPU-ab12cd34…, serial 1653724058331)': the NVML index with what identifies the board."""
    index = gpu.get("index")
    name = f"GPU {index}" if index is not None else f"CUDA device {gpu.get('cuda_index')}"
    ids = [x for x in (short_uuid(gpu.get("uuid")), f"serial {gpu['serial']}" if gpu.get("serial") else None) if x]
    return f"{name} ({', '.join(ids)})" if ids else name


def flagged(gpu: dict) -> dict:
    """One entry of detail.flagged_gpus."""
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "serial": gpu.get("serial")}


def figure_text(v: Any, unit: str | None = None) -> str:
    """A figure in a sentence: 4,234 GB/s, 791.6 TFLOPS, 55.33 GB/s, 526,504 tokens/s/GPU."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        text = str(v)
    elif abs(v) >= 10000 or (isinstance(v, int) and abs(v) >= 1000):
        text = f"{v:,.0f}"
    elif abs(v) >= 100:
        text = f"{v:.1f}"
    elif abs(v) >= 1 or v == 0:
        text = f"{v:.2f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
    else:
        text = f"{v:.3g}"
    return f"{text} {unit}" if unit else text
