"""GPU inventory: what GPUs the node has and how they are set up.

Each check is a pure function of the NVML readings (collect.nvml) and the
profile. The helpers here (gpu_check, Findings) are shared with gpu_health:
they turn a missing driver into one `error` line for every check and fold
per-GPU findings into one result whose reason names the GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gpufleet.base import profiles, schema
from gpufleet import collect
from gpufleet.collect import nvml
from gpufleet.base.registry import SOFTWARE
from gpufleet.base.schema import ERROR, FAIL, INFO, PASS, SKIP, WARN

NO_DRIVER_REMEDY = "install the NVIDIA driver (bringup.yml, role nvidia_driver) or run on a GPU node"
UNREADABLE_REMEDY = "read the GPU with `nvidia-smi -q -i {gpus}`; an unreadable field on a datacenter GPU points to a driver or GPU fault"


def gpu_check(name: str, *, needs_gpus: bool = True) -> Callable:
    """Wrap fn(readings, gpus, profile) as a check fn(readings, profile).

    No NVML (no driver, init failed) -> `error` with the reader's one line;
    no GPU at all -> `error`, unless the check works without GPUs.
    """

    def wrap(fn: Callable) -> Callable:
        def check(readings: dict, profile: dict) -> dict:
            nv = readings.get("nvml")
            if not isinstance(nv, dict):
                return schema.result(
                    name,
                    ERROR,
                    "the readings hold no 'nvml' section (expected `gpufleet collect` output)",
                    remedy="record the readings again with `gpufleet collect`",
                )
            if not nv.get("available"):
                # driver_unusable: the driver is what is missing (its library, or NVML cannot start), not our package
                # or our reader; Slurm's health check drains such a node (checks.slurm_health). One cause, one class
                # for every check it stops (software: the driver), whatever class the check's own findings have.
                return schema.result(
                    name,
                    ERROR,
                    nv.get("error") or "NVML is not available",
                    remedy=NO_DRIVER_REMEDY,
                    detail={"driver_unusable": nvml.driver_unusable(nv)},
                    failure_class=SOFTWARE,
                )
            gpus = nv.get("gpus") or []
            if needs_gpus and not gpus:
                reason = "NVML reports no GPU, so there is nothing to check"
                if nv.get("error"):
                    reason += f" ({nv['error']})"
                return schema.result(
                    name, ERROR, reason, remedy="see gpu_count: check `nvidia-smi -L` and `lspci -d 10de:`"
                )
            return name_flagged(fn(readings, gpus, profile), gpus)

        check.__name__ = check.__qualname__ = name
        check.__doc__ = fn.__doc__
        return check

    return wrap


def name_flagged(res: dict, gpus: list) -> dict:
    """Fill uuid and serial of the GPUs a result flags (detail.flagged_gpus) from the NVML readings: by UUID
    where the result has it (benchmarks know CUDA devices by UUID), else by NVML index."""
    flagged = (res.get("detail") or {}).get("flagged_gpus") or []
    by_index = {g.get("index"): g for g in gpus}
    by_uuid = {(g.get("uuid") or "").lower(): g for g in gpus if g.get("uuid")}
    for entry in flagged:
        g = by_uuid.get((entry.get("uuid") or "").lower()) or by_index.get(entry.get("index")) or {}
        entry["index"] = entry.get("index") if entry.get("index") is not None else g.get("index")
        entry["uuid"] = entry.get("uuid") or g.get("uuid")
        entry["serial"] = entry.get("serial") or g.get("serial")
    return res


def unreadable(gpu: dict, field: str) -> str:
    """Why a field is None: the reader's error text for it."""
    why = gpu.get("unreadable") or {}
    return why.get(field) or why.get("handle") or "not in the readings"


def not_supported(gpu: dict, field: str) -> bool:
    return "not supported" in unreadable(gpu, field).lower()


