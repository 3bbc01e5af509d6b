"""Every check group, check, benchmark, run tier, metric and report output, declared once, so that nobody keeps a
table of special cases beside it; the functions that give an entry its behaviour registered here by the modules that
hold them (registers(), ROLES). What the rest of the project reads. A benchmark is declared in its own folder
(benchmarks/<name>/<name>_declared.py, through declare() below), which the package root's import of the
declarations index makes before anything reads BENCHMARKS or METRICS.

The kinds of entry, and what each declares, are in entries.py.

Nothing here imports the rest of gpufleet but entries.py: every layer may read it.
"""

from __future__ import annotations

import functools
import re

from gpufleet.base.entries import (  # noqa: F401 (the kinds and words every reader of the registry names)
    HARDWARE,
    ENVIRONMENT,
    CONFIGURATION,
    SOFTWARE,
    CLASSES,
    LIMIT,
    SAMPLES,
    SIBLINGS,
    OWN_PAST,
    BASELINE,
    BASELINE_FLEET,
    FLEET,
    NODE,
    CONTROLLER,
    MEASURED_AGAIN,
    INCONCLUSIVE,
    Check,
    Group,
    Benchmark,
    Threshold,
    RunTier,
    Metric,
    Output,
    ROLES,
    registers,
    registered,
)

# Profile keys of the host's own checks (generic.yml), named once so that each declaration holds on a line.
EDAC_CE_KEY, MEMORY_FREE = "host_edac_ce_per_day_warn", "host_memory_available_pct_min"

# The tables below keep one entry a line where it fits, which `ruff format` would spread over several.
# fmt: off

# ------------------------------------------------------------------------------------------------- check groups

CHECK_GROUPS = (
    Group("gpu_inventory", checks=(
        Check("gpu_count", HARDWARE, ("gpus_expected", "driver_version")),
        Check("gpu_model", CONFIGURATION),
        Check("gpu_memory", HARDWARE, ("gpu_memory_min_mib",)),
        Check("driver_version", SOFTWARE, ("driver_version", "driver_version_min")),
        Check("vbios", SOFTWARE),
        Check("persistence_mode", CONFIGURATION, ("persistence_mode_required",)),
        Check("mig_mode", CONFIGURATION),
        Check("compute_mode", CONFIGURATION),
    )),
    Group("gpu_health", checks=(
        Check("ecc", HARDWARE, ("ecc_volatile_uncorrected_max", "ecc_aggregate_uncorrected_max")),
        Check("row_remapping", HARDWARE),
        Check("retired_pages", HARDWARE),
        Check("xid", HARDWARE, ("xid_fail_codes",)),
        Check("clock_events", HARDWARE),
        Check("temperature", HARDWARE, ("gpu_temperature_warn_c", "memory_temperature_warn_c")),
        Check("power_limit", CONFIGURATION, ("power_limit_min_ratio",)),
        Check("pcie_link", HARDWARE, ("pcie_gen_min", "pcie_width_min")),
        Check("nvlink", HARDWARE, ("gpus_expected", "nvlink_links_per_gpu")),
        Check("processes", ENVIRONMENT),
    )),
    Group("host_hygiene", checks=(
        Check("pcie_acs", CONFIGURATION),
        Check("numa_affinity", CONFIGURATION),
        Check("infiniband", HARDWARE, ("ib_ports_min", "ib_rate_min_gbps")),
        Check("ib_port_speed", HARDWARE),
        Check("gpu_nic_rails", HARDWARE),
        Check("pcie_aer", HARDWARE, ("fabric_aer_fatal_max", "fabric_aer_nonfatal_max")),
        Check("peermem", SOFTWARE),
        Check("iommu", CONFIGURATION, ("iommu_passthrough_required",)),
        Check("numa_balancing", CONFIGURATION, ("numa_balancing_expected",)),
        Check("cpu_governor", CONFIGURATION, ("cpu_governor_expected",)),
        Check("fabric_manager", SOFTWARE),
        Check("nccl_env", CONFIGURATION),
        Check("bringup_drift", CONFIGURATION, ("bringup_required",)),
        # the host's own hardware: memory errors (EDAC, machine checks), its memory free for a job, its NVMe drives
        Check("memory_errors", HARDWARE, ("host_edac_ue_max", EDAC_CE_KEY)),
        Check("machine_checks", HARDWARE),
        Check("memory_available", ENVIRONMENT, (MEMORY_FREE,)),
        Check("nvme_health", HARDWARE, ("nvme_percentage_used_warn",)),
    )),
)

