"""One picture of the fleet's software and firmware: each component (driver, CUDA, VBIOS, InfoROM, HCA firmware
and board id, OFED, rdma-core, kernel, NCCL, its libraries and net plugin, torch, the engine) across the nodes,
from the `versions` of their host documents (schema.versions()).

    table(versions_by_host, baseline)   the rows, one per component, those with a difference first: each node's
                                        value, the majority (more than half of the nodes that recorded it), the
                                        nodes that differ from it, the baseline run's majority and the nodes
                                        that differ from that
    judge(host, table)                  the `fleet.versions` result of a node that differs: a difference in NCCL
                                        or its net plugin fails (the node cannot share an NCCL run with the
                                        others), any other from the majority or the baseline warns; a node
                                        that differs in nothing gets none (the table shows it)
    nccl_left_out(versions_by_host)     the nodes that differ from the majority in NCCL or its net plugin, each
                                        with the reason: the run across nodes leaves them out

Values are compared as text; the net plugin by the sha256 of its content (the same file in another folder is
the same plugin), shown with its path. A component a document does not carry (an older engine) is left out
for that node; one the node could not read is compared as "not found", so a plugin or OFED installed on only
some nodes is a difference. Without a strict majority (two nodes, two values) every node is named.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.base import paths, schema
from gpufleet.comparisons.findings import fleet_result, listed_text

# (component, label) in the order the table shows them when none differs.
COMPONENTS = (
    ("driver", "NVIDIA driver"),
    ("cuda_driver", "CUDA (driver)"),
    ("vbios", "VBIOS"),
    ("inforom_image", "GPU firmware (InfoROM image)"),
    ("hca_fw", "HCA firmware"),
    ("hca_board_id", "HCA board id"),
    ("ofed", "OFED"),
    ("rdma_core", "rdma-core"),
    ("kernel", "kernel"),
    ("os", "OS"),
    ("nccl", "NCCL (torch's)"),
    ("nccl_libraries", "libnccl the loader finds"),
    ("nccl_net_plugin", "NCCL net plugin"),
    ("torch", "torch"),
    ("torch_cuda", "torch's CUDA"),
    ("engine", "gpufleet engine"),
    ("python", "Python"),
)
LABELS = dict(COMPONENTS)
# A node that differs in these cannot share an NCCL run with the others: NCCL's own version handshake, or a net
# plugin on only some nodes (hangs between some node pairs), stops or hangs the run.
NCCL_COMPONENTS = ("nccl", "nccl_libraries", "nccl_net_plugin")
NOT_FOUND = "not found"
MAX_HOSTS = 6
THRESHOLD = {
    "key": "versions",
    "value": "the majority of the run's nodes, and the baseline run's",
    "source": "one software and firmware set across a fleet (driver, firmware, OFED pinned); NCCL and its net "
    "plugin must be the same on every node of an NCCL run",
}


def value_text(component: str, value: Any) -> tuple[str, str]:
    """(what is compared, what is shown) of one component's value."""
    if value is None:
        return NOT_FOUND, NOT_FOUND
    if component == "nccl_net_plugin" and isinstance(value, dict):
        sha = value.get("sha256") or "unreadable"
        return sha, f"{value.get('path')} (sha256 {sha})"
    if isinstance(value, list):  # per GPU, in NVML order
        distinct = list(dict.fromkeys(str(v) for v in value))
        text = distinct[0] if len(distinct) == 1 else ", ".join(f"GPU {i} {v}" for i, v in enumerate(value))
        return text, text
    if isinstance(value, dict):
        distinct = list(dict.fromkeys(str(v) for v in value.values()))
        keyed = component == "nccl_libraries" or len(distinct) > 1
        text = ", ".join(f"{k} {v}" for k, v in sorted(value.items())) if keyed else distinct[0]
        return text, text
    return str(value), str(value)


