"""InfiniBand: the ports up at their rate, their speeds alike, the HCA beside each GPU (rails), and GPUDirect
RDMA (nvidia-peermem) where there are active ports."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.base.registry import registers
from gpufleet.checks.host_hygiene.readings import (
    devices,
    host_readings,
    port_name,
    section,
)
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, WARN, result


@registers("host_hygiene.infiniband", "check")
def check_infiniband(readings: dict, profile: dict) -> dict:
    """Active InfiniBand ports and their rate against ib_ports_min and ib_rate_min_gbps: too few active, or one
    under the rate, fails; a port down beside enough active ones warns."""
    name = "infiniband"
    ib, err = section(readings, name, "infiniband")
    if err:
        return err
    need = profiles.value(profile, "ib_ports_min") or 0
    rate_min = profiles.value(profile, "ib_rate_min_gbps")
    threshold = profiles.threshold(
        profile, "ib_ports_min", ib_rate_min_gbps=profiles.threshold(profile, "ib_rate_min_gbps")
    )
    ports = ib.get("ports") or []
    detail = {"path": ib.get("path"), "ports": ports}
    if not ib.get("present") or not ports:
        if need == 0:
            return result(
                name, SKIP, "no InfiniBand HCA found under /sys/class/infiniband", threshold=threshold, detail=detail
            )
        return result(
            name,
            FAIL,
            f"expected at least {need} active InfiniBand port(s); no InfiniBand HCA found under /sys/class/infiniband",
            value=0,
            unit="ports",
            threshold=threshold,
            remedy="check that the HCAs are seated and seen on the PCI bus, and that mlx5_core/ib_core (rdma-core or DOCA-OFED) are loaded",
            detail=detail,
        )
    ib_ports = [p for p in ports if p.get("link_layer") == "InfiniBand"]
    active = [p for p in ib_ports if p.get("state") == "ACTIVE"]
    down = [p for p in ports if p.get("state") != "ACTIVE"]
    roce = [p for p in ports if p.get("link_layer") != "InfiniBand" and p.get("state") == "ACTIVE"]
    detail |= {"active": [port_name(p) for p in active], "down": [port_name(p) for p in down]}
    fails, warns = [], []
    if len(active) < need:
        why = f"{len(active)} of at least {need} InfiniBand port(s) active"
        if down:
            why += "; not active: " + ", ".join(
                f"{port_name(p)} ({p.get('state')}, {p.get('phys_state')})" for p in down
            )
        if roce:
            why += f"; {len(roce)} active port(s) are {roce[0].get('link_layer')} (RoCE), which ib_ports_min does not count"
        fails.append(why)
    elif down:
        warns.append(
            "port(s) not active: "
            + ", ".join(f"{port_name(p)} ({p.get('state')}, {p.get('phys_state')})" for p in down)
        )
    if rate_min is None:
        if active:
            warns.append(
                f"ib_rate_min_gbps not set; active ports run at {sorted({p.get('rate_gbps') for p in active}, key=str)} Gb/s"
            )
    else:
        slow = [p for p in active if p.get("rate_gbps") is None or p["rate_gbps"] < rate_min]
        if slow:
            fails.append(
                "below the rate floor of {} Gb/s: ".format(rate_min)
                + ", ".join(f"{port_name(p)} at {p.get('rate') or 'unknown rate'}" for p in slow)
            )
    status = FAIL if fails else WARN if warns else PASS
    if status == PASS:
        reason = f"{len(active)} InfiniBand port(s) active" + (
            f" at >= {rate_min} Gb/s" if rate_min is not None else ""
        )
    else:
        reason = "; ".join(fails + warns)
    return result(
        name,
        status,
        reason,
        value=len(active),
        unit="ports",
        threshold=threshold,
        remedy=(
            None
            if status == PASS
            else "check cables and switch ports of the listed ports (ibstat, mlxlink), and the subnet manager; reseat or replace the transceiver"
        ),
        detail=detail,
    )


def _speed_text(p: dict) -> str:
    return p.get("rate") or f"{p.get('rate_gbps')} Gb/s"


@registers("host_hygiene.ib_port_speed", "check")
def check_ib_port_speed(readings: dict, profile: dict) -> dict:
    """Every active port at the best rate and lane count of its siblings (same link layer) on this node."""
    name = "ib_port_speed"
    ib, err = section(readings, name, "infiniband")
    if err:
        return err
    active = [p for p in ib.get("ports") or [] if p.get("state") == "ACTIVE"]
    rows = [
        {"port": port_name(p), **{k: p.get(k) for k in ("hca", "pci_bdf", "rate", "rate_gbps", "lanes", "link_layer")}}
        for p in active
    ]
    detail = {"ports": rows}
    if not active:
        return result(
            name, SKIP, "no active InfiniBand or RoCE port to compare (see host_hygiene.infiniband)", detail=detail
        )
    slow, best_of = [], {}
    for layer in sorted({str(p.get("link_layer")) for p in active}):
        same = [p for p in active if str(p.get("link_layer")) == layer]
        rate = max((p["rate_gbps"] for p in same if isinstance(p.get("rate_gbps"), (int, float))), default=None)
        lanes = max((p["lanes"] for p in same if isinstance(p.get("lanes"), int)), default=None)
        best_of[layer] = {
            "rate_gbps": rate,
            "lanes": lanes,
            "rate": next((p.get("rate") for p in same if p.get("rate_gbps") == rate), None),
        }
        for p in same:
            low = [
                what
                for what, mine, best in (("rate", p.get("rate_gbps"), rate), ("lanes", p.get("lanes"), lanes))
                if best is not None and (mine is None or mine < best)
            ]
            if low:
                slow.append((p, layer, low))
    detail["best"] = best_of
    if slow:
        named = [
            f"{port_name(p)} at {_speed_text(p)} ({' and '.join('fewer lanes' if w == 'lanes' else 'a lower rate' for w in low)} "
            f"than its {layer} siblings at {best_of[layer]['rate'] or best_of[layer]['rate_gbps']})"
            for p, layer, low in slow
        ]
        detail["slower"] = [port_name(p) for p, _, _ in slow]
        return result(
            name,
            FAIL,
            f"{len(slow)} of {len(active)} active port(s) trained below their siblings: " + "; ".join(named),
            value=len(slow),
            unit="ports",
            remedy="a port trained at fewer lanes or a lower rate has a bad cable, transceiver or switch port: check it "
            "with `mlxlink -d <hca> -m`, reseat or replace the cable; every rank's traffic on that rail runs at its speed",
            detail=detail,
        )
    speeds = ", ".join(f"{layer} at {b['rate'] or b['rate_gbps']}" for layer, b in best_of.items())
    return result(name, PASS, f"{len(active)} active port(s) alike: {speeds}", value=0, unit="ports", detail=detail)


def _shared(a: list[str], b: list[str]) -> int:
    """Bridges two devices share from the root port down (their common ancestors in the PCIe tree)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def rails(readings: dict) -> tuple[list[dict], list[dict]]:
    """(GPUs in PCI bus order, each with the HCA nearest it: the most bridges shared, then the same NUMA node, then the
    name; the HCAs). A GPU's position n is its NVML index where NVML orders by PCI bus id, as it does by default."""
    gpus = sorted(devices(readings, "gpu"), key=lambda d: d["bdf"])
    hca_name: dict[str, str] = {}
    for p in (host_readings(readings).get("infiniband") or {}).get("ports") or []:
        if p.get("pci_bdf"):
            hca_name.setdefault(p["pci_bdf"], p.get("hca"))
    hcas = [
        dict(d, hca=hca_name[d["bdf"]]) for d in host_readings(readings).get("pci") or [] if d.get("bdf") in hca_name
    ]
    out = []
    for n, g in enumerate(gpus):
        ranked = sorted(
            hcas,
            key=lambda h: (
                -_shared(g.get("upstream") or [], h.get("upstream") or []),
                h.get("numa_node") != g.get("numa_node"),
                h["hca"],
            ),
        )
        row = {"gpu": n, "gpu_bdf": g["bdf"], "gpu_numa": g.get("numa_node")}
        if ranked:
            h = ranked[0]
            shared = _shared(g.get("upstream") or [], h.get("upstream") or [])
            row.update(
                hca=h["hca"],
                hca_bdf=h["bdf"],
                hca_numa=h.get("numa_node"),
                shared_bridges=shared,
                beside=shared > 0,
                same_numa=h.get("numa_node") == g.get("numa_node"),
            )
        out.append(row)
    return out, hcas


