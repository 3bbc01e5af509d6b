"""Memory RAS from the kernel's EDAC counts: every memory controller under sys/devices/system/edac/mc, its
corrected (CE) and uncorrected (UE) errors, and each DIMM's (or rank's) where the driver names them.

    {"present": bool, "path", "reason": why none (None when read),
     "controllers": [{"mc": "mc0", "name": mc_name, "size_mb", "seconds_since_reset",
                      "ce", "ue", "ce_noinfo", "ue_noinfo",        (the controller's counts; None unreadable)
                      "dimms": [{"dimm": "dimm3", "label", "location", "size_mb", "mem_type", "ce", "ue"}],
                      "unreadable": {file: why}}]}

The counts start at zero when the driver loads (and when `reset_counters` is written): a reboot clears them.
A controller's ce/ue hold its DIMMs' counts and the errors it could not place (`*_noinfo`). Many virtual
machines have no EDAC at all: `present` False and the reason, which the checks turn into one `skip`.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.collect.host.files import listdir, parse_int, read_text

EDAC_MC = "sys/devices/system/edac/mc"
ABSENT = (
    "no EDAC memory controller ({path}: {why}): the kernel counts no memory errors here (a virtual machine, or "
    "no EDAC driver for this platform loaded: i10nm_edac, skx_edac, amd64_edac, or ghes_edac with firmware-first)"
)
_MC_COUNTS = {"ce": "ce_count", "ue": "ue_count", "ce_noinfo": "ce_noinfo_count", "ue_noinfo": "ue_noinfo_count"}


def _count(folder: Path, name: str, unreadable: dict) -> int | None:
    text, why = read_text(folder / name)
    value = parse_int(text)
    if value is None:
        unreadable[f"{folder.name}/{name}"] = why or f"{folder / name}: not a count ({text!r})"
    return value


def _dimm(folder: Path, unreadable: dict) -> dict:
    """One dimmN/ or rankN/ folder (the same files: dimm_ce_count, dimm_ue_count, dimm_label, ...)."""
    text = {f: read_text(folder / f"dimm_{f}")[0] for f in ("label", "location", "mem_type")}
    return {
        "dimm": folder.name,
        **text,
        "size_mb": parse_int(read_text(folder / "size")[0]),
        "ce": _count(folder, "dimm_ce_count", unreadable),
        "ue": _count(folder, "dimm_ue_count", unreadable),
    }


def read_edac(root: Path) -> dict:
    """Every EDAC memory controller and its DIMMs under root (module docstring); never raises for a missing file."""
    base = root / EDAC_MC
    names = listdir(base)
    if names is None:
        why = "not readable" if base.exists() else "not present"
        return {"present": False, "path": str(base), "reason": ABSENT.format(path=base, why=why), "controllers": []}
    controllers = []
    for mc in (n for n in names if n.startswith("mc") and n[2:].isdigit()):
        folder, unreadable = base / mc, {}
        entry = {
            "mc": mc,
            "name": read_text(folder / "mc_name")[0],
            "size_mb": parse_int(read_text(folder / "size_mb")[0]),
            "seconds_since_reset": parse_int(read_text(folder / "seconds_since_reset")[0]),
            **{key: _count(folder, f, unreadable) for key, f in _MC_COUNTS.items()},
        }
        kids = [n for n in listdir(folder) or [] if (n.startswith("dimm") or n.startswith("rank")) and n[4:].isdigit()]
        entry["dimms"] = [_dimm(folder / k, unreadable) for k in sorted(kids, key=lambda n: int(n[4:]))]
        entry["unreadable"] = unreadable
        controllers.append(entry)
    reason = None if controllers else ABSENT.format(path=base, why="no mc* in it")
    return {"present": bool(controllers), "path": str(base), "reason": reason, "controllers": controllers}


def place_name(mc: dict, dimm: dict | None = None) -> str:
    """'mc0 (i10nm memory controller) dimm3 "CPU_SrcID#0_MC#0_Chan#1_DIMM#0" (location 0:1:0)'."""
    text = mc["mc"] + (f" ({mc['name']})" if mc.get("name") else "")
    if dimm is not None:
        text += f" {dimm['dimm']}" + (f' "{dimm["label"]}"' if dimm.get("label") else "")
        text += f" (location {dimm['location']})" if dimm.get("location") else ""
    return text


def error_places(edac: dict) -> list[dict]:
    """Where memory errors are counted, each error once: every DIMM, and each controller's errors it placed on no
    DIMM (its own counts where it names no DIMM): [{"id": "edac:mc0/dimm3" | "edac:mc0", "name", "ce", "ue"}]."""
    out = []
    for mc in edac.get("controllers") or []:
        for d in mc.get("dimms") or []:
            out.append(
                {"id": f"edac:{mc['mc']}/{d['dimm']}", "name": place_name(mc, d), "ce": d.get("ce"), "ue": d.get("ue")}
            )
        if mc.get("dimms"):
            out.append(
                {
                    "id": f"edac:{mc['mc']}",
                    "name": f"{place_name(mc)}, not placed on a DIMM",
                    "ce": mc.get("ce_noinfo"),
                    "ue": mc.get("ue_noinfo"),
                }
            )
        else:
            out.append({"id": f"edac:{mc['mc']}", "name": place_name(mc), "ce": mc.get("ce"), "ue": mc.get("ue")})
    return out