# ------------------------------------------------------------------------------------------------- benchmarks

BENCHMARK_GROUP = "benchmark"  # the node's own benchmarks
MULTINODE_GROUP = "benchmark_multinode"  # the NCCL and training runs across nodes
# How much each benchmark measures (`depth`); the soak runs for its own duration.
DEPTHS = {
    "smoke": "seconds a benchmark: one matmul shape in bf16, a short HBM pass, all_reduce at a few sizes",
    "quick": "a few sizes and shapes, minutes a node",
    "thorough": "the full sweeps",
}
DEFAULT_DEPTH = "quick"

# A quick benchmark figure judged from its samples, and measured again while close to its limit (checks/figures.py).
SAMPLED = ("sample_drop_pct_max", "sample_drops_allowed", "confirm_band_pct")
AGAIN = {"where": NODE, "confirm": MEASURED_AGAIN}
SAMPLED_FIGURE = {"against": (LIMIT, SAMPLES), **AGAIN}
SOAK_COUNTERS = ("fleet_counter_nvlink_crc_per_s_fail", "fleet_counter_nvlink_replay_recovery_max",
                 "fleet_counter_pcie_replay_per_min_warn")

# Each benchmark is declared in its folder, benchmarks/<name>/<name>_declared.py, through declare() below; the
# declarations index (benchmarks/__init__.py, one line a benchmark, in the order of a node stage) imports them, and
# the package root imports that index, so whoever reads the registry finds them here.
BENCHMARKS: tuple[Benchmark, ...] = ()

# ------------------------------------------------------------------------------------------------- run tiers

RUN_TIERS = (
    RunTier("smoke", "minutes a node: the checks, the counters, a short pass of matmul, HBM and NCCL inside the node",
            depth="smoke", sweep_minutes=10),
    RunTier("acceptance", "the checks, the node benchmarks of gpufleet_benchmarks at gpufleet_benchmark_depth, then "
            "the runs across nodes", chosen=True, across_nodes=True, sweep_minutes=20),
    RunTier("soak", "the checks, then gpufleet_soak_duration_s of sustained load while a sampler watches every GPU, "
            "then the SDC hashes at the temperature the soak left"),
)
DEFAULT_RUN_TIER = "acceptance"

# ------------------------------------------------------------------------------------------------- the other groups

ONLY_THE_CONTROLLER = {"where": CONTROLLER, "confirm": INCONCLUSIVE}
BELOW_BASELINE = ("fleet_below_baseline_warn_pct", "fleet_below_baseline_fail_pct")
COUNTER_KEYS = ("fleet_counter_ecc_corrected_per_h_max", *SOAK_COUNTERS, "fleet_counter_row_remap_per_h_max",
                "fleet_counter_xid_per_h_max", "fleet_counter_min_window_h")
FABRIC_KEYS = ("fabric_aer_correctable_per_min_fail", "fabric_ib_ber_max", "fabric_ib_fatal_errors_max",
               "fabric_ib_link_downed_max", "fabric_ib_link_error_recovery_per_min_max",
               "fabric_ib_local_ack_timeout_per_h_max", "fabric_ib_rcv_errors_per_h_max", "fabric_ib_xmit_discards_per_h_max",
               "host_edac_ue_max", EDAC_CE_KEY, "nvme_media_errors_max")