@registers("host_hygiene.gpu_nic_rails", "check")
def check_gpu_nic_rails(readings: dict, profile: dict) -> dict:
    """Each GPU's nearest HCA in the PCIe tree: one that shares a bridge with it (a PCIe switch under one root
    port) is beside it; a GPU with none sends its RDMA traffic through the CPU."""
    name = "gpu_nic_rails"
    rows, hcas = rails(readings)
    detail = {"rails": rows}
    if not rows:
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus", detail=detail)
    if not hcas:
        return result(
            name,
            SKIP,
            "no InfiniBand or RoCE HCA (nothing under /sys/class/infiniband with a PCI device): no rails to read",
            detail=detail,
        )
    lonely = [r for r in rows if not r.get("beside")]
    pairs = ", ".join(f"GPU {r['gpu']}-{r['hca']}" for r in rows)
    if lonely:
        named = "; ".join(
            f"GPU {r['gpu']} ({r['gpu_bdf']}, NUMA node {r['gpu_numa']}): nearest HCA {r['hca']} ({r['hca_bdf']}) "
            f"only through the CPU{'' if r['same_numa'] else ', on another NUMA node'}"
            for r in lonely
        )
        return result(
            name,
            FAIL,
            f"{len(lonely)} of {len(rows)} GPU(s) have no HCA beside them in the PCIe tree: {named}",
            value=len(lonely),
            unit="gpus",
            detail=detail,
            remedy="an HCA missing from the PCIe switch of these GPUs (not seated, not enumerated, or cabled to another "
            "slot): compare with the platform's reference layout and `nvidia-smi topo -m`; GPUDirect RDMA "
            "performs only with the HCA and GPU under one PCIe switch (NVIDIA GPUDirect RDMA user manual, "
            "system requirements)",
        )
    far = [r for r in rows if not r["same_numa"]]
    note = f"; {len(far)} pair(s) across NUMA nodes" if far else ""
    return result(
        name,
        PASS,
        f"every GPU has an HCA beside it under one PCIe switch: {pairs}{note}",
        value=0,
        unit="gpus",
        detail=detail,
    )


