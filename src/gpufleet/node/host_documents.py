"""The node's host documents: check groups over readings (check_host), benchmarks (bench_host), the error
counters before and after the benchmarks (counters_host)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

from gpufleet import collect
from gpufleet.base import host_platform, profiles, registry, schema
from gpufleet.node.measure import NodeSteps, visible_gpus
from gpufleet.checks import GROUPS, benchmarks, gpu_health, gpu_inventory, pcie_links
from gpufleet.comparisons.node import Held
from gpufleet.collect import counters, kernel_log, nvml
from gpufleet.collect.host import read_boot_id, read_fabric
from gpufleet.base.errors import InputError, did_you_mean, nearest

# A site's checks turned off on a node (gpufleet_checks_disabled, passed by the role to every engine process it
# starts there): each is reported as `skip` saying so, what it found kept in its detail.
CHECKS_DISABLED_ENV = "GPUFLEET_CHECKS_DISABLED"
CHECKS_DISABLED_VARIABLE = "gpufleet_checks_disabled"
# Groups whose checks are results of other steps than the check groups (the benchmarks, the counters, the profile).
OTHER_GROUPS = ("benchmark", "benchmark_multinode", "counters", "profile", "finetune")


def node_gpus(readings: dict) -> int | None:
    """The GPUs this node may use (CUDA_VISIBLE_DEVICES of the ones NVML sees): its topology's limits apply."""
    n = len(((readings.get("nvml") or {}) if isinstance(readings.get("nvml"), dict) else {}).get("gpus") or [])
    return visible_gpus(n) if n else None


def node_profile(readings: dict, profile_name: str | None, overrides: dict | None, profile_dir) -> dict:
    """The profile of the node the readings are of: by name when given, else its first GPU's model; its topology
    limits as for the GPUs it may use. Raises profiles.ProfileError for bad profile input."""
    return profiles.resolve(
        schema.first_gpu_name(readings),
        profile_name=profile_name,
        overrides=overrides,
        profile_dir=profile_dir,
        gpus=node_gpus(readings),
    )


def checks_disabled(listed=None) -> list[str]:
    """The checks turned off: `listed`, else CHECKS_DISABLED_ENV (JSON), each `group.check`; InputError naming the
    variable for one that is no check."""
    if listed is None:
        text = os.environ.get(CHECKS_DISABLED_ENV)
        try:
            listed = json.loads(text) if text else []
        except ValueError as exc:
            raise InputError(f"{CHECKS_DISABLED_ENV} is not JSON ({exc}); expected a list of group.check") from None
    if not isinstance(listed, list) or not all(isinstance(c, str) for c in listed):
        raise InputError(
            f"{CHECKS_DISABLED_VARIABLE} is {listed!r}; expected a list of checks, each group.check "
            "(for example [host_hygiene.pcie_acs])"
        )
    for cid in listed:
        group, _, check = cid.partition(".")
        known = [name for name, _ in GROUPS.get(group, [])]
        if not check or (group in GROUPS and check not in known) or (group not in GROUPS and group not in OTHER_GROUPS):
            # The nearest check of its group; of every group when the group is none.
            if known:
                near = nearest(check, known)
                expected = (
                    f" did you mean {group}.{near}?" if near else f" expected a check of {group}: {', '.join(known)}"
                )
            else:
                every = [f"{g}.{n}" for g, checks in GROUPS.items() for n, _ in checks]
                expected = did_you_mean(cid, every) or (
                    f" expected group.check, the group one of {', '.join([*GROUPS, *OTHER_GROUPS])}"
                )
            raise InputError(f"{CHECKS_DISABLED_VARIABLE}: {cid} is not a check;{expected}")
    return listed


def disabled(results: list) -> list:
    """The results with each check of checks_disabled() as `skip`, the line that turned it off as its reason."""
    off = checks_disabled()
    if not off:
        return results
    out = []
    for res in results:
        cid = f"{res.get('group')}.{res['check']}"
        if cid in off:
            as_found = {k: res.get(k) for k in ("status", "value", "unit", "reason")}
            stamped = {k: res[k] for k in ("started", "seconds") if k in res}
            res = schema.result(
                res["check"],
                schema.SKIP,
                f"turned off for this node: {CHECKS_DISABLED_VARIABLE}: [{cid}]",
                group=res.get("group"),
                detail={"disabled_by": CHECKS_DISABLED_VARIABLE, "found": as_found},
                **stamped,
            )
        out.append(res)
    return out


