"""A site's own workloads judged (benchmarks/workloads/workloads_measure.py measured them): each run's figure against the figure the site's
guide promises (`expected`, its source beside it), and its figure a GPU on more GPUs against its own one-GPU figure.

`workload`: a run more than below_expected_pct_max under its expected figure fails, naming the workload, the GPU
count, the figure, the promise and its source; a run that did not end or printed no figure is an `error`; a figure
with no expected value warns. Its value is the figure of the run furthest under its promise. `workload_scaling`: for
each workload with a one-GPU run, the figure a GPU at N GPUs over the one-GPU figure (per_gpu = figure / N) against
scaling_efficiency_min. Both are measured again (measure.watched) before they fail: `again` runs the runs past
or near a limit once more, `combined` judges those runs' new figures with the others as they were.
"""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import profiles
from gpufleet.base.judge import below_pct
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, WARN, result, worst

BELOW_KEY, SCALING_KEY = "workload_below_expected_pct_max", "workload_scaling_efficiency_min"
NONE_DECLARED = "the profile declares no workload of the site's (docs/workloads.md: a site adds its own)"
SLOW_REMEDY = (
    "compare the run's log (detail.workloads[].runs[].log_tail) and the CPUs it had (detail.cpu_allocation) with "
    "the guide's; then the node's own benchmarks of the same run (matmul, memory, nccl, host) for the part that is slow"
)


def _declared(out: dict) -> dict:
    return {w["name"]: w for w in out.get("declared") or []}


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def rows(out: dict, profile: dict) -> list[dict]:
    """One row a run: the workload, the GPU count, its figure beside the guide's promise, and what it is judged."""
    declared, table = _declared(out), []
    for wl in out.get("workloads") or []:
        w = declared.get(wl["name"]) or {}
        unit = (w.get("figure") or {}).get("unit", "")
        tolerance = w.get("below_expected_pct_max")
        tolerance = profiles.value(profile, BELOW_KEY) if tolerance is None else tolerance
        for r in wl["runs"]:
            promise = (w.get("expected") or {}).get(r["gpus"]) or {}
            row = {
                "workload": wl["name"], "gpus": r["gpus"], "gpu_count": r.get("gpu_count"), "figure": r.get("figure"),
                "unit": unit, "expected": promise.get("value"), "expected_source": promise.get("source"),
                "below_expected_pct_max": tolerance, "error": r.get("error"), "cpu": out.get("device") == "cpu",
            }  # fmt: skip
            if r.get("figure") is not None and promise.get("value"):
                row["below_pct"] = round(below_pct(r["figure"], promise["value"]), 2)
                row["status"] = FAIL if tolerance is not None and row["below_pct"] > tolerance else PASS
            else:
                row["status"] = ERROR if r.get("error") else WARN
            table.append(row)
    return table


def _line(row: dict) -> str:
    where = f"workload {row['workload']} on {row['gpu_count']} {'CPU process(es)' if row['cpu'] else 'GPU(s)'}"
    if row["status"] == ERROR:
        return f"{where}: {row['error']}"
    figure = f"{_fmt(row['figure'])} {row['unit']}"
    if row["expected"] is None:
        return f"{where}: {figure}, no expected figure set ({row['expected_source']})"
    promise = f"the expected {_fmt(row['expected'])} {row['unit']} ({row['expected_source']})"
    if row["status"] == FAIL:
        return (
            f"{where}: {figure} is {row['below_pct']:g}% under {promise}, more than {row['below_expected_pct_max']:g}%"
        )
    return f"{where}: {figure} against {promise}"