# Results made outside the check groups and the benchmarks: each group's checks, in the order they come.
OTHER_GROUPS = (
    Group("profile", checks=(
        Check("profile", CONFIGURATION, text="a profile matches the GPU; none warns, as no model figure is checked"),
    )),
    Group("counters", checks=(
        Check("snapshot_before", SOFTWARE, text="each GPU's error counters before the benchmarks"),
        Check("snapshot_after", SOFTWARE, text="each GPU's error counters after the benchmarks"),
        Check("fabric_before", SOFTWARE,
              text="the fabric's and host's counters before the benchmarks (InfiniBand, AER, EDAC, NVMe)"),
        Check("fabric_after", SOFTWARE,
              text="the fabric's and host's counters after the benchmarks (InfiniBand, AER, EDAC, NVMe)"),
        Check("processes_after", ENVIRONMENT, text="no other process on the node's GPUs after the benchmarks"),
    )),
    Group("lock", checks=(
        Check("node_lock", ENVIRONMENT, text="this run holds the node's lock; held by another, nothing is measured"),
    )),
    Group("connection", checks=(
        Check("reachable", ENVIRONMENT, text="Ansible reached the node: an `error` carries the connection message"),
    )),
    Group("finetune", checks=(
        Check("finetune", SOFTWARE, ("finetune_tokens_per_s_per_gpu_min", "bf16_dense_peak_tflops"),
              text="the LoRA fine-tune across the nodes ended, its loss went down, its eval ran"),
        Check("finetune_processes", ENVIRONMENT,
              text="what else ran beside the fine-tune, as `benchmark.<step>_processes`"),
    )),
    Group("report", checks=(
        Check("results_file", SOFTWARE, text="the node's results file on the controller is readable and holds results"),
    )),
    Group("sweep", checks=(
        Check("sweep_job", ENVIRONMENT,
              text="a sweep's Slurm job that ended before its node stage (its time limit, a failure, its node lost)"),
    )),
    Group("fleet", checks=(
        # The comparisons, each made by its registered `check` on the controller, in this order; those judged on the
        # node too by its registered `rows` there (comparisons/node.py), against the references the node was handed.
        Check("gpu_vs_node", HARDWARE, ("fleet_gpu_below_node_warn_pct", "fleet_gpu_below_node_fail_pct",
              "fleet_below_baseline_warn_pct"), against=(SIBLINGS, OWN_PAST), **AGAIN),
        Check("node_vs_fleet", HARDWARE, ("fleet_node_below_fleet_warn_pct", "fleet_node_below_fleet_fail_pct",
              "fleet_min_nodes"), against=(FLEET,), **ONLY_THE_CONTROLLER),
        Check("node_vs_baseline", HARDWARE, BELOW_BASELINE, against=(BASELINE,), **AGAIN),
        Check("node_vs_baseline_fleet", HARDWARE, BELOW_BASELINE, against=(BASELINE_FLEET,), **AGAIN),
        # A GPU's samples spread far more than its siblings': the node's own samples judgement (judge.samples,
        # SAMPLES above) measures such a figure again; here only the controller compares the spreads.
        Check("sample_spread", ENVIRONMENT, ("fleet_sample_spread_pct_floor", "fleet_sample_spread_ratio_max"),
              against=(SIBLINGS,), **ONLY_THE_CONTROLLER),
        Check("counters_during_run", HARDWARE, COUNTER_KEYS, text="each GPU's error counters' growth during the run"),
        Check("counters_since_previous_run", HARDWARE,
              text="each GPU's error counters' growth since its snapshot of an earlier run"),
        Check("fabric_during_run", HARDWARE, FABRIC_KEYS,
              text="the fabric's and host's counters' growth during the run"),
        Check("fabric_since_previous_run", HARDWARE,
              text="the fabric's and host's counters' growth since the node's previous run"),
        Check("ib_ports_vs_fleet", HARDWARE, ("fleet_fabric_reference_share_min",),
              text="each active port's rate and lanes against the same port on the other nodes"),
        Check("rails_vs_fleet", HARDWARE, ("fleet_fabric_reference_share_min",),
              text="the HCA beside each GPU against the one beside that GPU on the other nodes"),
        Check("returning_gpu", HARDWARE,
              text="a GPU (uuid or serial) that failed in an earlier run and is back, in any node"),
        # fleet.sdc and fleet.versions: the fleet's own judgement of checks whose node-side name means another
        Check("fleet.sdc", HARDWARE, text="the node's SDC hashes against the fleet's and the store's"),
        Check("fleet.versions", CONFIGURATION,
              text="software or firmware that differs from the run's majority or the baseline run's"),
    )),
)
# A step of the node stage that could not run on the node: an `error` of the step's group, check `engine`.
ENGINE_CHECK = Check("engine", SOFTWARE,
                     text="a step's module could not run the engine (interpreter, engine missing, bad input, timeout)")