def check_host(
    readings: dict,
    groups: list[str] | None = None,
    *,
    host: str | None = None,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir=None,
) -> dict:
    """One host document. Raises profiles.ProfileError for bad profile input."""
    groups = groups or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise InputError(f"unknown check group(s) {unknown}; expected some of {list(GROUPS)}")
    started, t0 = schema.utc_now(), time.monotonic()
    profile = node_profile(readings, profile_name, overrides, profile_dir)
    results = []
    for group in groups:
        for name, fn in GROUPS[group]:
            results.append(schema.timed(group, name, lambda fn=fn: fn(readings, profile)))
    if profile["note"] and "gpu_inventory" in groups:  # said once per host, not once per group
        results.append(
            schema.result(
                "profile",
                schema.WARN,
                profile["note"],
                group="profile",
                started=started,
                seconds=0.0,
                remedy="add a profile of this model to the site's gpufleet_profile_dir, or set gpufleet_profile",
            )
        )
    elif profile.get("uncalibrated") and "gpu_inventory" in groups:  # information: nothing for the operator to do
        results.append(
            schema.result(
                "profile",
                schema.PASS,
                f"profile {profile['name']} is uncalibrated: {profile['uncalibrated']}",
                group="profile",
                detail={"path": profile["path"]},
                started=started,
                seconds=0.0,
            )
        )
    return schema.host_document(host, profile, readings, started, t0, disabled(results))


BENCHMARKS = registry.benchmark_names()
DEPTHS = registry.DEPTHS
NO_TORCH = "no torch in {python} (No module named 'torch'), which every benchmark needs"
NO_TORCH_REMEDY = (
    "install torch with CUDA in gpufleet_python (bringup.yml, role python_env), or set gpufleet_python to a "
    "Python that has it (`make validate` looks for one on the machine: NODE_PYTHON=...)"
)


def bench_problem(names: list[str], depth: str, torchrun: dict | None, options: dict | None) -> None:
    """InputError naming what `gpufleet bench` cannot run: an unknown benchmark or depth, benchmarks that cannot run
    across hosts asked to, a soak of no duration."""
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise InputError(f"unknown benchmark(s) {unknown}; expected some of {list(BENCHMARKS)}")
    nnodes = (torchrun or {}).get("nnodes") or 1
    alone = [n for n in names if n not in registry.benchmark_names(multinode=True)]
    if nnodes > 1 and alone:
        raise InputError(
            f"nnodes = {nnodes} runs across hosts, which only {' and '.join(registry.benchmark_names(multinode=True))} "
            f"do; got {', '.join(alone)}"
        )
    if depth not in DEPTHS:
        raise InputError(f"benchmark depth {depth!r}; expected one of {list(DEPTHS)}")
    duration_s = ((options or {}).get("soak") or {}).get("duration_s")
    if "soak" in names and duration_s is not None and not duration_s > 0:
        raise InputError(f"soak duration {duration_s} s; expected a positive number of seconds (--duration-s)")


