"""fleet.sdc: a node's SDC hashes (benchmark.sdc) against every GPU of the fleet that computes under the same keys.

The voters of one computation are the GPUs whose comparable keys (model, SM count, driver, CUDA, torch, cuBLAS,
method: benchmarks/sdc/sdc_judge.py) are the same: every node of this run, and through the store the GPUs of earlier runs,
each GPU once (its newest hash; this run's wins). A hash that more than half of the voters hold, two at least,
is the majority; a GPU of this node with another hash is named and fails (class hardware). With no majority
(one GPU against one) nothing can be named: the result is `error`, inconclusive, and names the voters. GPUs of
another model or other versions are never compared: their hashes are their own group.
"""

from __future__ import annotations

from typing import Any

from gpufleet.benchmarks.sdc.sdc_judge import comparable_key, majority
from gpufleet.fleet import flagged, gpu_text
from gpufleet.comparisons.findings import fleet_result
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP

CHECK = "sdc"


def hash_rows(results: list[dict]) -> list[dict]:
    """The hashes of a node's benchmark.sdc result: [{"index", "uuid", "serial", "cuda_index", "cpu", "comparable"
    (its JSON key), "computation", "sha256"}]."""
    rows = []
    for r in results:
        if r.get("group") != "benchmark" or r.get("check") != CHECK or not isinstance(r.get("detail"), dict):
            continue
        cpu = r["detail"].get("would_be") is not None
        for d, g in (r["detail"].get("per_gpu") or {}).items():
            if (
                not isinstance(g, dict)
                or not isinstance(g.get("hashes"), dict)
                or not isinstance(g.get("comparable"), dict)
            ):
                continue
            for name, sha in g["hashes"].items():
                rows.append(
                    {
                        "index": g.get("index"),
                        "uuid": g.get("uuid"),
                        "serial": g.get("serial"),
                        "cuda_index": d,
                        "cpu": cpu,
                        "comparable": comparable_key(g["comparable"]),
                        "computation": name,
                        "sha256": sha,
                    }
                )
    return rows


def _voter(row: dict, host: str) -> str:
    """One GPU, once: by uuid where known, else its node and index (CPU processes: node and process)."""
    return row.get("uuid") or f"{host}:{row.get('index') if row.get('index') is not None else row.get('cuda_index')}"


def _votes(
    key: str, name: str, run_id: str, rows_by_host: dict[str, list[dict]], store: Any
) -> tuple[dict, str | None, list, int]:
    """(votes {voter: sha256}, the majority's hash, the voters against it, how many hold it) of one computation
    under one set of comparable keys: this run's GPUs, then the store's earlier runs."""
    votes: dict = {}
    for h, rows in rows_by_host.items():
        for r in rows:
            if (r["comparable"], r["computation"]) == (key, name):
                votes[_voter(r, h)] = r["sha256"]
    for r in store.sdc_hashes(key, name, run_id) if store is not None else []:
        votes.setdefault(_voter(r, r["host"]), r["sha256"])  # newest first: a GPU's newest hash votes
    top, others = majority(votes)
    return votes, top, others, sum(1 for v in votes.values() if v == top)


def judge(
    host: str,
    run_id: str,
    rows_by_host: dict[str, list[dict]],
    store: Any = None,
    store_note: str | None = None,
    cache: dict | None = None,
) -> dict:
    """The fleet.sdc result of `host`, from every node's hash_rows() of this run and the store's earlier runs.

    cache: a dict kept over the nodes of one run, so the votes of each computation are counted once per run, not
    once per node."""
    mine = rows_by_host.get(host) or []
    if not mine:
        return fleet_result(CHECK, SKIP, "no SDC hashes from this node (benchmark sdc did not run or gave none)")
    cpu = any(r["cpu"] for r in mine)
    findings, bad, inconclusive, compared, alone = [], {}, [], 0, set()
    cache = {} if cache is None else cache
    for key, name in dict.fromkeys((r["comparable"], r["computation"]) for r in mine):
        if (key, name) not in cache:
            cache[(key, name)] = _votes(key, name, run_id, rows_by_host, store)
        votes, top, others, top_n = cache[(key, name)]
        own = {_voter(r, host): r for r in mine if (r["comparable"], r["computation"]) == (key, name)}
        if len(votes) <= len(own):
            alone.add(name)
            continue
        compared = max(compared, len(votes))
        if top is None or top_n < 2:
            inconclusive.append(f"{name}: no majority among {len(votes)} GPUs")
            continue
        for v in others:
            if v in own:
                bad[v] = own[v]
                findings.append(
                    f"{gpu_text(own[v])} {name} sha256 {own[v]['sha256'][:12]}… against "
                    f"{top_n} of {len(votes)} GPUs {top[:12]}…"
                )
    detail = {
        "compared_gpus": compared,
        "alone": sorted(alone),
        "store": None if store is not None else store_note,
        "hashes": [{k: r[k] for k in ("index", "uuid", "computation", "sha256")} for r in mine],
    }
    if findings:
        return fleet_result(
            CHECK,
            FAIL,
            "; ".join(findings),
            cpu=cpu,
            failure_class="hardware",
            remedy="this GPU computes other bits than its identical peers: drain the node and replace the GPU",
            detail={**detail, "flagged_gpus": [flagged(r) for r in bad.values()]},
        )
    if inconclusive:
        return fleet_result(
            CHECK,
            ERROR,
            "inconclusive: " + "; ".join(inconclusive) + " with the same model and versions, one of them "
            "computes wrong bits",
            failure_class="hardware",
            detail=detail,
            remedy="run benchmark sdc on more nodes of this model and versions, so a majority can name the GPU",
        )
    if alone and not compared:
        return fleet_result(
            CHECK,
            SKIP,
            "no other GPU of this model, driver, CUDA, torch and cuBLAS version in this run or the store to "
            "compare the hashes with",
            detail=detail,
        )
    return fleet_result(
        CHECK,
        PASS,
        f"every hash of this node's GPUs is the majority's among {compared} GPUs of the same model "
        "and versions" + (f" ({', '.join(sorted(alone))}: nothing to compare with)" if alone else ""),
        cpu=cpu,
        detail=detail,
    )