# The seconds a node's benchmarks spent measuring again, and why (group benchmark; measure.measured_again).
MEASURED_AGAIN_CHECK = Check("measured_again", SOFTWARE,
                             text="the seconds the benchmarks spent measuring again, step by step; always `pass`")
# The PCIe links of the NICs, the GPUs and the ports above them, at the best the benchmarks loaded them to (group
# benchmark; checks.pcie_links).
PCIE_LINKS_CHECK = Check("pcie_links", HARDWARE,
                         text="each NIC's, GPU's and uplink's PCIe link under load, against what both its ends can do")

# Profile keys no single check owns: the watch of every benchmark (measure again when disturbed, on the GPUs or
# the host, confirm a figure within a budget) and `gpufleet fleet locate`.
SHARED_THRESHOLDS = ("confirm_remeasure_max", "confirm_budget_s", "disturbed_remeasure_max", "disturbed_wait_s",
                     "host_foreign_cpu_share_max", "host_swap_mib_s_max", "host_foreign_io_mib_s_max",
                     "host_cpu_steal_pct_max", "locate_busbw_ratio_min")

# ------------------------------------------------------------------------------------------------- metrics

# NCCL's size bands: latency-bound, in between, bandwidth-bound (the largest size of each, None: no end).
NCCL_BANDS = {"le_1MiB": 1 << 20, "le_64MiB": 64 << 20, "gt_64MiB": None}
BAND_WORDS = {"le_1MiB": "sizes up to 1 MiB", "le_64MiB": "sizes over 1 MiB up to 64 MiB", "gt_64MiB": "sizes over 64 MiB"}
SCOPES = {"node": "inside the node", "multinode": "across nodes"}
WHOLE_RUN = ("scope", "multinode")  # a figure of the whole run: compared with the baseline, never node to node
GB = 1e9

# What each metric key of the comparisons means; every metric is higher-is-better (comparisons/metric_keys.py).
# What each metric key of the comparisons means; every metric is higher-is-better (comparisons/metric_keys.py). A
# benchmark's own are declared with it (declare()); the fine-tune's, which is no benchmark, here.
METRICS = (
    Metric("finetune_{scope}_tokens_per_s_per_gpu", "LoRA fine-tune {scope}", "tokens/s/GPU",
           "gpufleet_finetune_tokens_per_second_per_gpu", words={"scope": SCOPES}, shared_when=WHOLE_RUN),
)

# ------------------------------------------------------------------------------------------------- outputs

# What a run folder holds beside its host documents: what the report writes, in this order (report/pipeline.py loops
# over report_outputs()): the fleet's files first, which report.json and the renderings then name; then what commands
# after the report write (the certificates: base/certificates.py).
OUTPUTS = (
    Output("fleet", "fleet.json"),
    Output("prometheus", "prometheus"),
    Output("drain", "drain.txt"),
    Output("json", "report.json"),
    Output("md", "report.md"),
    Output("html", "report.html"),
    Output("junit", "junit.xml"),
    Output("certificates", "certificates", made_by="certify"),
)

