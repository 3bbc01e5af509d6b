"""The soak's judgement (gpufleet.benchmarks.soak.soak_measure.run()'s output): soak() here gives soak_throttle, soak_errors and
soak_slowdown, each naming the GPU and the time it happened; each check in a file of its own:

    throttle.py      soak_throttle: hardware and thermal slowdown events
    error_events.py  soak_errors: a load that stopped, wrong all_reduce results, counters that moved, Xid events
    slowdown.py      soak_slowdown: windows below the GPU's best windows and below its siblings
    naming.py        who and when the reasons name (each process's GPU, the time), the GPUs behind each status
    remeasure.py     a soak measured again in part: its disturbed or slowed windows, the plan, the combined output
"""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import schema
from gpufleet.checks.benchmarks import flag_gpus
from gpufleet.benchmarks.soak.soak_error_events import soak_errors
from gpufleet.benchmarks.soak.soak_naming import SoakGpus
from gpufleet.benchmarks.soak.soak_slowdown import soak_slowdown
from gpufleet.benchmarks.soak.soak_throttle import soak_throttle
from gpufleet.base.schema import FAIL, PASS, result


@registers("soak", "judge")
def soak(out: dict, profile: dict) -> list[dict]:
    """The soak's verdict: soak_throttle, soak_errors and soak_slowdown, each naming the GPU and the time.

    A soak that could not start is one `soak` result (fail). On the CPU (no CUDA) only a process that
    failed or an all_reduce that gave wrong results counts; the rest is `skip`, not a performance figure.
    A soak measured again in part (remeasure.combined()) is judged as one soak: soak_slowdown over the first soak's
    clean windows and the re-measure's after its warm-up, together; soak_throttle and soak_errors over both parts'
    events, each the worse of the two.
    """
    if out.get("remeasured") is not None:
        return _both(out, profile)
    return _one(out, profile)


def _both(out: dict, profile: dict) -> list[dict]:
    first = {k: v for k, v in out.items() if k != "remeasured"}
    again = out["remeasured"]
    apart = [
        f"windows {', '.join(str(w) for w in out.get(key) or [])} {what}"
        for key, what in (("disturbed_windows", "disturbed"), ("slowed_windows", "slowed past a limit"))
        if out.get(key)
    ]
    head = (
        f"the soak ({first.get('ran_s'):g} s; "
        + ("; ".join(apart) + ", their figures kept apart" if apart else "no window kept apart")
        + ")",
        f"those windows measured again ({again.get('ran_s'):g} s)",
    )
    mine = {r["check"]: r for r in _one(first, profile)}
    # The slowdown of the re-measure's windows is judged among the soak's (first holds them): not on their own.
    theirs = {r["check"]: r for r in _one(again, profile) if r["check"] != "soak_slowdown"}
    results = []
    for check in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(check), theirs.get(check)
        if a is None or b is None:
            one = a or b
            if check == "soak_slowdown" and one is a:
                one = one.replace(
                    reason=f"{head[0]}, its windows measured again after a warm-up window judged with the others: "
                    + one["reason"],
                    detail={**one["detail"], **_apart(out)},
                )
            results.append(one)
            continue
        worse = b if schema.severity(b["status"]) > schema.severity(a["status"]) else a
        remedy = "; ".join(
            dict.fromkeys(r["remedy"] for r in (a, b) if r.get("remedy") and r["status"] not in (PASS, schema.SKIP))
        )
        flagged = [g for r in (a, b) if r["status"] == worse["status"] for g in r["detail"].get("flagged_gpus") or []]
        values = [r["value"] for r in (a, b) if isinstance(r.get("value"), (int, float))]
        detail = {**a["detail"], "remeasured": b["detail"], **_apart(out)}
        detail.pop("flagged_gpus", None)
        res = result(
            check,
            worse["status"],
            f"{head[0]}: {a['reason']}; {head[1]}: {b['reason']}",
            value=max(values) if values else None,
            unit=worse.get("unit"),
            threshold=worse.get("threshold"),
            remedy=remedy or None,
            detail=detail,
        )
        results.append(flag_gpus(res, flagged))
    return results


def _apart(out: dict) -> dict:
    return {k: out.get(k) for k in ("disturbed_windows", "slowed_windows") if k in out}


def _one(out: dict, profile: dict) -> list[dict]:
    cpu = out["device"] == "cpu"
    base = {
        k: out.get(k)
        for k in (
            "method",
            "versions",
            "started",
            "duration_s",
            "ran_s",
            "window_s",
            "n_windows",
            "world_size",
            "stopped_early",
            "stop_reason",
            "after_effects",
        )
    }
    if out.get("setup_error"):
        return [
            result(
                "soak",
                FAIL,
                f"soak could not start: {out['setup_error']}",
                detail=base,
                remedy="read the error: a GPU that cannot hold a sustained load (out of memory beside another "
                "process, a CUDA or NCCL error) is not fit for training; run gpu_health",
            )
        ]
    gpus = SoakGpus(out)
    return [
        soak_throttle(out, profile, base, gpus, cpu),
        soak_errors(out, profile, base, gpus, cpu),
        soak_slowdown(out, profile, base, gpus, cpu),
    ]
