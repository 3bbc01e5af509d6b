"""A quick benchmark's figures judged from their samples and what the step's sampler saw (judge.samples), and
each figure's 95% interval, so that measure.watched measures again only a figure close to its limit.

A figure's samples are judged together: one low sample with nothing seen then is this platform's normal and
stands (`isolated`); samples that fell while the sampler saw a cause on that GPU (a foreign process, a hardware
or thermal slowdown, PCIe replays) are `disturbed`; more or deeper falls with no cause seen `fell`. Either of the
last two means the figure is not yet the node's: the result warns and asks to be measured again, and names as
suspects every other process the GPU and host watches saw meanwhile, under their limits or over (checks.suspects).
"""

from __future__ import annotations

from gpufleet.base import calibration, judge, profiles
from gpufleet.base.numbers import significant
from gpufleet.base.schema import PASS, WARN
from gpufleet.checks import suspects

SAMPLE_KEY = "sample_drop_pct_max"
NOT_THE_FIGURE = (judge.FELL, judge.DISTURBED)


def causes(monitor: dict, index: int | None) -> list[dict]:
    """What the step's sampler saw on one GPU (NVML index) that can pull samples down: [{"what", "t_s": [from, to]
    in seconds since the sampler started, or None (some moment of the step), "foreign": True for another process's
    work}]; the host's neighbours (index None: bench.host_watch) are every GPU's."""
    if index is None:
        return []
    g = (monitor.get("per_gpu") or {}).get(str(index)) or {}
    out = list(g.get("causes") or [])
    if "causes" not in g:  # a sampler that kept no times: the reasons it saw at some moment of the step
        # (their NVML names: the controller replays documents without the node's readers)
        out += [{"what": n.replace("_", " "), "t_s": None} for n in g.get("throttled") or []]
    out += [
        {
            "what": p.get("label") or f"pid {p['pid']} ({p.get('name') or 'name unknown'})",
            "t_s": [p.get("first_s"), p.get("last_s")],
            "foreign": True,
        }
        for p in monitor.get("foreign") or []
        if p.get("index") in (index, None)
    ]
    return out


def _values(samples: dict) -> tuple[list[float], bool]:
    """(every timed sample, True) where the benchmark kept them; else (the min and n - 1 medians, False): an older
    document says only that its lowest sample fell, not how many did."""
    if isinstance(samples.get("values"), list) and samples["values"]:
        return [float(v) for v in samples["values"]], True
    n = samples.get("n") or 2
    return [float(samples["min"])] + [float(samples["median"])] * max(1, n - 1), False


def judged(figures: list, profile: dict, monitor: dict) -> list[dict]:
    """[(gpu {"index", "uuid", ...}, metric key, label, unit, samples summary)] -> one judgement per figure with
    samples: {"gpu", "metric", "figure", "unit", "n", "median", "min", "verdict", "low", "deepest_pct", "causes",
    "every_sample" (False: judged from the summary), "interval" (95% of the median, or None), "limit"}."""
    allowed = profiles.value(profile, "sample_drops_allowed")
    started = monitor.get("started_monotonic")
    out = []
    for gpu, metric, label, unit, samples in figures:
        if not isinstance(samples, dict) or not samples.get("median"):
            continue
        limit = calibration.entry(profile["thresholds"], SAMPLE_KEY, metric)
        values, every = _values(samples)
        ends = samples.get("ends_s")
        ends = [e - started for e in ends] if ends and started is not None and len(ends) == len(values) else None
        verdict = judge.samples(
            values,
            limit["value"],
            allowed=1 if allowed is None else allowed,
            causes=causes(monitor, gpu.get("index")),
            ends_s=ends,
        )
        out.append(
            {
                "gpu": gpu,
                "metric": metric,
                "figure": label,
                "unit": unit,
                "n": samples.get("n"),
                "median": significant(samples["median"]),
                "min": significant(samples["min"]),
                "verdict": verdict["verdict"],
                "low": len(verdict["low"]),
                "deepest_pct": verdict["deepest_pct"],
                "causes": verdict["causes"],
                "every_sample": every,
                "interval": judge.median_interval(values) if every else None,
                "limit": limit,
                # who was there while a figure not yet the node's was measured, under the limits or over them
                **(
                    {"suspects": suspects.of(monitor, gpu.get("index"))} if verdict["verdict"] in NOT_THE_FIGURE else {}
                ),
            }
        )
    return out


def _who(j: dict) -> str:
    index, uuid = j["gpu"].get("index"), j["gpu"].get("uuid")
    name = f"GPU {index}" if index is not None else f"{uuid[:12]}…" if uuid else "GPU ?"
    return f"{name} {j['figure']}"