# How long a node's certificate stays valid after a run of each tier accepted it (profile keys; docs/certificates.md).
CERTIFICATE_VALIDITY = {t.name: f"certificate_valid_days_{t.name}" for t in RUN_TIERS}

# fmt: on

# ------------------------------------------------------------------------------------------------- lookups


def declare(benchmark: Benchmark, metrics: tuple[Metric, ...] = ()) -> Benchmark:
    """A benchmark's declaration and the metrics of its figures, made once by its folder's `<name>_declared.py`;
    a node stage runs the benchmarks in the order they were declared (the index's)."""
    global BENCHMARKS, METRICS
    if any(b.name == benchmark.name for b in BENCHMARKS):
        raise ValueError(f"benchmark {benchmark.name!r} is declared twice")
    BENCHMARKS += (benchmark,)
    METRICS += metrics
    _metric_patterns.cache_clear()
    return benchmark


def band_of(size_bytes: int) -> str:
    """The NCCL size band (NCCL_BANDS) a message size falls in."""
    for band, limit in NCCL_BANDS.items():
        if limit is None or size_bytes <= limit:
            return band
    return list(NCCL_BANDS)[-1]


def report_outputs() -> tuple[Output, ...]:
    """The outputs the report writes itself, in their order."""
    return tuple(o for o in OUTPUTS if o.made_by == "report")


def group(name: str) -> Group:
    """A check group by name; KeyError names the groups there are."""
    for g in CHECK_GROUPS:
        if g.name == name:
            return g
    raise KeyError(f"no check group {name!r}; expected one of {group_names()}")


def group_names() -> tuple[str, ...]:
    return tuple(g.name for g in CHECK_GROUPS)


def benchmark(name: str) -> Benchmark:
    return next(b for b in BENCHMARKS if b.name == name)


def benchmark_names(
    *, selectable: bool | None = None, default: bool | None = None, multinode: bool | None = None
) -> tuple[str, ...]:
    """The benchmarks' names, in their order, those with the given properties."""
    return tuple(
        b.name
        for b in BENCHMARKS
        if (selectable is None or b.selectable == selectable)
        and (default is None or b.default == default)
        and (multinode is None or b.multinode == multinode)
    )


def run_tier(name: str | None, said_as: str = "gpufleet_tier") -> RunTier:
    """A run tier by name (None: the default). The one check of a tier: ValueError naming the input as `said_as`
    says it (the variable for a node, the option of a command line) and the tiers there are."""
    for t in RUN_TIERS:
        if t.name == (name or DEFAULT_RUN_TIER):
            return t
    raise ValueError(f"{said_as} must be one of {', '.join(run_tier_names())}; got {name!r}")


def run_tier_names() -> tuple[str, ...]:
    return tuple(t.name for t in RUN_TIERS)


def tier_benchmarks(run_tier_name: str) -> tuple[str, ...]:
    """The benchmarks a run tier may run, in stage order; where it chooses, those gpufleet_benchmarks may name."""
    chosen = run_tier(run_tier_name).chosen
    return tuple(b.name for b in BENCHMARKS if run_tier_name in b.run_tiers and (b.selectable or not chosen))


def chosen_depths() -> tuple[str, ...]:
    """The depths gpufleet_benchmark_depth may name: those no run tier keeps for itself (smoke is the smoke tier's)."""
    return tuple(d for d in DEPTHS if d not in {t.depth for t in RUN_TIERS})


# The inputs of a node stage as the playbooks name them; `gpufleet node-stage` names them by its options.
STAGE_INPUTS = ("gpufleet_tier", "gpufleet_benchmarks", "gpufleet_benchmark_depth")