def _hosts_text(hosts: list[str]) -> str:
    more = len(hosts) - MAX_HOSTS
    return ", ".join(hosts[:MAX_HOSTS]) + (f" and {more} more" if more > 0 else "")


def _majority(keys: dict[str, str]) -> tuple[str | None, int]:
    """(the value more than half of the hosts hold, how many), or (None, 0)."""
    if not keys:
        return None, 0
    value, count = Counter(keys.values()).most_common(1)[0]
    return (value, count) if count * 2 > len(keys) else (None, 0)


def _component_values(by_host: dict[str, dict], component: str) -> tuple[dict, dict, dict]:
    keys, shown, reasons = {}, {}, {}
    for host, versions in by_host.items():
        if component in versions:
            keys[host], shown[host] = value_text(component, versions[component])
            if versions[component] is None and (versions.get("not_read") or {}).get(component):
                reasons[host] = versions["not_read"][component]
    return keys, shown, reasons


def table(versions_by_host: dict[str, dict], baseline: dict | None = None) -> dict:
    """The table of the module docstring. baseline: {"run_id", "versions": {host: versions}} or None."""
    by_host = {h: v for h, v in versions_by_host.items() if isinstance(v, dict) and v}
    base_by_host = {h: v for h, v in ((baseline or {}).get("versions") or {}).items() if isinstance(v, dict) and v}
    rows = []
    for component, label in COMPONENTS:
        keys, shown, reasons = _component_values(by_host, component)
        if not keys:
            continue
        majority, majority_n = _majority(keys)
        distinct = len(set(keys.values()))
        by_value: dict[str, list[str]] = {}
        for host, key in keys.items():
            by_value.setdefault(key, []).append(host)
        differs = [
            {"host": h, "value": shown[h], "majority": majority is not None}
            for h, k in keys.items()
            if distinct > 1 and k != majority
        ]
        row: dict[str, Any] = {
            "component": component,
            "label": label,
            "values": shown,
            "not_read": reasons,
            "majority": shown[by_value[majority][0]] if majority is not None else None,
            "majority_n": majority_n,
            "n": len(keys),
            "by_value": {shown[hosts[0]]: hosts for hosts in by_value.values()},
            "differs": differs,
            "baseline": None,
            "baseline_differs": [],
        }
        base_keys, base_shown, _ = _component_values(base_by_host, component)
        base_majority, base_n = _majority(base_keys)
        if base_majority is not None:
            base_text = next(base_shown[h] for h, k in base_keys.items() if k == base_majority)
            row["baseline"] = {"value": base_text, "n": base_n, "of": len(base_keys)}
            row["baseline_differs"] = [{"host": h, "value": shown[h]} for h, k in keys.items() if k != base_majority]
        rows.append(row)
    # Differences first (NCCL's, which fail, before the others), then from the baseline; then in the components' order.
    rows.sort(
        key=lambda r: (
            not r["differs"],
            not (r["differs"] and r["component"] in NCCL_COMPONENTS),
            not r["baseline_differs"],
        )
    )
    return {
        "hosts": sorted(by_host),
        "baseline_run": (baseline or {}).get("run_id") if base_by_host else None,
        "baseline_note": (baseline or {}).get("note"),
        "rows": rows,
    }


def _others(row: dict, host: str) -> str:
    parts = [f"{value} on {_hosts_text(hosts)}" for value, hosts in row["by_value"].items() if host not in hosts]
    tail = " (the majority)" if row["majority"] is not None else " (no majority: the nodes do not agree)"
    return "; ".join(parts) + tail


