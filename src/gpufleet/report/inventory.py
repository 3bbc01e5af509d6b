"""Each GPU of a node as an RMA desk asks for it: index, UUID, serial, PCI bus id, VBIOS and InfoROM, its ECC counts and
remapped rows, and whether a finding names it.

gpu_rows(node) reads the node's results: the inventory (gpu_inventory.gpu_count's detail.inventory), the health
checks' per-GPU readings (gpu_health.ecc, gpu_health.row_remapping), else the counter snapshot after the benchmarks
(counters.snapshot_after), and the InfoROM from the node's versions (NVML order). A value no check read is None.
"""

from __future__ import annotations

from gpufleet.base import schema

COLUMNS = (
    ("index", "GPU"),
    ("uuid", "UUID"),
    ("serial", "serial"),
    ("pci_bus_id", "bus id"),
    ("vbios", "VBIOS"),
    ("inforom", "InfoROM"),
    ("ecc", "ECC corrected / uncorrected (volatile; aggregate)"),
    ("rows", "remapped rows (correctable / uncorrectable; pending, failed)"),
    ("named", "named by"),
)


def _result(results: list[dict], group: str, check: str) -> dict | None:
    return next((r for r in results if r.get("group") == group and r.get("check") == check), None)


def _per_gpu(res: dict | None) -> dict:
    detail = (res or {}).get("detail")
    rows = detail.get("per_gpu") if isinstance(detail, dict) else None
    return {g["index"]: g for g in rows or [] if isinstance(g, dict) and "index" in g} if isinstance(rows, list) else {}


def _snapshot(results: list[dict]) -> dict:
    res = _result(results, "counters", "snapshot_after") or _result(results, "counters", "snapshot_before")
    detail = (res or {}).get("detail") if isinstance((res or {}).get("detail"), dict) else {}
    return {
        g["index"]: g.get("counters") or {} for g in detail.get("gpus") or [] if isinstance(g, dict) and "index" in g
    }


def _ecc(health: dict, counters: dict) -> str:
    h, c = health or {}, counters or {}

    def pick(h_key: str, c_key: str):
        return h.get(h_key) if h.get(h_key) is not None else c.get(c_key)

    vol = (
        pick("ecc_volatile_corrected", "ecc_corrected_volatile"),
        pick("ecc_volatile_uncorrected", "ecc_uncorrected_volatile"),
    )
    agg = (
        pick("ecc_aggregate_corrected", "ecc_corrected_aggregate"),
        pick("ecc_aggregate_uncorrected", "ecc_uncorrected_aggregate"),
    )
    if all(v is None for v in vol + agg):
        return ""
    text = lambda pair: " / ".join("-" if v is None else str(v) for v in pair)  # noqa: E731
    return f"{text(vol)}; {text(agg)}"


def _rows(health: dict, counters: dict) -> str:
    rows = (health or {}).get("remapped_rows")
    if isinstance(rows, dict):
        correctable, uncorrectable, pending, failed = (
            rows.get("correctable"),
            rows.get("uncorrectable"),
            rows.get("pending"),
            rows.get("failure"),
        )
    elif counters:
        correctable, uncorrectable = counters.get("row_remap_correctable"), counters.get("row_remap_uncorrectable")
        pending, failed = counters.get("row_remap_pending"), counters.get("row_remap_failure")
    else:
        return ""
    flags = [w for w, on in (("pending", pending), ("failed", failed)) if on]
    return (
        f"{correctable if correctable is not None else '-'} / {uncorrectable if uncorrectable is not None else '-'}"
        + (f"; {', '.join(flags)}" if flags else "; none pending or failed")
    )


def _named(results: list[dict]) -> dict:
    """{GPU index: [group.check]} of the results that did not pass and name that GPU (detail.flagged_gpus)."""
    out: dict = {}
    for r in results:
        if r.get("status") in (schema.PASS, schema.SKIP) or not isinstance(r.get("detail"), dict):
            continue
        for g in r["detail"].get("flagged_gpus") or []:
            if isinstance(g, dict) and g.get("index") is not None:
                check = f"{r.get('group')}.{r['check']}" if r.get("group") else r["check"]
                out.setdefault(g["index"], [])
                if check not in out[g["index"]]:
                    out[g["index"]].append(check)
    return out


def gpu_rows(node: dict) -> list[dict]:
    """One row per GPU of the node's inventory (module docstring); [] when the node listed none."""
    results = node.get("results") or []
    count = _result(results, "gpu_inventory", "gpu_count")
    inventory = (
        ((count or {}).get("detail") or {}).get("inventory") if isinstance((count or {}).get("detail"), dict) else None
    )
    gpus = [g for g in (inventory or {}).get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return []
    ecc, remaps, snap = (
        _per_gpu(_result(results, "gpu_health", "ecc")),
        _per_gpu(_result(results, "gpu_health", "row_remapping")),
        _snapshot(results),
    )
    inforom = (node.get("versions") or {}).get("inforom_image")
    named = _named(results)
    out = []
    for pos, g in enumerate(gpus):
        i = g.get("index")
        out.append(
            {
                "index": i,
                "uuid": g.get("uuid"),
                "serial": g.get("serial"),
                "pci_bus_id": g.get("pci_bus_id"),
                "vbios": g.get("vbios") or g.get("vbios_version"),
                "inforom": inforom[pos] if isinstance(inforom, list) and pos < len(inforom) else None,
                "ecc": _ecc(ecc.get(i), snap.get(i)),
                "rows": _rows(remaps.get(i), snap.get(i)),
                "named": ", ".join(named.get(i, [])),
            }
        )
    return out
