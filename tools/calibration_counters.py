"""The fabric error counters' healthy rates for the calibration table (tools/calibration_table.py): per GPU model,
each GPU's (and each PCIe device's) rate as checks.counter_rates makes it, beside the limit, from

  the node stage   a clean node-run's counter snapshots before and after its benchmarks (snapshot_*, fabric_*)
  the soak         a soak document's soak_errors: each GPU's counters at the sampler's first and last read (just
                   before the soak starts and once it ended), over the soak's length

NVLink CRC counts are a GPU's links together, as the limit judges them, and, where the readings hold each link's
counts (nvlink_links), the busiest link's rate beside; NVLink replays and recoveries, whose limit is a count, are
tabulated as the count in the window.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

from gpufleet.checks.counter_rates import (
    INCREASE,
    LINK_FIELD,
    RATES,
    REPLAY_RECOVERY_KEY,
    judge_rate,
    link_growth,
    number_text,
)

TABULATED = ("nvlink_crc_data", "nvlink_crc_flit", "nvlink_replay", "nvlink_recovery", "pcie_replay", "aer_correctable")
LINK = " (busiest link)"  # the row of a counter's busiest link
LIMIT_KEYS = tuple(sorted({*(r.key for r in RATES.values()), REPLAY_RECOVERY_KEY}))


def _seconds(a: str | None, b: str | None) -> float | None:
    try:
        t = [dt.datetime.fromisoformat(x.replace("Z", "+00:00")) for x in (a, b)]  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return None
    return (t[1] - t[0]).total_seconds()


def _rates(old: dict, new: dict, seconds: float | None, out: dict, links: tuple = (None, None)) -> None:
    """Each counter of TABULATED both readings have: its rate (RATES) or its count (INCREASE) into out[counter]; with
    both readings' nvlink_links, the busiest link's rate of each NVLink CRC counter into out[counter + LINK]."""
    for counter in TABULATED:
        a, b = old.get(counter), new.get(counter)
        if not isinstance(a, int) or not isinstance(b, int) or b < a:
            continue  # unread, or reset between the reads
        if counter in INCREASE:
            out[counter].append(b - a)
        elif seconds:
            judged = judge_rate(counter, b - a, seconds, None, link_growth(*links, counter))
            out[counter].append(judged["rate"])
            if counter in LINK_FIELD and judged.get("links"):
                out[counter + LINK].append(judged["links"]["worst_rate"])


def _result(doc: dict, check: str) -> dict | None:
    return next((r for r in doc.get("results") or [] if r.get("check") == check and r.get("status") == "pass"), None)


def stage_rates(doc: dict) -> dict[str, list[float]]:
    """{counter: [a rate per GPU or device]} of one node document's snapshots before and after its benchmarks."""
    out: dict = defaultdict(list)
    for kind, key in (("snapshot", "gpus"), ("fabric", "devices")):
        before, after = _result(doc, f"{kind}_before"), _result(doc, f"{kind}_after")
        if not before or not after:
            continue
        b, a = before["detail"], after["detail"]
        seconds = _seconds(b.get("read_at"), a.get("read_at"))
        if b.get("boot_id") != a.get("boot_id"):
            continue
        ident = "uuid" if kind == "snapshot" else "id"
        olds = {x.get(ident): x for x in b.get(key) or [] if x.get("visible", True)}
        for new in a.get(key) or []:
            old = olds.get(new.get(ident))
            if old is not None and new.get("visible", True):
                links = (old.get("nvlink_links"), new.get("nvlink_links"))
                _rates(old.get("counters") or {}, new.get("counters") or {}, seconds, out, links)
    return out


def _models(doc: dict) -> dict:
    """{uuid: GPU model} from any result of the document that names its GPUs' model (soak_slowdown does; soak_errors
    does since it names them too); a document whose profile was calibrated for one model gives that one."""
    out = {}
    for res in doc.get("results") or []:
        for g in ((res.get("detail") or {}).get("per_gpu") or {}).values():
            if isinstance(g, dict) and g.get("uuid") and g.get("name"):
                out[g["uuid"]] = g["name"]
    models = ((doc.get("profile") or {}).get("calibration") or {}).get("gpu_models") or []
    return defaultdict(lambda: models[0] if len(models) == 1 else "unknown", out)


def soak_rates(doc: dict) -> dict[str, dict[str, list[float]]]:
    """{GPU model: {counter: [a rate per GPU]}} of a soak document: its soak and, where it was measured again, the
    windows measured again."""
    out: dict = defaultdict(lambda: defaultdict(list))
    res = next((r for r in doc.get("results") or [] if r.get("check") == "soak_errors"), None)
    parts = [(res or {}).get("detail") or {}]
    parts += [parts[0]["remeasured"]] if isinstance(parts[0].get("remeasured"), dict) else []
    models = _models(doc)
    for d in parts:
        seconds = d.get("ran_s")
        for g in (d.get("per_gpu") or {}).values():
            model = g.get("name") or models[g.get("uuid")]
            start, end = g.get("counters_start") or {}, g.get("counters_end") or {}
            _rates(start, end, seconds, out[model], (start.get("nvlink_links"), end.get("nvlink_links")))
    return out


def read_soaks(paths: list[Path]) -> dict[str, dict[str, list[float]]]:
    """{GPU model: {counter: [rates]}} over soak documents (.json, or .json.gz)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for model, rates in soak_rates(json.loads(text)).items():
            for counter, values in rates.items():
                out[model][counter] += values
    return out


def model_rates(docs: list[dict], soaks: dict) -> dict:
    """{"node stage" | "soak": {counter: {"n", "min", "median", "max"}}} of one model."""
    stage: dict = defaultdict(list)
    for doc in docs:
        for counter, values in stage_rates(doc).items():
            stage[counter] += values
    out = {}
    for where, rates in (("node stage", stage), ("soak", soaks)):
        out[where] = {
            c: {"n": len(v), "min": min(v), "median": statistics.median(v), "max": max(v)}
            for c in [x for t in TABULATED for x in (t, t + LINK)]
            if (v := rates.get(c))
        }
    return out


def render(rates: dict, limits: dict) -> list[str]:
    """The table's lines of one model: each counter's healthy rates where each was read, beside its limit."""
    rows = [(where, c, s) for where, by in rates.items() for c, s in by.items()]
    if not rows:
        return ["Fabric error counters: none read (no NVLink, PCIe replay or AER counts in the clean node-runs)."]
    lines = [
        "Fabric error counters: each GPU's (or PCIe device's) rate as `checks/counter_rates.py` takes it (NVLink CRC: a "
        "GPU's links together; replays and recoveries: the count in the window), in the clean node-runs' stage and in "
        "the soak documents given (`--soaks`; docs/results/calibration/README.md says how each soak ran):",
        "",
        "| counter | where | GPUs x runs | min | median | max | unit | limit |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for where, c, s in rows:
        rule = RATES.get(c.removesuffix(LINK))
        unit, key = (rule.per, rule.key) if rule else ("in the window", REPLAY_RECOVERY_KEY)
        limit = limits.get(key)
        limit = "-" if limit is None else f"{number_text(limit)} (`{key}`)"
        limit = "- (the limit is a GPU's)" if c.endswith(LINK) else limit
        lines.append(
            f"| {c} | {where} | {s['n']} | {number_text(s['min'])} | {number_text(s['median'])} | "
            f"{number_text(s['max'])} | {unit} | {limit} |"
        )
    return lines
