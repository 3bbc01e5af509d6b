"""The node's host documents: check groups over readings (check_host), benchmarks (bench_host), the error
counters before and after the benchmarks (counters_host)."""

from __future__ import annotations

import os
import time

from gpufleet import collect, failure_class, profiles, schema
from gpufleet.bench import matmul, memory, nccl, sdc, soak
from gpufleet.bench.monitor import sampled
from gpufleet.checks import GROUPS, benchmarks, gpu_health, gpu_inventory
from gpufleet.checks import sdc as sdc_check
from gpufleet.checks import soak as soak_check
from gpufleet.checks.watched import foreign_processes, measured_again, watched
from gpufleet.collect import counters, kernel_log, nvml
from gpufleet.collect.host import read_boot_id, read_fabric
from gpufleet.errors import InputError
from gpufleet.train import gpt2


def visible_gpus(nvml_count: int) -> int:
    """GPUs this node's processes may use: NVML sees every GPU, CUDA only those CUDA_VISIBLE_DEVICES lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return nvml_count
    return min(nvml_count, len([x for x in listed.split(",") if x.strip()]))


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
    profile = profiles.resolve(
        schema.first_gpu_name(readings), profile_name=profile_name, overrides=overrides, profile_dir=profile_dir
    )
    results = []
    for group in groups:
        for name, fn in GROUPS[group]:
            results.append(schema.timed(group, name, lambda fn=fn: fn(readings, profile)))
    if profile["note"] and "gpu_inventory" in groups:  # said once per host, not once per group
        results.append(
            dict(
                schema.result("profile", schema.WARN, profile["note"], remedy="add a profile under files/profiles/ or set gpufleet_profile"),
                group="profile",
                started=started,
                seconds=0.0,
            )
        )
    return schema.host_document(host, profile, readings, started, t0, results)


BENCHMARKS = ("matmul", "memory", "nccl", "sdc", "train_gpt2", "soak")
# smoke: seconds a benchmark (one matmul shape in bf16, a short HBM pass, all_reduce at a few sizes);
# quick: minutes a node; thorough: the full sweeps. The soak runs for its own duration at any tier.
TIERS = ("smoke", "quick", "thorough")


def bench_host(
    names: list[str],
    *,
    tier: str = "quick",
    host: str | None = None,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir=None,
    nccl_options: dict | None = None,
    train_reference: dict | None = None,
    soak_options: dict | None = None,
) -> dict:
    """Run benchmarks on this host; one host document with group `benchmark`.

    `nccl_options` places nccl and train_gpt2 under torchrun (nnodes, node_rank, master, timeouts). Across nodes
    `train_reference` is this node's own single-node benchmark.train_gpt2 result from earlier in the run
    (status, value, reason, world_size): the cross-node scaling efficiency is measured against its figure.
    `soak_options` go to bench.soak.run (duration_s).
    """
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise InputError(f"unknown benchmark(s) {unknown}; expected some of {list(BENCHMARKS)}")
    if tier not in TIERS:
        raise InputError(f"benchmark tier {tier!r}; expected one of {list(TIERS)}")
    duration_s = (soak_options or {}).get("duration_s")
    if "soak" in names and duration_s is not None and not duration_s > 0:
        raise InputError(f"soak duration {duration_s} s; expected a positive number of seconds (--duration-s)")
    readings = {"nvml": collect.nvml.read(), "host": collect.host.read()}
    profile = profiles.resolve(schema.first_gpu_name(readings), profile_name=profile_name, overrides=overrides, profile_dir=profile_dir)
    started, t0 = schema.utc_now(), time.monotonic()
    host_has_ib = bool(((readings["host"].get("infiniband") or {}).get("ports")))
    # Steps whose sampler lists the GPUs' processes: measured again when disturbed, confirmed before a fail
    # (checks.watched); `watch_log` holds what each attempt saw, for the node's foreign_processes result.
    watch_log: list = []
    # With matmul in the same run, the SDC computations run in the matmul workers, after their timed products (no
    # second start of torch and CUDA per GPU): in its first attempt only (a remeasure of a disturbed matmul is
    # about speed; the hashes do not depend on it), kept here until the sdc step reports them.
    folded_sdc: dict = {}

    def matmul_run():
        out = matmul.run(tier, sdc_tier=tier if "sdc" in names and not folded_sdc else None)
        if "sdc" in out:
            folded_sdc["out"] = out.pop("sdc")
        return out

    def sdc_run():  # its own processes when matmul did not compute it (not in the run, after it, or crashed)
        if "out" not in folded_sdc:
            folded_sdc["out"] = sdc.run(tier, n_gpus=gpus)
        return folded_sdc["out"]

    gpus = visible_gpus(len(readings["nvml"].get("gpus") or []))
    # torchrun placement and limits, shared by the NCCL benchmark and the training gate.
    multi = {k: v for k, v in (nccl_options or {}).items()
             if k in ("nnodes", "node_rank", "master_addr", "master_port", "timeout_s", "rdzv_timeout_s")}
    # Across nodes a disturbed node cannot measure again alone: its peers would have to start with it.
    not_again = "every node of the run would have to measure again with it" if multi.get("nnodes", 1) > 1 else None
    runners = {
        "matmul": lambda: watched("matmul", matmul_run, benchmarks.matmul, profile, log=watch_log),
        "memory": lambda: watched("memory", lambda: memory.run(tier), benchmarks.memory, profile, log=watch_log),
        "nccl": lambda: watched(
            "nccl", lambda: sampled(lambda: nccl.run(tier, **(nccl_options or {}))),
            lambda out, prof: benchmarks.nccl(out, prof, host_has_ib=host_has_ib), profile, log=watch_log, not_again=not_again),
        # A disturbed soak is not run again in full: its disturbed windows are, bounded (checks.soak.remeasure_plan).
        "soak": lambda: watched("soak", lambda: soak.run(**(soak_options or {})), soak_check.soak, profile,
                                log=watch_log, confirm=False, combine=soak_check.combined,
                                again=lambda first: soak.run(**soak_check.remeasure_plan(first, profile))),
        "sdc": lambda: sdc_check.results(sdc_run(), profile, readings["nvml"]),
    }

    def train():
        # Across nodes every node starts together, so no one-GPU run first: the scaling is against this node's
        # single-node figure, which the run measured before (train_reference). Inside a node, one GPU first,
        # then every GPU of the node: their ratio is the scaling efficiency.
        single = gpt2.run(nproc_per_node=1) if gpus > 1 and multi.get("nnodes", 1) == 1 else None
        full = gpt2.run(**multi)
        return {"device": full.get("device"), "full": full, "single": single}

    runners["train_gpt2"] = lambda: watched(
        "train_gpt2", lambda: sampled(train),
        lambda out, prof: benchmarks.train_gpt2(out["full"], prof, single=out["single"], reference=train_reference),
        profile, log=watch_log, not_again=not_again)
    if gpus == 1 and (nccl_options or {}).get("nnodes", 1) == 1:
        runners["nccl"] = lambda: [schema.result("nccl", schema.SKIP, benchmarks.ONE_GPU_NCCL)]
    results = []
    for name in names:
        t1, when = time.monotonic(), schema.utc_now()
        try:
            batch = runners[name]()
        except Exception as exc:  # one broken benchmark must not hide the others
            batch = [schema.result(name, schema.ERROR, f"benchmark crashed: {type(exc).__name__}: {exc}")]
        for r in batch:
            r.update(group=benchmarks.GROUP, started=when, seconds=round(time.monotonic() - t1, 2))
            failure_class.stamp(r)  # its status may have changed after it was made
            gpu_inventory.name_flagged(r, readings["nvml"].get("gpus") or [])  # the serial beside the UUID
        results.extend(batch)
    for name in names:  # each watched step says what else ran on its GPUs; a CPU run has no GPU to watch
        steps = [e for e in watch_log if e["step"] == name]
        if any(e.get("device") == "cuda" for e in steps):
            r = foreign_processes(name, steps)
            r.update(group=benchmarks.GROUP, started=schema.utc_now(), seconds=0.0)
            results.append(r)
    if any(e.get("device") == "cuda" for e in watch_log):  # the time spent measuring again, and why (0: all clear)
        results.append({**measured_again(watch_log), "group": benchmarks.GROUP, "started": schema.utc_now(), "seconds": 0.0})
    return schema.host_document(host, profile, readings, started, t0, results)


def counters_host(phase: str, readings: dict | None = None, *, root: str = "/", host: str | None = None,
                  profile_name: str | None = None, overrides: dict | None = None, profile_dir=None) -> dict:
    """The counters host document: this host now (readings None) or a recording of `gpufleet collect`."""
    if phase not in counters.PHASES:
        raise ValueError(f"phase {phase!r}; expected one of {counters.PHASES}")
    started, t0 = schema.utc_now(), time.monotonic()
    if readings is None:
        boot_id, boot_error = read_boot_id(root)
        readings = {"nvml": nvml.read(), "kernel_log": kernel_log.read(root),
                    "host": {"kernel": os.uname().release, "boot_id": boot_id, **read_fabric(root)}}
    else:
        boot_id = (readings.get("host") or {}).get("boot_id")
        boot_error = None if boot_id else "the recording holds no boot id (host.boot_id)"
    profile = profiles.resolve(schema.first_gpu_name(readings), profile_name=profile_name, overrides=overrides,
                               profile_dir=profile_dir)
    res = [schema.timed(counters.GROUP, f"snapshot_{phase}", lambda: counters.snapshot(phase, readings, boot_id=boot_id, boot_id_error=boot_error)),
           schema.timed(counters.GROUP, counters.FABRIC_CHECK.format(phase=phase),
                        lambda: counters.fabric_snapshot(phase, readings, boot_id=boot_id, boot_id_error=boot_error))]
    if phase == "after":
        res.append(schema.timed(counters.GROUP, "processes_after", lambda: processes_after(readings, profile)))
    return schema.host_document(host, profile, readings, started, t0, res)


def processes_after(readings: dict, profile: dict) -> dict:
    """The GPUs' processes listed again at the end of the node stage, as gpu_health.processes lists them at the
    start: a process that came during the benchmarks and is still there fails the node."""
    nv = readings.get("nvml")
    if isinstance(nv, dict) and not nv.get("available") and nv.get("error") == nvml.NO_DRIVER:
        return schema.result("processes_after", schema.SKIP, f"{nvml.NO_DRIVER}, so there are no GPU processes to list")
    res = gpu_health.processes(readings, profile)
    res["check"] = "processes_after"
    if res["status"] not in (schema.PASS, schema.SKIP):
        res["reason"] = f"after the benchmarks: {res['reason']}"
    return res
