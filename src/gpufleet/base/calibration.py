"""Limits from measurement: the healthy spread measured on a GPU model gives each relative limit its default.

A calibration file, `<profile folder>/calibration/<profile>.yml` (files/profiles/calibration/ in the source
tree), is written by tools/calibration_table.py from the calibration runs (docs/results/calibration/): for each
measure and metric, the healthy spread measured (`value`, the largest of `n` figures: quantile 1.0), `n`, and the
runs it came from. `apply()` turns it into the profile's limits, per metric, with a stated margin:

    limit = the measured healthy spread x MARGIN_FACTOR + MARGIN_PCT, rounded up to half a percent

so a figure as far from its reference as the worst healthy one passes, and one half as far again warns. A
measure of fewer than MIN_N figures sets no limit of its own, but where even those few healthy figures give a
limit above the generic one (they show the generic limit too tight), that wider limit is taken: too few figures
may widen a limit, never narrow it. A relative limit of a model with no calibration (or none for that metric)
keeps the generic value and says so: `calibrated` False in its threshold.

Healthy spread depends on the node's shape as well as its GPU model (two GPUs held against each other spread
otherwise than four; NCCL's figures differ with the GPU count and the NVLink or NVSwitch shape), so a calibration
file also keeps each topology's figures (`topologies: {"2gpu": {"measures": ...}}`, topology_of()). A node is
judged on its topology's limit where the topology has MIN_N figures or more; with fewer, on its model's limit,
which the topology's few figures may widen, never narrow. Each limit's source says which it is.

    measure             what was measured on healthy GPUs (in percent)             limits it sets
    sample_drop_pct     a timed sample below its GPU's median, per figure          sample_drop_pct_max
    sample_spread_pct   (max - min) / median of a figure's samples                 fleet_sample_spread_pct_floor
    gpu_vs_node_pct     a GPU below its siblings' median (same run, same machine)  fleet_gpu_below_node_warn_pct
    node_gpu_spread_pct (max - min) / max of a node's GPUs                          matmul_spread_pct_max
    node_vs_fleet_pct   a node below the median of the run's nodes                 fleet_node_below_fleet_warn_pct
    node_vs_past_pct    a node or GPU below the median of its own earlier figures  fleet_below_baseline_warn_pct,
                                                                                   confirm_band_pct
    soak_window_pct     a soak window below its GPU's best windows                 soak_slowdown_pct_max
    numa_vs_node_pct    a NUMA node's memory triad below its siblings' median      host_memory_numa_below_pct_max
"""

from __future__ import annotations

import math
from pathlib import Path
import yaml

from gpufleet.base import paths
from gpufleet.base.errors import InputError

FORMAT = "gpufleet-calibration-limits/1"
FOLDER = "calibration"
MARGIN_FACTOR = 1.5
MARGIN_PCT = 1.0
MIN_N = 10
TABLE = "docs/results/calibration/table.md"
UNCALIBRATED = "generic: this model is not calibrated"  # said beside a relative limit no calibration set

# threshold key -> the measure its per-metric defaults come from
MEASURE_OF = {
    "sample_drop_pct_max": "sample_drop_pct",
    "fleet_sample_spread_pct_floor": "sample_spread_pct",
    "fleet_gpu_below_node_warn_pct": "gpu_vs_node_pct",
    "matmul_spread_pct_max": "node_gpu_spread_pct",
    "fleet_node_below_fleet_warn_pct": "node_vs_fleet_pct",
    "fleet_below_baseline_warn_pct": "node_vs_past_pct",
    "confirm_band_pct": "node_vs_past_pct",
    "soak_slowdown_pct_max": "soak_window_pct",
    "host_memory_numa_below_pct_max": "numa_vs_node_pct",
}
MEASURES = tuple(dict.fromkeys(MEASURE_OF.values()))
# A warn level raised by calibration lifts its fail level to at least itself: a figure never fails before it warns.
FAIL_OF = {
    "fleet_gpu_below_node_warn_pct": "fleet_gpu_below_node_fail_pct",
    "fleet_node_below_fleet_warn_pct": "fleet_node_below_fleet_fail_pct",
    "fleet_below_baseline_warn_pct": "fleet_below_baseline_fail_pct",
}


class CalibrationError(InputError):
    """A calibration file is not what was expected."""