def _text(j: dict) -> str:
    lim = j["limit"]["value"]
    base = (
        f"{_who(j)}: {j['low']} of {j['n']} samples more than {lim:g}% below its median {j['median']:g} "
        f"{j['unit']} (lowest {j['min']:g}, {j['deepest_pct']:g}% below)"
    )
    seen = j.get("suspects") or []
    if j["verdict"] == judge.DISTURBED:
        return (
            base
            + "; the sampler saw then: "
            + ", ".join(c["what"] for c in j["causes"])
            + (f"; {suspects.text(seen)}" if suspects.under(seen) else "")
        )
    if j["verdict"] == judge.ISOLATED:
        return base + ", nothing seen then: one low sample is not a disturbance"
    return base + f", with nothing seen on the GPU then; {suspects.text(seen)}"


def with_samples(res: dict, figures: list[dict], flagged: list, profile: dict, metric: str) -> tuple[dict, list]:
    """The result with its samples' judgement: an isolated low sample is noted in a passing reason; samples that
    fell or were disturbed make a passing result warn, its figure not yet the node's (measured again: measure.watched,
    detail.measure_again). Returns (result, the GPUs it flags)."""
    brief = [{**{k: v for k, v in j.items() if k != "limit"}, "limit": j["limit"]["value"]} for j in figures]
    detail = {
        **res["detail"],
        "samples_judged": brief,
        "sample_drop_threshold": calibration.entry(profile["thresholds"], SAMPLE_KEY, metric),
    }
    bad = [j for j in figures if j["verdict"] in NOT_THE_FIGURE]
    isolated = [j for j in figures if j["verdict"] == judge.ISOLATED]
    if bad:  # whatever the status, this figure is not the node's yet: measured again
        detail = {**detail, "measure_again": "samples fell: " + "; ".join(_who(j) for j in bad)}
    if bad and res["status"] == PASS:
        caused = [j for j in bad if j["verdict"] == judge.DISTURBED]
        out = res.replace(
            status=WARN,
            detail=detail,
            reason=f"{res['reason']}, but the figure is not yet the node's: "
            + "; ".join(_text(j) for j in bad)
            + calibration.uncalibrated_text(bad[0]["limit"]),
            remedy=(
                "another process or a slowdown pulled the samples down: it is measured again; see what the "
                "sampler saw in detail.monitor (processes, clock event reasons, PCIe replays)"
                if caused
                else "the samples fell with nothing seen on the GPU: it is measured again; should it stay so, run "
                "the benchmark alone on the node (gpufleet bench) and compare detail.monitor with a quiet "
                "node's"
            ),
            failure_class="hardware" if any(_hardware(j) for j in caused) else "environment",
        )
        return out, [j["gpu"] for j in bad]
    if isolated and res["status"] == PASS:
        return res.replace(detail=detail, reason=f"{res['reason']}; " + "; ".join(_text(j) for j in isolated)), flagged
    return res.replace(detail=detail), flagged


def _hardware(j: dict) -> bool:
    return any(not c.get("foreign") for c in j["causes"])


def near_limit(res: dict, figures: list[dict], value_key: str, profile: dict, metric: str) -> dict:
    """detail.measure_again where the slowest figure's 95% interval reaches across its minimum (value_key): one
    more measurement could change the verdict. A figure kept without its samples has no interval: it counts as
    close within confirm_band_pct of the minimum. A figure clear of it on one side costs no extra time."""
    limit = (res.get("threshold") or {}).get("value")
    if limit is None or res.get("value") is None or "measure_again" in res["detail"] or not figures:
        return res
    slow = min(figures, key=lambda j: j["median"])
    if slow["interval"]:
        interval, how = slow["interval"], "its 95% interval"
    else:
        band = calibration.entry(profile["thresholds"], "confirm_band_pct", metric)
        if band["value"] is None:
            return res
        interval = (res["value"] * (1 - band["value"] / 100), res["value"] * (1 + band["value"] / 100))
        how = f"within confirm_band_pct {band['value']:g}% of it (no samples kept to give an interval:"
    j = judge.judge(res["value"], judge.Limit(value_key, limit, kind=judge.MIN), interval=interval)
    if not j.near:
        return res
    lo, hi = interval
    why = (
        f"{_who(slow)} {res['value']:g} {slow['unit']}: {how} {significant(lo):g} to {significant(hi):g}"
        f"{')' if not slow['interval'] else ''} reaches across the minimum {limit:g}"
    )
    return res.replace(detail={**res["detail"], "measure_again": why})
