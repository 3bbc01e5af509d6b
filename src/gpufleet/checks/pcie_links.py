"""`benchmark.pcie_links`: the PCIe links of the NICs, the GPUs and the switches and bridges above them, judged by
the best each trained to while the node's benchmarks loaded them (bench.link_watch, beside every step's sampler).

A link whose best speed or width stayed below the most both its ends can do (the device's max_link_* and the
slot's, its parent port's) fails, naming the device, the port above it and both figures: a NIC at x8 in an x16
slot halves its bandwidth, a switch's uplink at Gen4 halves every GPU's and NIC's under it. A run that loaded no
GPU (a CPU run) judges nothing: an idle GPU link lowers its speed on purpose. A GPU that reaches its CPU over
NVLink-C2C (a Grace superchip) has no PCIe link to train down: it, and a bridge above such GPUs alone, is left out
with that said (gpu_health.pcie_link reads its C2C links).
"""

from __future__ import annotations

from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, result

CHECK = "pcie_links"
_NAMED_MAX = 6
_GT_S = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0", 7: "128.0"}
REMEDY = (
    "reseat the card (and its riser or cable), check the slot's wiring and bifurcation and the BIOS's PCIe speed "
    "setting, update the device's and the switch's firmware; `lspci -vv -s <bdf>` shows LnkSta against LnkCap"
)


def link_text(gen, width) -> str:
    """'Gen5 (32.0 GT/s) x16'; an unknown part as '?'."""
    speed = f"Gen{gen} ({_GT_S.get(gen, '?')} GT/s)" if gen else "Gen?"
    return f"{speed} x{width or '?'}"


def _name(link: dict) -> str:
    what = {"nic": "NIC", "gpu": "GPU"}.get(link["kind"], "bridge")
    text = f"{what} {link['bdf']}"
    if link["kind"] == "bridge":
        text += f" (above {', '.join(sorted(set(link['below'])))})"
    return text + (f" under {link['parent']}" if link.get("parent") else " on a root bus")


def combined(summaries: list[dict]) -> dict:
    """bdf -> the link and the best any step's watch saw of it: gen, width (each its most), reads, below_reads."""
    out: dict[str, dict] = {}
    for s in summaries:
        for link in s.get("links") or []:
            best, seen = link.get("best") or {}, out.setdefault(link["bdf"], {**link, "best": {"reads": 0}})["best"]
            for key in ("gen", "width"):
                if (best.get(key) or 0) > (seen.get(key) or 0):
                    seen[key] = best[key]
            seen["reads"] += best.get("reads") or 0
            seen["below_reads"] = seen.get("below_reads", 0) + (best.get("below_reads") or 0)
            if best.get("error"):
                seen.setdefault("error", best["error"])
    return out


def _on_c2c(link: dict, c2c_gpus: set) -> bool:
    """A GPU on NVLink-C2C, or a bridge with nothing but such GPUs below it."""
    below = (
        {link["bdf"]} if link["kind"] == "gpu" else set(link.get("below") or ()) if link["kind"] == "bridge" else set()
    )
    return bool(below) and below <= c2c_gpus


def pcie_links(summaries: list[dict], loaded: bool, c2c_gpus=()) -> dict:
    """The links' result from every step's LinkWatch summary; `loaded`: a step ran on the GPUs; `c2c_gpus`: the PCI
    addresses of the GPUs on NVLink-C2C (base.host_platform), whose PCIe links are not judged."""
    links = combined(summaries)
    c2c = {bdf: links.pop(bdf)["kind"] for bdf in list(links) if _on_c2c(links[bdf], set(c2c_gpus))}
    c2c_text = (
        f"{list(c2c.values()).count('gpu')} GPU(s) reach their CPU over NVLink-C2C, no PCIe link to train down "
        "(gpu_health.pcie_link reads their C2C links)"
        if c2c
        else ""
    )
    errors = [s["error"] for s in summaries if s.get("error")]
    detail = {
        "links": [{k: v for k, v in link.items() if k != "path"} | {"name": _name(link)} for link in links.values()],
        "reads": sum(s.get("samples") or 0 for s in summaries),
        "errors": errors,
        **({"on_c2c": sorted(c2c)} if c2c else {}),
    }
    if not links and c2c:
        return result(CHECK, SKIP, f"no PCIe link to judge: {c2c_text}", detail=detail)
    if not links:
        why = "; ".join(errors) or (
            "no NIC or GPU on the PCI bus with a link speed to read (a virtual machine's devices have none)"
        )
        return result(CHECK, SKIP, f"no PCIe link to judge: {why}", detail=detail)
    if not loaded:
        return result(
            CHECK,
            SKIP,
            f"{len(links)} PCIe link(s) read, not judged: no benchmark loaded a GPU here (a CPU run), and an idle "
            "link lowers its speed on purpose",
            detail=detail,
        )
    unread = [link for link in links.values() if not link["best"]["reads"]]
    below = [
        link
        for link in links.values()
        if link["best"]["reads"]
        and (link["best"]["gen"] < (link["max_gen"] or 0) or link["best"]["width"] < (link["max_width"] or 0))
    ]
    if below:
        said = "; ".join(
            f"{_name(link)}: at most {link_text(link['best']['gen'], link['best']['width'])} under load, its maximum "
            f"{link_text(link['max_gen'], link['max_width'])} (device "
            f"{link_text(link['device_max']['gen'], link['device_max']['width'])}, slot "
            + (
                link_text(link["slot_max"]["gen"], link["slot_max"]["width"])
                if link.get("parent")
                else "not readable: on a root bus"
            )
            + ")"
            for link in below[:_NAMED_MAX]
        )
        more = f"; and {len(below) - _NAMED_MAX} more (detail.links)" if len(below) > _NAMED_MAX else ""
        return result(
            CHECK,
            FAIL,
            f"{len(below)} PCIe link(s) trained below their maximum while the benchmarks loaded them: {said}{more}",
            value=len(below),
            unit="links",
            remedy=REMEDY,
            detail=detail,
        )
    # A link that never gave a speed (a virtual function's Link Status is reserved, a link down) is named, not judged;
    # with none read at all, nothing was checked.
    unread_text = "; ".join(f"{_name(link)}: {link['best'].get('error')}" for link in unread[:_NAMED_MAX])
    if len(unread) == len(links):
        return result(
            CHECK,
            ERROR,
            f"none of the {len(links)} PCIe link(s) gave a speed while the benchmarks ran: {unread_text}",
            remedy="check that sysfs (current_link_speed, current_link_width) is readable on the node and run again",
            detail=detail,
        )
    kinds = [link["kind"] for link in links.values() if link["best"]["reads"]]
    return result(
        CHECK,
        PASS,
        f"{len(kinds)} PCIe link(s) at their maximum under load ({kinds.count('nic')} NIC(s), {kinds.count('gpu')} "
        f"GPU(s), {kinds.count('bridge')} switch uplink(s)), over {detail['reads']} read(s)"
        + (f"; {len(unread)} gave no speed, not judged: {unread_text}" if unread else "")
        + (f"; {c2c_text}" if c2c else ""),
        value=0,
        unit="links",
        detail=detail,
    )