def limit_from(measured_pct: float) -> float:
    """The limit a measured healthy spread gives (module docstring)."""
    return math.ceil((measured_pct * MARGIN_FACTOR + MARGIN_PCT) * 2) / 2


def limit_for(fig: dict, generic: float | None) -> float | None:
    """The limit a measure's figures ({"value", "n"}) give against the generic one, or None where they set none:
    too few figures can still show the generic limit too tight, so they may widen it, never narrow it."""
    value = limit_from(fig["value"])
    if fig["n"] < MIN_N and not (isinstance(generic, (int, float)) and value > generic):
        return None
    return value


def path_for(profile_path: str | Path, name: str) -> Path:
    """Where a profile's calibration lives: the calibration folder beside its profile file."""
    return Path(profile_path).parent / FOLDER / f"{name}.yml"


def load(path: Path) -> dict | None:
    """The calibration file at path, checked; None when there is none."""
    if not path.is_file():
        return None
    text, why = paths.read_text(path, follow=True)  # never waits on a FIFO
    if text is None:
        raise CalibrationError(f"calibration file {path} {why}")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CalibrationError(f"calibration file {path} cannot be read as YAML: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f"calibration file {path}: expected a mapping with format: {FORMAT}")
    _check_measures(path, doc.get("measures"), "measures")
    topologies = doc.get("topologies") or {}
    if not isinstance(topologies, dict):
        raise CalibrationError(f"calibration file {path}: 'topologies' must be a mapping of topology -> measures")
    for topology, entry in topologies.items():
        _check_measures(path, (entry or {}).get("measures"), f"topologies.{topology}.measures")
    doc["path"] = str(path)
    return doc


def _check_measures(path: Path, measures, where: str) -> None:
    if not isinstance(measures, dict):
        raise CalibrationError(f"calibration file {path}: '{where}' must be a mapping of measure -> metric -> figures")
    for measure, metrics in measures.items():
        if measure not in MEASURES:
            raise CalibrationError(
                f"calibration file {path}: unknown measure {measure!r} in {where}; expected one of {', '.join(MEASURES)}"
            )
        for metric, fig in (metrics or {}).items():
            ok = isinstance(fig, dict) and isinstance(fig.get("value"), (int, float)) and isinstance(fig.get("n"), int)
            if not ok or fig["value"] < 0 or not fig.get("source"):
                raise CalibrationError(
                    f"calibration file {path}: {where}.{measure}.{metric} needs a 'value' (percent, not "
                    "negative), an integer 'n' and a 'source' (the runs it was measured in)"
                )


def topology_of(gpus: int | None) -> str | None:
    """A node's topology as calibration keys it: its GPU count ("4gpu"). On the machines calibrated so far the count
    says the NVLink shape as well (two and four GPUs: NVLink between every pair; eight on an HGX board: NVSwitch)."""
    return f"{gpus}gpu" if gpus else None


def apply(thresholds: dict, name: str, profile_path: str | Path, topology: str | None = None) -> tuple[dict, dict]:
    """(thresholds with the calibrated keys' per-metric limits, what calibration was used). Every key of
    MEASURE_OF present gets `calibrated` and, where measured, `by_metric`: {metric: {"value", "source"}}; with a
    `topology`, each metric's limit is that topology's where it has enough figures (module docstring), and the key
    says which topology it was resolved for."""
    path = path_for(profile_path, name)
    doc = load(path)
    out = dict(thresholds)
    if doc is None:
        info = {
            "calibrated": False,
            "note": f"no calibration for profile {name} ({path} does not exist): relative limits are the generic ones",
        }
        for key in MEASURE_OF:
            if key in out:
                out[key] = {**out[key], "calibrated": False}
        return out, info
    shapes = doc.get("topologies") or {}
    for key, measure in MEASURE_OF.items():
        if key not in out:
            continue
        by_metric = {}
        generic = out[key].get("value")
        for metric, fig in sorted((doc["measures"].get(measure) or {}).items()):
            value = limit_for(fig, generic)
            if value is None:
                continue
            few = fig["n"] < MIN_N
            by_metric[metric] = {
                "value": value,
                "n": fig["n"],
                "source": (
                    f"calibration {name}: healthy {measure} up to {fig['value']:g}% over {fig['n']} figure(s) "
                    f"({fig['source']}; {doc.get('table') or TABLE}), x{MARGIN_FACTOR:g} + {MARGIN_PCT:g}"
                    + (
                        f"; fewer than {MIN_N} figures: it widens the generic {generic:g}%, never narrows it"
                        if few
                        else ""
                    )
                ),
            }
        if topology:
            mine = ((shapes.get(topology) or {}).get("measures") or {}).get(measure) or {}
            by_metric = _of_topology(by_metric, mine, generic, topology, measure, name)
        out[key] = {
            **out[key],
            "calibrated": bool(by_metric),
            **({"by_metric": by_metric} if by_metric else {}),
            **({"topology": topology} if topology else {}),
        }
        fail_key = FAIL_OF.get(key)
        if by_metric and fail_key in out and out[fail_key]["value"] is not None:
            lifted = {
                m: {
                    "value": max(out[fail_key]["value"], e["value"]),
                    "n": e["n"],
                    "source": f"at least {key} ({e['source']})",
                }
                for m, e in by_metric.items()
                if e["value"] > out[fail_key]["value"]
            }
            if lifted:
                out[fail_key] = {**out[fail_key], "by_metric": lifted}
    info = {
        "calibrated": True,
        "path": str(path),
        "table": doc.get("table") or TABLE,
        "gpu_models": doc.get("gpu_models") or [],
        "runs": doc.get("runs"),
    }
    return out, info


def _of_topology(by_metric: dict, mine: dict, generic, topology: str, measure: str, name: str) -> dict:
    """The model's per-metric limits made the topology's (module docstring): its own with MIN_N figures or more;
    else the model's (or the generic), widened by the topology's few figures where they show it too tight."""
    out = {}
    for metric in sorted(set(by_metric) | set(mine)):
        model = by_metric.get(metric)
        base = model["value"] if model else generic
        fig = mine.get(metric)
        what = (
            f"the model's {base:g}%" if model else f"the generic {base:g}%" if isinstance(base, (int, float)) else None
        )
        if fig and fig["n"] >= MIN_N:
            out[metric] = {
                "value": limit_from(fig["value"]),
                "n": fig["n"],
                "source": f"calibration {name}, topology {topology}: healthy {measure} up to {fig['value']:g}% over "
                f"{fig['n']} figure(s) ({fig['source']}), x{MARGIN_FACTOR:g} + {MARGIN_PCT:g}",
            }
        elif fig and isinstance(base, (int, float)) and limit_from(fig["value"]) > base:
            out[metric] = {
                "value": limit_from(fig["value"]),
                "n": fig["n"],
                "source": f"calibration {name}, topology {topology}: {fig['n']} healthy figure(s), fewer than {MIN_N}, "
                f"up to {fig['value']:g}% ({fig['source']}): they widen {what} to {limit_from(fig['value']):g}%, "
                "never narrow it",
            }
        elif model:
            have = f"{fig['n']} figure(s) of its own, fewer than {MIN_N}" if fig else "no figures of its own"
            out[metric] = {**model, "source": f"{model['source']}; topology {topology} has {have}: the model's limit"}
    return out


def entry(thresholds: dict, key: str, metric: str | None = None) -> dict:
    """A key's limit for one metric: {"key", "value", "source", "calibrated", "metric"} (calibrated None for a key
    no calibration sets). Where the metric has no calibrated limit, the key's own value stands."""
    base = thresholds.get(key) or {}
    own = (base.get("by_metric") or {}).get(metric) if metric else None
    calibrated = base.get("calibrated")
    if own is not None:
        return {"key": key, "value": own["value"], "source": own["source"], "calibrated": True, "metric": metric}
    return {
        "key": key,
        "value": base.get("value"),
        "source": base.get("source"),
        "calibrated": False if calibrated is not None else None,
        "metric": metric,
    }


def uncalibrated_text(limit: dict) -> str:
    """ "" for a calibrated limit or one calibration does not set; else what the reason says about it."""
    if limit.get("calibrated") is not False:
        return ""
    what = f" for {limit['metric']}" if limit.get("metric") else ""
    return (
        f"; {limit['key']} {limit['value']:g}%{what}: {UNCALIBRATED}"
        if isinstance(limit.get("value"), (int, float))
        else ""
    )
