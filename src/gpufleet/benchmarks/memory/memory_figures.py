"""The memory benchmark's figures for the fleet: each GPU's HBM copy and PCIe copies, and their samples' spreads."""

from __future__ import annotations

from gpufleet.base.registry import registers

CHECKS = ("hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_d2h_bandwidth")
# Each figure: the part of the detail, its field there, its samples' field, the result that judges it.
PARTS = (
    ("hbm", "hbm_copy_gbps", "samples_gbps", "benchmark.hbm_bandwidth"),
    ("pcie", "h2d_gbps", "samples_h2d_gbps", "benchmark.pcie_h2d_bandwidth"),
    ("pcie", "d2h_gbps", "samples_d2h_gbps", "benchmark.pcie_d2h_bandwidth"),
)


def _mine(res: dict) -> bool:
    return res.get("group") == "benchmark" and res.get("check") in CHECKS


@registers("memory", "figures")
def figures(res: dict, fig) -> None:
    """The three results share one detail, read once, at the first of them that is no error; each judges its own
    figure's samples: every result's judgement is read."""
    first = next(
        (r for r in fig.results if _mine(r) and r.get("status") != "error" and isinstance(r.get("detail"), dict)), None
    )
    if res is not first:
        return
    detail = res.get("detail") or {}
    per = detail.get("per_gpu") if isinstance(detail.get("per_gpu"), dict) else {}
    unstable = {
        k: v
        for r in fig.results
        if _mine(r)
        for k, v in fig.unstable(r.get("detail") or {}, f"benchmark.{r['check']}").items()
    }
    for part, field, samples, source in PARTS:
        devices = per.get(part) if isinstance(per.get(part), dict) else {}
        key = field if part == "hbm" else f"pcie_{field}"
        for cuda, one in sorted(devices.items(), key=lambda kv: fig.natural(kv[0])):
            if not isinstance(one, dict) or not fig.finite(one.get(field)) or one.get("correct") is False:
                continue
            gpu = fig.gpu(cuda, one.get("uuid"))
            fig.add_gpu_figure(key, one[field], gpu, res, source, unstable)
            spread = fig.spread(one.get(samples))
            if spread:
                fig.add_spread(key, spread, gpu, source)