def stage_plan(
    tier: str | None,
    chosen: list[str] | tuple[str, ...] | None = None,
    depth: str | None = None,
    said_as: tuple[str, str, str] = STAGE_INPUTS,
) -> tuple[tuple[str, ...], str]:
    """What a run tier's node stage runs, at which depth: the one decision. The benchmarks are the tier's, in the order
    declared here, of those gpufleet_benchmarks may name the ones `chosen` names (None: all, or the default ones
    where the tier chooses); one it may not name always runs in its tier (the soak). The depth is the tier's own,
    else `depth` (gpufleet_benchmark_depth), else quick. ValueError names a value none of them may hold, as
    `said_as` names the three inputs. The controller checks a run's tier with it before any node (run_inputs, the
    sweep); the node looks its tier up here again and so says the same of a value typed by hand."""
    tier_as, chosen_as, depth_as = said_as
    t = run_tier(tier, tier_as)
    may = benchmark_names(selectable=True)
    wrong = [b for b in chosen or () if b not in may]
    if wrong:
        raise ValueError(f"{chosen_as} names {wrong[0]!r}; expected some of {', '.join(may)}, or none")
    if t.depth is None and depth is not None and depth not in chosen_depths():
        raise ValueError(f"{depth_as} {depth!r}; expected one of {', '.join(chosen_depths())}")
    picked = set(chosen) if chosen is not None else set(benchmark_names(default=True)) if t.chosen else None
    names = tuple(
        b.name for b in BENCHMARKS if t.name in b.run_tiers and (not b.selectable or picked is None or b.name in picked)
    )
    return names, t.depth or depth or DEFAULT_DEPTH


def watched_checks() -> tuple[Check, ...]:
    """`<step>_processes` of every watched benchmark: what else ran on its GPUs while it measured."""
    return tuple(
        Check(f"{b.name}_processes", ENVIRONMENT, text=f"what else ran on the GPUs and host beside the {b.name} step")
        for b in BENCHMARKS
        if b.watched
    )


def comparison_checks(where: str | None = None) -> tuple[Check, ...]:
    """The checks of group fleet that hold a figure against something (`against`), those judged `where` (a node's
    are judged on the controller too)."""
    fleet = next(g for g in OTHER_GROUPS if g.name == "fleet")
    return tuple(c for c in fleet.checks if c.against and (where is None or c.where == where))


@functools.lru_cache(maxsize=None)
def _metric_patterns() -> tuple[tuple[re.Pattern, Metric], ...]:
    def part(m: re.Match, metric: Metric) -> str:
        values = "|".join(map(re.escape, metric.words.get(m[1]) or ())) or r"\w+?"
        return f"(?P<{m[1]}>{values})"

    return tuple((re.compile(re.sub(r"\{(\w+)\}", lambda m: part(m, x), x.key)), x) for x in METRICS)


def metric(key: str) -> tuple[Metric, dict] | None:
    """The declaration of a metric key and the values of its fields, or None for a key nobody declared."""
    for pattern, declared in _metric_patterns():
        m = pattern.fullmatch(key)
        if m:
            return declared, m.groupdict()
    return None


def failure_classes() -> dict[str, str]:
    """check name (or `group.check` where a name is shared) -> the class of its warn and fail."""
    out: dict[str, str] = {}
    for g in CHECK_GROUPS + OTHER_GROUPS:
        out.update((c.name, c.failure_class) for c in g.checks)
    for b in BENCHMARKS:
        out.update((c.name, c.failure_class) for c in b.checks)
    out.update((c.name, c.failure_class) for c in watched_checks())
    out[ENGINE_CHECK.name] = ENGINE_CHECK.failure_class
    out[MEASURED_AGAIN_CHECK.name] = MEASURED_AGAIN_CHECK.failure_class
    out[PCIE_LINKS_CHECK.name] = PCIE_LINKS_CHECK.failure_class
    return out


def declared_thresholds() -> set[str]:
    """Every profile key a check or the shared machinery judges against."""
    keys = set(SHARED_THRESHOLDS) | set(CERTIFICATE_VALIDITY.values())
    for g in CHECK_GROUPS + OTHER_GROUPS:
        keys.update(k for c in g.checks for k in c.thresholds)
    for b in BENCHMARKS:
        keys.update(k for c in b.checks for k in c.thresholds)
    return keys