def workload(out: dict, profile: dict) -> dict:
    table = rows(out, profile)
    threshold = profiles.threshold(profile, BELOW_KEY)
    detail = {"workloads": out.get("workloads"), "rows": table, "cpu_allocation": out.get("cpu_allocation"),
              "method": out.get("method")}  # fmt: skip
    if not table:
        return result("workload", SKIP, NONE_DECLARED, threshold=threshold, detail=detail)
    status = worst((r["status"] for r in table), PASS)
    shown = [r for r in table if r["status"] == status] if status != PASS else table
    furthest = max((r for r in table if "below_pct" in r), key=lambda r: r["below_pct"], default=None)
    return result(
        "workload",
        status,
        "; ".join(_line(r) for r in shown),
        value=furthest["figure"] if furthest else None,
        unit=furthest["unit"] if furthest else None,
        threshold=threshold,
        remedy={
            FAIL: SLOW_REMEDY,
            WARN: "measure the workload on a healthy node and set its `expected` figure in the site's profile",
            ERROR: "read the run's log tail (detail.workloads[].runs[].log_tail); a workload that cannot run here "
            "cannot be accepted by it",
        }.get(status),
        detail=detail,
    )


def scaling(out: dict, profile: dict) -> dict:
    declared, lines, status, table, ratios = _declared(out), [], PASS, [], []
    cpu = out.get("device") == "cpu"
    for wl in out.get("workloads") or []:
        w = declared.get(wl["name"]) or {}
        floor = w["scaling_efficiency_min"] if "scaling_efficiency_min" in w else profiles.value(profile, SCALING_KEY)
        one = next((r for r in wl["runs"] if r.get("gpu_count") == 1 and r.get("figure")), None)
        for r in wl["runs"]:
            if one is None or r is one or not r.get("figure") or r["gpu_count"] <= 1 or floor is None:
                continue
            ratio = round(r["figure"] / r["gpu_count"] / one["figure"], 3)
            ok = ratio >= floor
            table.append({"workload": wl["name"], "gpus": r["gpu_count"], "per_gpu_over_one": ratio, "min": floor})
            ratios.append(ratio)
            status = status if ok else FAIL
            lines.append(
                f"workload {wl['name']}: a {'process' if cpu else 'GPU'} of {r['gpu_count']} gives {ratio:.0%} of its "
                f"one-{'process' if cpu else 'GPU'} figure" + ("" if ok else f", under the minimum {floor:.0%}")
            )
    threshold = profiles.threshold(profile, SCALING_KEY)
    if not table:
        why = NONE_DECLARED if not out.get("workloads") else "no workload ran at one GPU and more with figures at both"
        return result("workload_scaling", SKIP, why, threshold=threshold, detail={"rows": table})
    return result(
        "workload_scaling",
        status,
        "; ".join(lines),
        value=min(ratios),
        unit="ratio",
        threshold=threshold,
        remedy=SLOW_REMEDY if status == FAIL else None,
        detail={"rows": table},
    )


@registers("workloads", "judge")
def judge(out: dict, profile: dict) -> list[dict]:
    return [workload(out, profile), scaling(out, profile)]


@registers("workloads", "again")
def again(first: dict, profile: dict) -> dict:
    """The runs to measure again: those past their promise or with no figure, and every run of a workload whose
    scaling fell short (both of its counts)."""
    table = rows(first, profile)
    only = [[r["workload"], r["gpus"]] for r in table if r["status"] in (FAIL, ERROR)]
    short = {
        row["workload"] for row in scaling(first, profile)["detail"]["rows"] if row["per_gpu_over_one"] < row["min"]
    }
    only += [
        [r["workload"], r["gpus"]] for r in table if r["workload"] in short and [r["workload"], r["gpus"]] not in only
    ]
    return {"only": only or [[r["workload"], r["gpus"]] for r in table]}


@registers("workloads", "combine")
def combined(first: dict, later: dict, profile: dict) -> dict:
    """The first measurement with the runs measured again in their place."""
    new = {(wl["name"], r["gpus"]): r for wl in later.get("workloads") or [] for r in wl["runs"]}
    merged = [
        {**wl, "runs": [new.get((wl["name"], r["gpus"]), r) for r in wl["runs"]]} for wl in first.get("workloads") or []
    ]
    return {**first, "workloads": merged, "monitor": later.get("monitor", first.get("monitor"))}
