"""The files of a localisation in a run folder, around the planning of gpufleet.fleet.locate.

    <run_dir>/locate.json                       the state (fleet/locate.py): nodes, method, threshold, every
                                                round with its groups and figures, the next round, the findings
    <run_dir>/locate/round-<k>/<host>.json      what each node of round k reported (locate.yml writes them):
                                                {"host", "round", "members", "results": [benchmark results],
                                                 "error": null or why the run did not finish on the node}

`step()` is what the controller module gpufleet.cluster.locate_step runs between the rounds: start (a new
state, round 1 planned) or record (read round k's files, judge it, plan round k + 1 or conclude).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpufleet.base import paths, profiles, schema
from gpufleet.base.errors import InputError
from gpufleet.fleet import locate
from gpufleet.runner.record import read_json

STATE_FILE = "locate.json"
ROUNDS_DIR = "locate"


def _ratio(ratio: float | None, thresholds: dict | None) -> tuple[float, str]:
    """The slow-group ratio and its source: the option, else gpufleet_thresholds, else generic.yml."""
    if ratio is not None:
        return float(ratio), "option (gpufleet_locate_ratio / --ratio)"
    # Only this key of gpufleet_thresholds matters here; the nodes' engines judge the others.
    prof = profiles.resolve(
        None,
        profile_name=profiles.GENERIC,
        overrides={k: v for k, v in (thresholds or {}).items() if k == locate.RATIO_KEY},
    )
    entry = prof["thresholds"].get(locate.RATIO_KEY)
    if entry is None or entry["value"] is None:
        return locate.DEFAULT_RATIO, "gpufleet default"
    return float(entry["value"]), entry["source"]


def figure_of(docs: dict[str, dict | None], members: list[str]) -> dict:
    """A group's figure from its members' round files: busbw of the largest all-reduce, or why there is none."""
    missing = [m for m in members if docs.get(m) is None]
    if missing:
        return {
            "busbw_gbps": None,
            "size_bytes": None,
            "status": "failed",
            "reason": f"no result from {', '.join(missing)}: the run did not finish there",
        }
    why = []
    for m in members:
        doc = docs[m]
        if doc.get("error"):
            why.append(f"{m}: {doc['error']}"[:300])
        why += [
            f"{m}: {r.get('reason')}"[:300]
            for r in doc.get("results") or []
            if r.get("check") == "nccl" and r.get("status") in (schema.FAIL, schema.ERROR)
        ]
    if why:
        return {"busbw_gbps": None, "size_bytes": None, "status": "failed", "reason": "; ".join(why)}
    for m in members:
        for r in docs[m].get("results") or []:
            value = r.get("value")
            if r.get("check") == "nccl_all_reduce" and isinstance(value, (int, float)) and not isinstance(value, bool):
                rows = (r.get("detail") or {}).get("rows") or []
                sizes = [row.get("size_bytes") for row in rows if "busbw_gbps" in row]
                return {
                    "busbw_gbps": float(value),
                    "size_bytes": max(sizes) if sizes else None,
                    "status": "ok",
                    "reason": None,
                    "device": "cpu" if "not a performance figure" in (r.get("reason") or "") else None,
                }
    return {
        "busbw_gbps": None,
        "size_bytes": None,
        "status": "failed",
        "reason": f"no all_reduce figure from {', '.join(members)}",
    }


def step(
    run_dir: Path,
    *,
    start: bool = False,
    nodes: list[str] | None = None,
    left_out: dict | None = None,
    method: str = "auto",
    ratio: float | None = None,
    thresholds: dict | None = None,
    pair_rounds: int | None = None,
    max_rounds: int | None = None,
    reference_gbps: float | None = None,
    base_port: int | None = None,
) -> dict:
    """Start a localisation or record the round just run; write locate.json; return the state."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run folder {run_dir} does not exist; expected the run's folder (run_start makes it)")
    state_path = run_dir / STATE_FILE
    if start:
        for n in nodes or []:
            paths.safe_name(n, "a node name")
        value, source = _ratio(ratio, thresholds)
        if len(nodes or []) < 2:
            state = _too_few(list(nodes or []), dict(left_out or {}), method, value, source)
            paths.write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n")
            return state
        try:
            state = locate.start(
                list(nodes or []),
                method=method,
                ratio=value,
                ratio_source=source,
                reference_gbps=reference_gbps,
                pair_rounds=pair_rounds or 1,
                max_rounds=max_rounds,
                base_port=base_port or locate.DEFAULT_BASE_PORT,
            )
        except ValueError as exc:
            raise InputError(f"locate: {exc}") from None
        state["started"] = schema.utc_now()
        state["left_out"] = dict(left_out or {})
        # A new localisation: the round files of an earlier one in this run folder go.
        shutil.rmtree(run_dir / ROUNDS_DIR, ignore_errors=True)
    else:
        state, why = read_json(state_path)
        if state is None:
            raise InputError(f"{state_path} {why or 'does not exist'}; start the localisation first (start=true)")
        if state.get("done"):
            return state
        k = state["next"]["round"]
        round_dir = run_dir / ROUNDS_DIR / f"round-{k}"
        docs: dict[str, dict | None] = {}
        for g in state["next"]["groups"]:
            for m in g["members"]:
                docs[m], _ = read_json(round_dir / f"{m}.json")
        figures = [figure_of(docs, g["members"]) for g in state["next"]["groups"]]
        state = locate.record_round(state, figures)
        if any(f.get("device") == "cpu" for f in figures):
            state["device"] = "cpu"
            state["note"] = "gloo on the CPU: the figures are not performance figures; the logic is the same"
    if state.get("done"):
        state["ended"] = schema.utc_now()
    paths.write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n")
    return state