def active_ib_ports(readings: dict) -> list[dict]:
    ib = host_readings(readings).get("infiniband") or {}
    return [p for p in ib.get("ports") or [] if p.get("state") == "ACTIVE"]


@registers("host_hygiene.peermem", "check")
def check_peermem(readings: dict, profile: dict) -> dict:
    """nvidia_peermem loaded where InfiniBand is present, so NCCL can use GPUDirect RDMA: not loaded fails."""
    name = "peermem"
    ib = host_readings(readings).get("infiniband") or {}
    if not ib.get("present") or not ib.get("ports"):
        return result(name, SKIP, "no InfiniBand HCA, so GPUDirect RDMA (nvidia_peermem) is not needed")
    mods, err = section(readings, name, "modules")
    if err:
        return err
    detail = {"path": mods.get("path"), "loaded": mods.get("loaded")}
    if not mods.get("readable"):
        return result(name, ERROR, f"cannot tell whether nvidia_peermem is loaded: {mods.get('reason')}", detail=detail)
    loaded = mods.get("loaded") or {}
    loaded_modules = [m for m in ("nvidia_peermem", "nv_peer_mem") if loaded.get(m)]
    if loaded_modules:
        return result(name, PASS, f"{loaded_modules[0]} loaded: GPUDirect RDMA available to NCCL", detail=detail)
    return result(
        name,
        FAIL,
        f"InfiniBand is present ({len(ib['ports'])} port(s)) but nvidia_peermem is not loaded "
        f"(per {mods.get('path')}), so NCCL cannot use GPUDirect RDMA through it",
        remedy="modprobe nvidia_peermem and list it in /etc/modules-load.d (bringup.yml does both); "
        "it needs ib_core loaded before it",
        detail=detail,
    )


# --- IOMMU --------------------------------------------------------------------------------