def differences(host: str, tab: dict) -> list[dict]:
    """The node's differences: {"component", "label", "value", "others", "against" ("majority" | "baseline"), "nccl"}."""
    out = []
    for row in tab["rows"]:
        for d in row["differs"]:
            if d["host"] == host:
                out.append(
                    {
                        "component": row["component"],
                        "label": row["label"],
                        "value": d["value"],
                        "others": _others(row, host),
                        "against": "majority",
                        "nccl": row["component"] in NCCL_COMPONENTS,
                    }
                )
        for d in row["baseline_differs"]:
            if d["host"] == host and not any(x["host"] == host for x in row["differs"]):  # said once
                base = row["baseline"]
                out.append(
                    {
                        "component": row["component"],
                        "label": row["label"],
                        "value": d["value"],
                        "others": f"{base['value']} on {base['n']} of {base['of']} node(s) of baseline run "
                        f"{tab['baseline_run']}",
                        "against": "baseline",
                        "nccl": False,
                    }
                )
    return out


def sentence(d: dict) -> str:
    return f"{d['label']}: {d['value']} here; {d['others']}"


def judge(host: str, tab: dict) -> dict | None:
    """The node's fleet.versions result, or None where it differs in nothing (the table shows the sameness)."""
    differing = differences(host, tab)
    if not differing:
        return None
    nccl = [d for d in differing if d["nccl"]]
    reason = listed_text([sentence(d) for d in nccl + [d for d in differing if not d["nccl"]]])
    remedy = (
        "install the same NCCL and net plugin as the other nodes (or remove the odd one), then re-run; the NCCL "
        "run across nodes leaves this node out until then"
        if nccl
        else "bring the node to the fleet's versions (or the fleet to the new ones, and make that run the baseline)"
    )
    detail = {
        "differences": differing,
        "versions": {r["component"]: r["values"].get(host) for r in tab["rows"] if host in r["values"]},
    }
    return fleet_result(
        "versions",
        schema.FAIL if nccl else schema.WARN,
        reason,
        remedy=remedy,
        threshold=THRESHOLD,
        value=len(differing),
        unit="components",
        detail=detail,
    )


def nccl_left_out(versions_by_host: dict[str, dict], peers: dict[str, dict] | None = None) -> dict[str, str]:
    """{host: why it must stay out of the NCCL run across nodes}: it differs from the majority in NCCL or its net
    plugin (all of them where there is no majority). The known-good peers that join the run ({peer: versions},
    from their latest documents) count in the majority but are never left out themselves."""
    tab = table({**(peers or {}), **versions_by_host})
    out = {}
    for host in sorted(versions_by_host):
        nccl = [d for d in differences(host, tab) if d["nccl"]]
        if nccl:
            out[host] = "; ".join(sentence(d) for d in nccl)
    return out


def stored_versions(row: dict, run_dir: str | Path | None) -> dict | None:
    """A document row's versions: those the store kept, else (a row indexed before it kept them) the document's own."""
    if row.get("versions"):
        versions = json.loads(row["versions"])
        return versions if isinstance(versions, dict) else None
    if not run_dir or not row.get("path"):
        return None
    raw, _ = paths.read_bytes(Path(run_dir) / row["path"])
    doc, _ = schema.parse_host_doc(raw) if raw is not None else (None, None)
    return doc["versions"] if doc and isinstance(doc.get("versions"), dict) else None


def peer_versions(store: Any, peers: list[str], run_id: str) -> tuple[dict[str, dict], dict[str, str]]:
    """({peer: versions} from each peer's latest node document of another run in the store, {peer: why not})."""
    by_peer, missing = {}, {}
    for peer in peers:
        row = store.latest_document(peer, run_id)
        versions = stored_versions(row, row.get("run_dir")) if row else None
        if versions is not None:
            by_peer[peer] = versions
        else:
            missing[peer] = f"no readable node document of it in the store {store.path}"
    return by_peer, missing


def baseline_versions(store: Any, base_id: str) -> dict[str, dict]:
    """{host: versions} of the baseline run's node documents, as the store kept them; unreadable ones are left
    out."""
    run_dir = (store.run(base_id) or {}).get("run_dir")
    out = {}
    for row in store.documents(base_id):
        if row.get("role") != "node" or not row.get("ok"):
            continue
        versions = stored_versions(row, run_dir)
        if versions is not None:
            out[row["host"]] = versions
    return out
