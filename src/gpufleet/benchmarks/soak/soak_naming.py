"""Who and when a soak's reasons name: each soak process's GPU (NVML index, uuid, serial), the time in UTC and
from the soak's start, and the GPUs behind each status for detail.flagged_gpus."""

from __future__ import annotations

import time

from gpufleet.checks.benchmarks import flag_gpus


def soak_when(out: dict, t_s: float | None, prep: str = "at") -> str:
    """ "at 2026-11-23T10:12:31Z (751 s into the soak)": the time in UTC and from the soak's start."""
    if t_s is None:
        return "at an unknown time"
    start = out.get("started_epoch")
    if start is None:
        return f"{prep} {t_s:.0f} s into the soak"
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + t_s))
    return f"{prep} {utc} ({t_s:.0f} s into the soak)"


class SoakGpus:
    """Who each soak process loaded: NVML index, uuid, serial, and the label a reason gives it."""

    def __init__(self, out: dict):
        self.cpu = out["device"] == "cpu"
        sampler = (out.get("sampler") or {}).get("per_gpu") or {}
        self.by_rank = {}
        for rank, g in (out.get("gpus") or {}).items():
            index = g.get("nvml_index")
            serial = (sampler.get(str(index)) or {}).get("serial") if index is not None else None
            self.by_rank[rank] = {"index": index, "uuid": g.get("uuid"), "serial": serial}
        self.by_index = {
            str(i): {"index": int(i), "uuid": g.get("uuid"), "serial": g.get("serial")} for i, g in sampler.items()
        }

    def label(self, rank: str) -> tuple[int | None, str]:
        """(NVML index for Findings, or None with the label written into the text)."""
        if self.cpu:
            return None, f"process {rank}: "
        index = self.by_rank.get(rank, {}).get("index")
        return (index, "") if index is not None else (None, f"CUDA device {rank}: ")


class Flags:
    """GPUs behind each status, to name them in detail.flagged_gpus (the worst status's)."""

    def __init__(self):
        self.by_status: dict[str, list] = {}

    def add(self, status: str, gpu: dict | None) -> None:
        if gpu:
            self.by_status.setdefault(status, []).append(gpu)

    def apply(self, res: dict) -> dict:
        res.get("detail", {}).pop("flagged_gpus", None)  # Findings' own has no uuid for these indices
        return flag_gpus(res, self.by_status.get(res["status"], []))
