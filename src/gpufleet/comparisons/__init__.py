"""A node's figures held against references: its GPUs against each other, its own past, the baseline run, and
the fleet. These comparisons run where the figures are judged: on the node during its stage (against the
references the controller hands it, so that a figure past a limit is measured again there before it warns or
fails) and on the controller for what only the run's other nodes can show.

    metric_keys.py  what each metric key means (label, unit, which GPU metrics exist)
    metrics.py      the comparable figures of one host document, each with its unit, GPU and context
    thresholds.py   a node's thresholds as the comparisons read them (Thresholds), the keys they read
    robust.py       median, MAD, robust z, one figure judged against its reference
    findings.py     one comparison as a row, its sentence, and the result carrying a check's comparisons
    peers.py        each GPU against its node's median; each node against the fleet median; sample spread
    baseline.py     the node and each GPU against the baseline run's figures and its fleet median
    character.py    a GPU held against its own place among its siblings in earlier runs
"""

from __future__ import annotations

import math
from typing import Any

GROUP = "fleet"  # group of the comparison results


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