def gpu_list(indices: list) -> str:
    """[3] -> "GPU 3"; [0, 1, 2, 5] -> "GPUs 0-2, 5"."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return ("GPU " if len(indices) == 1 else "GPUs ") + text


class Findings:
    """Per-GPU (or node-wide) findings folded into one result.

    add(status, text, gpu=index, remedy=...): findings with the same status,
    text and remedy merge ("GPUs 0, 3: persistence mode off"). A `pass`
    finding with text is a note added to the passing reason; an `info` one
    (no action asked) too, and the result is `info`. A remedy may
    hold {gpus}, filled with the comma-separated indices nvidia-smi -i takes.
    A result that warns, fails or errs because of GPUs names them in
    detail.flagged_gpus ([{"index", "uuid", "serial"}], the GPUs whose findings
    have the result's status; gpu_check fills uuid and serial from the readings).
    """

    def __init__(self) -> None:
        self._items: dict[tuple, list] = {}

    def add(self, status: str, text: str, *, gpu: int | None = None, remedy: str | None = None) -> None:
        self._items.setdefault((status, text, remedy), []).append(gpu)

    @property
    def status(self) -> str:
        return schema.worst((s for s, _, _ in self._items), PASS)

    def _lines(self, statuses) -> tuple[list[str], list[str]]:
        texts, remedies = [], []
        keys = sorted((k for k in self._items if k[0] in statuses), key=lambda k: -schema.severity(k[0]))
        for status, text, remedy in keys:
            gpus = [g for g in self._items[(status, text, remedy)] if g is not None]
            texts.append(f"{gpu_list(gpus)}: {text}" if gpus else text)
            if remedy:
                filled = remedy.replace("{gpus}", ",".join(str(g) for g in gpus) or "<index>")
                if filled not in remedies:
                    remedies.append(filled)
        return texts, remedies

    def result(self, check: str, ok_reason: str, **fields) -> dict:
        status = self.status
        if status in (PASS, INFO):  # information changes no verdict: the passing reason, then what it says
            notes, _ = self._lines({INFO, PASS})
            reason = "; ".join([ok_reason, *notes])
            remedy = None
        else:
            texts, remedies = self._lines({ERROR, FAIL, WARN, SKIP, INFO})
            reason = "; ".join(texts)
            remedy = "; ".join(remedies) or None
        flagged = self.flagged_gpus(status)
        if flagged:
            fields["detail"] = {**(fields.get("detail") or {}), "flagged_gpus": flagged}
        return schema.result(check, status, reason, remedy=remedy, **fields)

    def flagged_gpus(self, status: str) -> list[dict]:
        """The GPUs behind a warn/fail/error status: [{"index", "uuid": None, "serial": None}]."""
        if status not in (WARN, FAIL, ERROR):
            return []
        indices = sorted({g for (s, _, _), gpus in self._items.items() if s == status for g in gpus if g is not None})
        return [{"index": i, "uuid": None, "serial": None} for i in indices]


def version_tuple(text: str) -> tuple[int, ...] | None:
    """ "535.183.01" -> (535, 183, 1); None if it is not dotted numbers."""
    if not isinstance(text, str) or not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        return None
    return tuple(int(p) for p in text.strip().split("."))


# --- checks ---------------------------------------------------------------------------------------------


@gpu_check("gpu_count", needs_gpus=False)
def gpu_count(readings, gpus, profile):
    """The number of GPUs NVML sees against gpus_expected. Its detail holds the inventory: the GPUs, and the board's
    identity (collect.board; None from readings that hold none), which a certificate binds (certify/)."""
    nv = readings["nvml"]
    expected = profiles.value(profile, "gpus_expected")
    count = len(gpus)
    inventory = {
        "driver_version": nv.get("driver_version"),
        "cuda_driver_version": nv.get("cuda_driver_version"),
        "nvml_version": nv.get("nvml_version"),
        "gpus": [
            {k: g.get(k) for k in ("index", "name", "uuid", "serial", "pci_bus_id", "memory_total_mib")}
            | {"vbios": g.get("vbios_version")}
            for g in gpus
        ],
        "board": collect.board(readings),
    }
    fields = dict(
        value=count,
        unit="GPUs",
        threshold=profiles.threshold(profile, "gpus_expected"),
        detail={"inventory": inventory},
    )
    missing_remedy = (
        "look for a GPU that fell off the bus (xid check, Xid 79) or is missing from `lspci -d 10de:`; "
        "reset or reseat it, or replace it"
    )
    if count == 0:
        reason = "NVML reports no GPU" + (f" ({nv['error']})" if nv.get("error") else "")
        return schema.result("gpu_count", FAIL, reason, remedy=missing_remedy, **fields)
    names = sorted({g.get("name") or "unknown" for g in gpus})
    found_text = f"found {count} GPUs ({', '.join(names)})" if count != 1 else f"found 1 GPU ({names[0]})"
    if expected is None:
        return schema.result(
            "gpu_count",
            WARN,
            f"expected count not set, {found_text}",
            remedy="set gpufleet_thresholds.gpus_expected in inventory",
            **fields,
        )
    if count < expected:
        source = profile["thresholds"]["gpus_expected"]["source"]
        if not source.startswith("inventory override"):  # the profile's board count: this machine may be another board
            missing_remedy += (
                f"; or, if this machine has {count} GPUs by design, say so: gpufleet_thresholds: "
                f"{{gpus_expected: {count}}} for it (make validate: EXPECTED_GPUS={count}); profile "
                f"{profile['name']} expects {expected} ({source})"
            )
        return schema.result("gpu_count", FAIL, f"{found_text}, expected {expected}", remedy=missing_remedy, **fields)
    if count > expected:
        return schema.result(
            "gpu_count",
            FAIL,
            f"{found_text}, expected {expected}",
            remedy="check the profile and gpufleet_thresholds.gpus_expected for this node",
            **fields,
        )
    return schema.result("gpu_count", PASS, found_text, **fields)


@gpu_check("gpu_model")
def gpu_model(readings, gpus, profile):
    """Every GPU the same model: a training job runs at the pace of its slowest rank."""
    by_name: dict[str, list] = {}
    f = Findings()
    for g in gpus:
        if g.get("name") is None:
            f.add(ERROR, f"name unreadable ({unreadable(g, 'name')})", gpu=g["index"], remedy=UNREADABLE_REMEDY)
        else:
            by_name.setdefault(g["name"], []).append(g["index"])
    if len(by_name) > 1:
        listing = "; ".join(f"{name} on {gpu_list(idx)}" for name, idx in by_name.items())
        f.add(
            FAIL, f"mixed GPU models: {listing}", remedy="a training node needs one GPU model: replace the odd GPU(s)"
        )
    only = next(iter(by_name), None)
    return f.result("gpu_model", f"{len(gpus)} x {only}", value=sorted(by_name), detail={"names": by_name})


@gpu_check("gpu_memory")
def gpu_memory(readings, gpus, profile):
    """The memory of every GPU (memory_total_mib) against gpu_memory_min_mib: less fails."""
    minimum = profiles.value(profile, "gpu_memory_min_mib")
    f = Findings()
    per_gpu = [{"index": g["index"], "memory_total_mib": g.get("memory_total_mib")} for g in gpus]
    for g in gpus:
        mib = g.get("memory_total_mib")
        if mib is None:
            f.add(
                ERROR,
                f"memory size unreadable ({unreadable(g, 'memory_total_mib')})",
                gpu=g["index"],
                remedy=UNREADABLE_REMEDY,
            )
        elif minimum is not None and mib < minimum:
            f.add(
                FAIL,
                f"{mib} MiB < {minimum} MiB",
                gpu=g["index"],
                remedy="a GPU with less memory than its model has is faulty or a different SKU: check `nvidia-smi -q -d MEMORY`, replace it",
            )
    sizes = [p["memory_total_mib"] for p in per_gpu if p["memory_total_mib"] is not None]
    smallest = min(sizes) if sizes else None
    if minimum is None and f.status == PASS:
        f.add(
            WARN,
            f"no minimum set; smallest GPU has {smallest} MiB",
            remedy="set gpufleet_thresholds.gpu_memory_min_mib or use a GPU profile",
        )
    return f.result(
        "gpu_memory",
        f"every GPU has at least {minimum} MiB (smallest {smallest} MiB)",
        value=smallest,
        unit="MiB",
        threshold=profiles.threshold(profile, "gpu_memory_min_mib"),
        detail={"per_gpu": per_gpu},
    )


@gpu_check("driver_version", needs_gpus=False)
def driver_version(readings, gpus, profile):
    """The driver against driver_version_min and, when pinned, driver_version."""
    nv = readings["nvml"]
    installed = nv.get("driver_version")
    minimum = profiles.value(profile, "driver_version_min")
    pinned = profiles.value(profile, "driver_version")
    fields = dict(
        value=installed,
        threshold=profiles.threshold(profile, "driver_version_min", pinned=pinned),
        detail={
            "driver_version": installed,
            "cuda_driver_version": nv.get("cuda_driver_version"),
            "nvml_version": nv.get("nvml_version"),
        },
    )
    upgrade = "install a newer driver (bringup.yml, role nvidia_driver)"
    if installed is None:
        why = (nv.get("unreadable") or {}).get("driver_version", "not in the readings")
        return schema.result(
            "driver_version", ERROR, f"driver version unreadable ({why})", remedy="check `nvidia-smi`", **fields
        )
    have = version_tuple(installed)
    if have is None:
        return schema.result(
            "driver_version",
            ERROR,
            f"driver version {installed!r} is not a dotted version",
            remedy="check `nvidia-smi`",
            **fields,
        )
    for key, want in (("driver_version_min", minimum), ("driver_version", pinned)):
        if want is not None and version_tuple(want) is None:
            return schema.result(
                "driver_version",
                ERROR,
                f"threshold {key} = {want!r} is not a dotted version like 535.183.01",
                remedy=f"fix gpufleet_thresholds.{key}",
                **fields,
            )
    f = Findings()
    if minimum is not None and have < version_tuple(minimum):
        f.add(FAIL, f"driver {installed} is older than the minimum {minimum}", remedy=upgrade)
    if pinned is not None and have != version_tuple(pinned):
        f.add(
            FAIL,
            f"driver {installed} differs from the pinned {pinned}",
            remedy="re-run bringup.yml to install the pinned driver, or update gpufleet_thresholds.driver_version",
        )
    if minimum is None and pinned is None:
        f.add(
            WARN,
            f"driver {installed}; neither a minimum nor a pin is set",
            remedy="set gpufleet_thresholds.driver_version_min",
        )
    ok = f"driver {installed}" + (f" >= {minimum}" if minimum else "") + (", matches the pin" if pinned else "")
    if pinned is None:
        f.add(PASS, "no site pin set (driver_version)")
    return f.result("driver_version", ok, **fields)


@gpu_check("vbios")
def vbios(readings, gpus, profile):
    """The same VBIOS on every GPU; a mix usually means a half-done firmware update."""
    by_version: dict[str, list] = {}
    f = Findings()
    for g in gpus:
        if g.get("vbios_version") is None:
            f.add(
                ERROR,
                f"VBIOS version unreadable ({unreadable(g, 'vbios_version')})",
                gpu=g["index"],
                remedy=UNREADABLE_REMEDY,
            )
        else:
            by_version.setdefault(g["vbios_version"], []).append(g["index"])
    if len(by_version) > 1:
        listing = "; ".join(f"{v} on {gpu_list(idx)}" for v, idx in by_version.items())
        f.add(
            WARN,
            f"VBIOS differs: {listing}",
            remedy="update the GPU firmware so every GPU runs the same VBIOS (vendor firmware bundle, nvfwupd)",
        )
    return f.result(
        "vbios",
        f"VBIOS {next(iter(by_version), None)} on every GPU",
        value=sorted(by_version),
        detail={"versions": by_version},
    )


@gpu_check("persistence_mode")
def persistence_mode(readings, gpus, profile):
    """Persistence mode on every GPU, so the driver stays loaded between jobs."""
    required = profiles.value(profile, "persistence_mode_required")
    f = Findings()
    per_gpu = [{"index": g["index"], "persistence_mode": g.get("persistence_mode")} for g in gpus]
    for g in gpus:
        mode = g.get("persistence_mode")
        if mode is None:
            f.add(
                ERROR,
                f"persistence mode unreadable ({unreadable(g, 'persistence_mode')})",
                gpu=g["index"],
                remedy=UNREADABLE_REMEDY,
            )
        elif required and not mode:
            f.add(
                FAIL,
                "persistence mode off",
                gpu=g["index"],
                remedy="enable nvidia-persistenced (bringup.yml, role nvidia_driver) or `nvidia-smi -i {gpus} -pm 1`",
            )
    on = sum(1 for p in per_gpu if p["persistence_mode"])
    if on < len(gpus):  # only passes this way when not required
        ok = f"persistence mode not required; on for {on} of {len(gpus)} GPUs"
    else:
        ok = "persistence mode on" + (f" for all {len(gpus)} GPUs" if len(gpus) > 1 else "")
    return f.result(
        "persistence_mode",
        ok,
        value=on,
        unit="GPUs",
        threshold=profiles.threshold(profile, "persistence_mode_required"),
        detail={"per_gpu": per_gpu},
    )


@gpu_check("mig_mode")
def mig_mode(readings, gpus, profile):
    """MIG off on every GPU: MIG splits a GPU into instances, and a training node needs whole GPUs."""
    f = Findings()
    per_gpu = [{"index": g["index"], "mig_mode_current": g.get("mig_mode_current")} for g in gpus]
    for g in gpus:
        mode = g.get("mig_mode_current")
        if mode is None and not_supported(g, "mig_mode_current"):
            f.add(PASS, "MIG not supported, so off", gpu=g["index"])
        elif mode is None:
            f.add(
                ERROR,
                f"MIG mode unreadable ({unreadable(g, 'mig_mode_current')})",
                gpu=g["index"],
                remedy=UNREADABLE_REMEDY,
            )
        elif mode:
            f.add(
                FAIL,
                "MIG enabled",
                gpu=g["index"],
                remedy="disable MIG for training: `nvidia-smi -i {gpus} -mig 0`, then reset the GPU or reboot",
            )
    return f.result("mig_mode", "MIG off on every GPU", detail={"per_gpu": per_gpu})


@gpu_check("compute_mode")
def compute_mode(readings, gpus, profile):
    """No GPU in the Prohibited compute mode, which refuses every CUDA context."""
    f = Findings()
    per_gpu = [{"index": g["index"], "compute_mode": g.get("compute_mode")} for g in gpus]
    reset = "set the default compute mode: `nvidia-smi -i {gpus} -c DEFAULT`"
    for g in gpus:
        mode = g.get("compute_mode")
        if mode is None:
            f.add(
                ERROR,
                f"compute mode unreadable ({unreadable(g, 'compute_mode')})",
                gpu=g["index"],
                remedy=UNREADABLE_REMEDY,
            )
        elif mode == "Prohibited":
            f.add(FAIL, "compute mode Prohibited: no process can use the GPU", gpu=g["index"], remedy=reset)
        elif mode == "Exclusive_Process":
            f.add(
                PASS,
                "compute mode Exclusive_Process: one process per GPU, as one rank per GPU training runs",
                gpu=g["index"],
            )
        elif mode != "Default":
            f.add(WARN, f"compute mode {mode}", gpu=g["index"], remedy=reset)
    modes = sorted({p["compute_mode"] for p in per_gpu if p["compute_mode"]})
    return f.result("compute_mode", f"compute mode {', '.join(modes)}", value=modes, detail={"per_gpu": per_gpu})