def bench_host(
    names: list[str],
    *,
    depth: str = registry.DEFAULT_DEPTH,
    host: str | None = None,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir=None,
    torchrun: dict | None = None,
    options: dict | None = None,
    earlier: dict | None = None,
    references: dict | None = None,
) -> dict:
    """Run benchmarks on this host; one host document with group `benchmark`.

    measure.NodeSteps measures each at `depth` and judges it, as its registry.BENCHMARKS entry says
    (`torchrun`: its placement; `options`: each benchmark's, the soak's duration_s). Across nodes `earlier`'s train_gpt2 is this node's own single-node
    benchmark.train_gpt2 result from earlier in the run (status, value, reason, world_size): the cross-node
    scaling efficiency is measured against its figure. `references` (comparisons/node.py): what the controller
    holds this node's figures against (its baseline, its GPUs' past, the baseline's fleet), so that a figure past
    one of them is measured again here before anything warns or fails.
    """
    bench_problem(names, depth, torchrun, options)
    readings = {"nvml": collect.nvml.read(), "host": collect.host.read()}
    profile = node_profile(readings, profile_name, overrides, profile_dir)
    started, t0 = schema.utc_now(), time.monotonic()
    gpus = visible_gpus(len(readings["nvml"].get("gpus") or []))
    hold = Held(references, profile, readings["nvml"].get("gpus") or [], host) if references else None
    steps = NodeSteps(
        names,
        depth,
        gpus,
        profile,
        torchrun=torchrun,
        options=options,
        hold=hold,
        readings=readings,
        earlier=earlier,
    )
    no_torch = importlib.util.find_spec("torch") is None  # every benchmark needs it: one cause in the same words
    results = []
    for name in names:
        t1, when = time.monotonic(), schema.utc_now()
        try:
            if no_torch:
                batch = [
                    schema.result(name, schema.ERROR, NO_TORCH.format(python=sys.executable), remedy=NO_TORCH_REMEDY)
                ]
            else:
                batch = steps.measure(name)
        except Exception as exc:  # one broken benchmark must not hide the others
            batch = [schema.result(name, schema.ERROR, f"benchmark crashed: {type(exc).__name__}: {exc}")]
        for r in batch:
            gpu_inventory.name_flagged(r, readings["nvml"].get("gpus") or [])  # the serial beside the UUID
            results.append(r.replace(group=benchmarks.GROUP, started=when, seconds=round(time.monotonic() - t1, 2)))
    results += [r.replace(group=benchmarks.GROUP, started=schema.utc_now(), seconds=0.0) for r in steps.processes()]
    watched_links, loaded = steps.links()
    if watched_links:  # the PCIe links as the steps loaded them, every step's reading together
        results.append(
            pcie_links.pcie_links(watched_links, loaded, c2c_gpus(readings)).replace(
                group=benchmarks.GROUP, started=schema.utc_now(), seconds=0.0
            )
        )
    return schema.host_document(host, profile, readings, started, t0, disabled(results))


def counters_host(
    phase: str,
    readings: dict | None = None,
    *,
    root: str = "/",
    host: str | None = None,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir=None,
) -> dict:
    """The counters host document: this host now (readings None) or a recording of `gpufleet collect`."""
    if phase not in counters.PHASES:
        raise ValueError(f"phase {phase!r}; expected one of {counters.PHASES}")
    started, t0 = schema.utc_now(), time.monotonic()
    if readings is None:
        boot_id, boot_error = read_boot_id(root)
        readings = {
            "nvml": nvml.read(),
            "kernel_log": kernel_log.read(root),
            "host": {"kernel": os.uname().release, "boot_id": boot_id, **read_fabric(root)},
        }
    else:
        boot_id = (readings.get("host") or {}).get("boot_id")
        boot_error = None if boot_id else "the recording holds no boot id (host.boot_id)"
    profile = node_profile(readings, profile_name, overrides, profile_dir)
    res = [
        schema.timed(
            counters.GROUP,
            f"snapshot_{phase}",
            lambda: counters.snapshot(phase, readings, boot_id=boot_id, boot_id_error=boot_error),
        ),
        schema.timed(
            counters.GROUP,
            counters.FABRIC_CHECK.format(phase=phase),
            lambda: counters.fabric_snapshot(phase, readings, boot_id=boot_id, boot_id_error=boot_error),
        ),
    ]
    if phase == "after":
        res.append(schema.timed(counters.GROUP, "processes_after", lambda: processes_after(readings, profile)))
    return schema.host_document(host, profile, readings, started, t0, disabled(res))


def c2c_gpus(readings: dict) -> list[str]:
    """The PCI addresses of the GPUs that reach their CPU over NVLink-C2C (their PCIe links are not judged)."""
    gpus = (readings.get("nvml") or {}).get("gpus") or []
    return [
        g["pci_bus_id"] for g in gpus if host_platform.gpu_host_link(g) == host_platform.C2C and g.get("pci_bus_id")
    ]


def processes_after(readings: dict, profile: dict) -> dict:
    """The GPUs' processes listed again at the end of the node stage, as gpu_health.processes lists them at the
    start: a process that came during the benchmarks and is still there fails the node."""
    nv = readings.get("nvml")
    if isinstance(nv, dict) and not nv.get("available") and nv.get("error") == nvml.NO_DRIVER:
        return schema.result("processes_after", schema.SKIP, f"{nvml.NO_DRIVER}, so there are no GPU processes to list")
    res = gpu_health.occupancy.processes(readings, profile)
    if res["status"] not in (schema.PASS, schema.SKIP):
        return res.replace(check="processes_after", reason=f"after the benchmarks: {res['reason']}")
    return res.replace(check="processes_after")
