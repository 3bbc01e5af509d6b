"""The node's own figures held against the references its stage was handed, while it measures them.

The controller hands a node's stage, at its start, what its figures will be held against (fleet/references.py):
the baseline run's figures for this node and its GPUs, the baseline run's fleet medians, and each GPU's place
among its siblings in its earlier runs. `Held` makes every comparison a step's figures allow (each comparison
registry.py declares judged on the node, by its `rows`: each GPU against its siblings and its own past, the node
and each GPU against the baseline, the node against the baseline's fleet) with the functions the controller judges
with, and returns each figure's state in this measurement; the
step is measured again while one is past a limit for the first time or near one (measure.watched), and the
states of every measurement are kept in the step's results (confirm.RECORD) for the controller's judgement.

References, as JSON:
    {"baseline": {"run_id", "rows": [store rows: host, metric, context, value, uuid, gpu_index, cpu, unit]},
     "baseline_fleet": {"run_id", "medians": [{"metric", "context", "value", "n", "cpu", "unit"}]},
     "past": [{"uuid", "metric", "context", "below_pct": [newest first]}],
     "notes": [why a reference is missing]}
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.base import paths, registry
from gpufleet.comparisons import metrics
from gpufleet.comparisons.against import Against
from gpufleet.comparisons.baseline import baseline_index
from gpufleet.comparisons.confirm import record_key, state
from gpufleet.comparisons.thresholds import Thresholds, thresholds_for
from gpufleet.base.errors import InputError

FOLDER = "references"  # RUN_DIR/references/<host>.json: each node's, written on the controller (fleet/references.py)


def read(run_dir: Path | str, host: str) -> dict | None:
    """A node's references as its run wrote them; None when the run wrote none for it (or they cannot be read: the
    node then measures as before, and the controller judges what it could not confirm as inconclusive)."""
    return paths.read_json(Path(run_dir) / FOLDER / f"{host}.json")[0]


def checked(references: dict | None) -> dict:
    """The references as handed (gpufleet bench --references): InputError naming what is wrong."""
    if references is None:
        return {}
    if not isinstance(references, dict):
        raise InputError(f"--references: expected a JSON object (fleet/references.py), got {type(references).__name__}")
    for part, key in (("baseline", "rows"), ("baseline_fleet", "medians")):
        value = references.get(part)
        if value is not None and not (isinstance(value, dict) and isinstance(value.get(key, []), list)):
            raise InputError(f"--references: {part} must be an object with a list {key!r}")
    if not isinstance(references.get("past", []), list):
        raise InputError("--references: past must be a list of {uuid, metric, context, below_pct}")
    return references


def past_of(references: dict) -> dict[tuple, list[float]]:
    return {
        (p.get("uuid"), p.get("metric"), p.get("context")): list(p.get("below_pct") or [])
        for p in references.get("past") or []
        if isinstance(p, dict)
    }


def medians_of(references: dict) -> dict[tuple, dict]:
    return {
        (m["metric"], m["context"]): {k: m.get(k) for k in ("value", "n", "cpu", "unit")}
        for m in (references.get("baseline_fleet") or {}).get("medians") or []
        if isinstance(m, dict) and "metric" in m and "context" in m
    }


class Held:
    """A node's references, read once for every measurement of its stage."""

    def __init__(self, references: dict | None, profile: dict, gpus: list[dict], host: str | None):
        refs = checked(references)
        self.host = host or ""
        self.gpus = gpus
        self.thresholds = Thresholds(thresholds_for(profile))
        base = refs.get("baseline") or {}
        fleet = refs.get("baseline_fleet") or {}
        self.against = Against(
            past=past_of(refs),
            base_id=base.get("run_id"),
            base_index=baseline_index(base.get("rows") or []) if base.get("run_id") else None,
            fleet_id=fleet.get("run_id"),
            medians=medians_of(refs) if fleet.get("run_id") else {},
        )
        self.notes = [n for n in refs.get("notes") or [] if isinstance(n, str)]

    def summary(self) -> dict:
        """What the stage's figures were held against, as its document says it."""
        a = self.against
        return {
            "baseline": a.base_id,
            "baseline_figures": sum(len(v) for v in (a.base_index or ({}, {}))[0].values())
            + len((a.base_index or ({}, {}))[1]),
            "baseline_fleet_medians": len(a.medians),
            "past_figures": len(a.past),
            "notes": self.notes,
        }

    def text(self) -> str:
        s = self.summary()
        if not (s["baseline_figures"] or s["baseline_fleet_medians"] or s["past_figures"]):
            return "held against nothing beyond its limits: " + ("; ".join(s["notes"]) or "no references")
        return (
            f"held against baseline run {s['baseline']} ({s['baseline_figures']} figure(s) of this node, "
            f"{s['baseline_fleet_medians']} fleet median(s)) and its GPUs' past ({s['past_figures']} figure(s))"
            if s["baseline"]
            else f"held against its GPUs' past ({s['past_figures']} figure(s)); " + "; ".join(s["notes"])
        )

    def __call__(self, results: list[dict], group: str = "benchmark") -> dict[str, dict]:
        """{record_key: state} of every comparison the results' figures allow (group: benchmark, or
        benchmark_multinode for a run across nodes)."""
        node_metrics = metrics.extract([{**r, "group": group} for r in results], gpus=self.gpus)
        return {
            record_key(check.name, c): state(c)
            for check in registry.comparison_checks(registry.NODE)
            for c in registry.resolve(check.rows)(self.host, node_metrics, self.thresholds, self.against)
            if not c.get("cpu")
        }
