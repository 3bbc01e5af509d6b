"""Figures as every layer writes them: significant digits, and model FLOPs utilization (MFU)."""

from __future__ import annotations


def significant(x: float, digits: int = 4) -> float:
    """Round to significant digits: 791.2 TFLOPS on a GPU, 0.01234 on a CPU run."""
    return float(f"{x:.{digits}g}")


def mfu(tokens_per_s_per_gpu: float | None, flops_per_token: float | None, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilization: the model's FLOPs a second per GPU over the GPU's dense peak (PaLM, appendix B:
    FLOPs per token 6N + 12LHQT); None when a figure is missing."""
    if not peak_tflops or not tokens_per_s_per_gpu or not flops_per_token:
        return None
    return flops_per_token * tokens_per_s_per_gpu / (peak_tflops * 1e12)