def _too_few(nodes: list[str], left_out: dict, method: str, ratio: float, source: str) -> dict:
    """No round can run: fewer than two nodes could take part."""
    out = "; ".join(f"{h}: {why}" for h, why in left_out.items()) or "none"
    return {
        "schema_version": locate.SCHEMA_VERSION,
        "nodes": nodes,
        "method": method,
        "method_asked": method,
        "metric": locate.METRIC,
        "threshold": {"key": locate.RATIO_KEY, "value": ratio, "source": source},
        "rounds": [],
        "done": True,
        "next": None,
        "known_good": [],
        "suspects": [],
        "left_out": left_out,
        "findings": [],
        "notes": [],
        "verdict": "inconclusive",
        "started": schema.utc_now(),
        "ended": schema.utc_now(),
        "summary": f"no localisation: it needs two nodes and {len(nodes)} could take part ({', '.join(nodes) or 'none'}); "
        f"left out: {out}",
    }


class Progress:
    """What a node does in the localisation now, from locate.json (read again only when it changed)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / STATE_FILE
        self.mtime = None
        self.state: dict | None = None

    def __call__(self, host: str) -> str | None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return None
        if mtime != self.mtime:
            self.state, _ = read_json(self.path)
            self.mtime = mtime
        state = self.state or {}
        nxt = state.get("next")
        if state.get("done") or not nxt:
            return "done" if state.get("done") else None
        for g in nxt.get("groups") or []:
            if host in g.get("members", []):
                others = [m for m in g["members"] if m != host]
                return f"round {nxt['round']}: with {', '.join(others)}"
        return f"round {nxt['round']}: not in it"


def step_summary(state: dict, run_dir: Path) -> dict:
    """What the module returns: whether it is done, the next round, and the findings."""
    nxt = state.get("next") or {}
    return {
        "done": bool(state.get("done")),
        "round": nxt.get("round"),
        "groups": nxt.get("groups") or [],
        "verdict": state.get("verdict"),
        "summary": state.get("summary"),
        "findings": state.get("findings") or [],
        "method": state.get("method"),
        "rounds_run": len(state.get("rounds") or []),
        "max_rounds": state.get("max_rounds"),
        "left_out": state.get("left_out") or {},
        "locate_json": str(Path(run_dir) / STATE_FILE),
    }
