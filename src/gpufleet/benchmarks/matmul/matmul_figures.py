"""The matmul benchmark's figures for the fleet: each GPU's TFLOPS per dtype and its bf16 samples' spread."""

from __future__ import annotations

from gpufleet.base.registry import metric, registers

DTYPES = tuple(metric("matmul_bf16_tflops")[0].words["dtype"])  # as its declaration words them


def _best_shape_samples(per_shape, finite) -> dict | None:
    """Before benchmarks kept samples_tflops: the bf16 shape with the best median, whose samples gave the figure."""
    shapes = per_shape.get("bf16") if isinstance(per_shape, dict) else None
    good = [
        s
        for s in shapes or []
        if isinstance(s, dict) and isinstance(s.get("tflops"), dict) and finite(s["tflops"].get("median"))
    ]
    return max(good, key=lambda s: s["tflops"]["median"])["tflops"] if good else None


@registers("matmul", "figures")
def figures(res: dict, fig) -> None:
    if res.get("group") != "benchmark" or res.get("check") != "matmul_bf16":
        return
    detail = res.get("detail") or {}
    per_gpu = detail.get("per_gpu") if isinstance(detail.get("per_gpu"), dict) else {}
    per_shape = detail.get("per_shape") if isinstance(detail.get("per_shape"), dict) else {}
    source = "benchmark.matmul_bf16"
    unstable = fig.unstable(detail, source)
    for cuda, one in sorted(per_gpu.items(), key=lambda kv: fig.natural(kv[0])):
        if not isinstance(one, dict):
            continue
        gpu = fig.gpu(cuda, one.get("uuid"))
        for dtype in DTYPES:
            if fig.finite(one.get(dtype)):
                fig.add_gpu_figure(f"matmul_{dtype}_tflops", one[dtype], gpu, res, source, unstable)
        spread = fig.spread(one.get("samples_tflops")) or fig.spread(
            _best_shape_samples(per_shape.get(cuda), fig.finite)
        )
        if spread and fig.finite(one.get("bf16")):
            fig.add_spread("matmul_bf16_tflops", spread, gpu, source)
