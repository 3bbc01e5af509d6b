"""The kernel and the node's services: IOMMU, the CPU frequency governor, NVIDIA Fabric Manager."""

from __future__ import annotations

from gpufleet.base import profiles
from gpufleet.checks.host_hygiene.readings import BRINGUP, devices, section
from gpufleet.base.schema import ERROR, FAIL, PASS, SKIP, WARN, result


def _cmdline_passthrough(flags: dict) -> bool:
    return flags.get("iommu") == "pt" or flags.get("iommu.passthrough") in ("1", "y", "on")


def _passthrough_option(readings: dict) -> str:
    """The boot option for IOMMU passthrough on this node's architecture: iommu=pt is x86's own."""
    arch = (readings.get("host") or {}).get("architecture")
    return "iommu.passthrough=1" if arch and arch != "x86_64" else "iommu=pt (with intel_iommu=on or amd_iommu=on)"


def check_iommu(readings: dict, profile: dict) -> dict:
    """The IOMMU's mode for the GPUs: translated DMA warns, or fails where iommu_passthrough_required is set."""
    name = "iommu"
    option = _passthrough_option(readings)
    if not devices(readings, "gpu"):
        return result(name, SKIP, "no NVIDIA GPU on the PCI bus")
    io, err = section(readings, name, "iommu")
    if err:
        return err
    required = profiles.value(profile, "iommu_passthrough_required")
    threshold = profiles.threshold(profile, "iommu_passthrough_required")
    detail = {k: io.get(k) for k in ("groups_path", "group_count", "gpu_groups", "cmdline_flags", "cmdline_path")}
    if not io.get("groups_present"):
        return result(
            name, PASS, f"no IOMMU active (no groups under {io.get('groups_path')})", threshold=threshold, detail=detail
        )
    groups = io.get("gpu_groups") or []
    translated = [g for g in groups if g.get("mode") == "translated"]
    other = [g for g in groups if g.get("mode") is None]
    if translated:
        return result(
            name,
            FAIL if required else WARN,
            f"IOMMU translates DMA for {len(translated)} GPU(s) (group type {translated[0]['type']}, "
            f"e.g. {translated[0]['bdf']}): GPUDirect RDMA and P2P pay for every translation",
            value=len(translated),
            unit="gpus",
            threshold=threshold,
            remedy=f"boot with {option} so host devices use identity mapping",
            detail=detail,
        )
    if other:
        if _cmdline_passthrough(io.get("cmdline_flags") or {}):
            return result(
                name,
                PASS,
                "GPU IOMMU group type not exposed; the kernel command line sets passthrough",
                threshold=threshold,
                detail=detail,
            )
        g = other[0]
        return result(
            name,
            WARN,
            f"IOMMU mode of {len(other)} GPU(s) unknown (e.g. {g['bdf']}: type {g.get('type')!r}, {g.get('reason') or 'not identity or DMA'}) "
            "and the kernel command line sets no passthrough",
            threshold=threshold,
            remedy=f"boot with {option.split(' (')[0]}, or confirm the GPUs are not assigned to vfio",
            detail=detail,
        )
    return result(
        name,
        PASS,
        f"IOMMU in passthrough (identity) for all {len(groups)} GPU group(s)",
        threshold=threshold,
        detail=detail,
    )


# --- kernel and CPU tuning -----------------------------------------------------------------


def check_cpu_governor(readings: dict, profile: dict) -> dict:
    """The CPU frequency governor of every CPU against cpu_governor_expected: a CPU on another fails."""
    name = "cpu_governor"
    gov, err = section(readings, name, "cpu_governors")
    if err:
        return err
    threshold = profiles.threshold(profile, "cpu_governor_expected")
    expected = threshold["value"]
    counts = gov.get("counts") or {}
    detail = {k: gov.get(k) for k in ("path", "counts", "cpus", "cpus_without_cpufreq")}
    if not gov.get("present"):
        return result(
            name, SKIP, "no CPU frequency scaling exposed (cpufreq absent)", threshold=threshold, detail=detail
        )
    if expected is None:
        return result(
            name,
            WARN,
            f"governors {counts}; cpu_governor_expected is not set",
            threshold=threshold,
            remedy="set gpufleet_thresholds.cpu_governor_expected",
            detail=detail,
        )
    off = {g: n for g, n in counts.items() if g != expected}
    if off:
        n_off = sum(off.values())
        return result(
            name,
            FAIL,
            f"{n_off} of {sum(counts.values())} CPUs not on the {expected} governor: {off}",
            value=n_off,
            unit="cpus",
            threshold=threshold,
            remedy=f"{BRINGUP}, or cpupower frequency-set -g {expected}",
            detail=detail,
        )
    return result(
        name,
        PASS,
        f"all {counts[expected]} CPUs with cpufreq use the {expected} governor",
        value=0,
        unit="cpus",
        threshold=threshold,
        detail=detail,
    )


# --- fabric manager --------------------------------------------------------------------------


def check_fabric_manager(readings: dict, profile: dict) -> dict:
    """nvidia-fabricmanager running where the node has NVSwitches: CUDA cannot start on their GPUs without it."""
    name = "fabric_manager"
    switches = devices(readings, "nvswitch")
    if not switches:
        return result(name, SKIP, "no NVSwitch on the PCI bus, so no fabric manager is needed")
    fabric_manager, err = section(readings, name, "fabricmanager")
    if err:
        return err
    detail = {"nvswitches": [s["bdf"] for s in switches], **fabric_manager}
    if not fabric_manager.get("asked") or not fabric_manager.get("state"):
        return result(
            name,
            ERROR,
            f"could not ask systemd about nvidia-fabricmanager: {fabric_manager.get('reason')}",
            detail=detail,
        )
    if fabric_manager["state"] == "active":
        return result(name, PASS, f"nvidia-fabricmanager active for {len(switches)} NVSwitch(es)", detail=detail)
    return result(
        name,
        FAIL,
        f"nvidia-fabricmanager is {fabric_manager['state']} with {len(switches)} NVSwitch(es) present: "
        "CUDA cannot start on these GPUs until it runs",
        remedy="systemctl enable --now nvidia-fabricmanager; its version must match the driver exactly "
        "(journalctl -u nvidia-fabricmanager says why it stopped)",
        detail=detail,
    )


# --- NCCL environment --------------------------------------------------------------------------
