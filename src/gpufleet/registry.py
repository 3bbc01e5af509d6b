"""Every check group, check, benchmark and output format, declared once: what the rest of the project reads.

- A check: its name, the group its results carry, the class of its warn and fail (failure_class.py says what
  each class means), the profile keys it judges against (files/profiles/generic.yml declares each), and, for the
  checks of a check group, the function that makes it (default: the check's name in `checks/<group>.py`;
  `file.function` in a group split into one file per concern, `checks/<group>/<file>.py`). A check whose
  figure is held against something declares what (`against`), where it is judged (`where`: on the node, or on
  the controller, which alone sees the run's other nodes) and how a figure past a limit is confirmed before it
  warns or fails (`confirm`, comparisons/confirm.py: measured again on the node; or, seen only where nobody can
  measure it again, inconclusive). A reading (a counter, a setting, an Xid) stands as read: no `confirm`.
- A check group (`gpufleet check --group G`, and the gpufleet.cluster module of the same name on the node).
- A benchmark (`gpufleet bench NAME`, the `benchmark` module's choices): the checks of its results, the run tiers
  (gpufleet_tier) it runs in, whether gpufleet_benchmarks may name it and does by default, whether it runs across
  nodes under torchrun, whether a sampler watches its GPUs (its `<name>_processes` result).
- An output format of the report: its key in the report's `files`, its file name, the module of
  `gpufleet.report` whose `render(report) -> str` writes it.

Where Ansible needs a literal copy (the modules' DOCUMENTATION and argument choices, module_utils/engine_schema.py,
roles/validate_node's argument_specs.yml, defaults and vars), tests/test_module_constants.py holds every copy to
this file. Nothing here imports the rest of gpufleet: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The failure classes (failure_class.py explains them).
HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE = "hardware", "environment", "configuration", "software"
CLASSES = (HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE)


# Profile keys of the host's own checks (generic.yml), named once so that each declaration holds on a line.
EDAC_CE_KEY, MEMORY_FREE = "host_edac_ce_per_day_warn", "host_memory_available_pct_min"

# What a figure is held against (Check.against).
LIMIT = "limit"  # a profile's minimum (or maximum) for the model
SAMPLES = "samples"  # its own timed samples: how many fell, how far, and what the sampler saw then (judge.samples)
SIBLINGS = "siblings"  # the node's other GPUs in the same run (or its other GPU pairs)
OWN_PAST = "own_past"  # the GPU's own place among its siblings in its earlier runs
BASELINE = "baseline"  # the baseline run's figure for this node or GPU
BASELINE_FLEET = "baseline_fleet"  # the baseline run's median over its nodes
FLEET = "fleet"  # this run's median over its nodes
# Where it is judged (Check.where), and how a figure past a limit is confirmed (Check.confirm).
NODE, CONTROLLER = "node", "controller"
MEASURED_AGAIN = "measured_again"  # on the node, in its stage, until clear of the limit or confirmed past it
INCONCLUSIVE = "inconclusive"  # nobody can measure it again: past a limit once, it is inconclusive, not a warn or fail


@dataclass(frozen=True)
class Check:
    name: str
    failure_class: str  # of its warn and fail; an `error` is software unless this is environment
    thresholds: tuple[str, ...] = ()  # the profile keys it judges against
    # A check group's check: its function in checks/<group>.py when not `name`; in a group split by concern
    # (checks/<group>/<file>.py), `file.function`.
    function: str | None = None
    against: tuple[str, ...] = ()  # what its figure is held against (LIMIT, SIBLINGS, ...); () for a reading
    where: str = NODE
    confirm: str | None = None  # MEASURED_AGAIN or INCONCLUSIVE; None: a reading, which stands as read

    @property
    def confirmed(self) -> bool:
        """A figure measured again on the node while it is past or near a limit (measure.watched)."""
        return self.confirm == MEASURED_AGAIN


@dataclass(frozen=True)
class Group:
    name: str
    checks: tuple[Check, ...]
    module: str | None = None  # the gpufleet.cluster module that runs the group on the node (node_steps' step)


@dataclass(frozen=True)
class Benchmark:
    name: str
    checks: tuple[Check, ...]  # the checks of its results (group `benchmark`, across nodes `benchmark_multinode`)
    run_tiers: tuple[str, ...]  # the gpufleet_tier values whose node stage runs it
    selectable: bool = True  # gpufleet_benchmarks may name it (acceptance tier)
    default: bool = False  # in gpufleet_benchmarks' default
    multinode: bool = False  # runs across nodes under torchrun (nnodes > 1)
    watched: bool = True  # a sampler lists its GPUs' processes: its `<name>_processes` result


@dataclass(frozen=True)
class Output:
    name: str  # its key in the report summary's `files`
    file: str  # under the run folder
    renderer: str  # the module of gpufleet.report whose render(report) -> str writes it


# ------------------------------------------------------------------------------------------------- check groups

CHECK_GROUPS = (
    Group(
        "gpu_inventory",
        module="gpu_inventory",
        checks=(
            Check("gpu_count", HARDWARE, ("gpus_expected", "driver_version")),
            Check("gpu_model", CONFIGURATION),
            Check("gpu_memory", HARDWARE, ("gpu_memory_min_mib",)),
            Check("driver_version", SOFTWARE, ("driver_version", "driver_version_min")),
            Check("vbios", SOFTWARE),
            Check("persistence_mode", CONFIGURATION, ("persistence_mode_required",)),
            Check("mig_mode", CONFIGURATION),
            Check("compute_mode", CONFIGURATION),
        ),
    ),
    Group(
        "gpu_health",
        module="gpu_health",
        checks=(
            Check(
                "ecc",
                HARDWARE,
                ("ecc_volatile_uncorrected_max", "ecc_aggregate_uncorrected_max"),
                function="memory.ecc",
            ),
            Check("row_remapping", HARDWARE, function="memory.row_remapping"),
            Check("retired_pages", HARDWARE, function="memory.retired_pages"),
            Check("xid", HARDWARE, ("xid_fail_codes",), function="faults.xid"),
            Check("clock_events", HARDWARE, function="throttling.clock_events"),
            Check(
                "temperature",
                HARDWARE,
                ("gpu_temperature_warn_c", "memory_temperature_warn_c"),
                function="throttling.temperature",
            ),
            Check("power_limit", CONFIGURATION, ("power_limit_min_ratio",), function="throttling.power_limit"),
            Check("pcie_link", HARDWARE, ("pcie_gen_min", "pcie_width_min"), function="links.pcie_link"),
            Check("nvlink", HARDWARE, ("gpus_expected", "nvlink_links_per_gpu"), function="links.nvlink"),
            Check("processes", ENVIRONMENT, function="occupancy.processes"),
        ),
    ),
    Group(
        "host_hygiene",
        module="host_hygiene",
        checks=(
            Check("pcie_acs", CONFIGURATION, function="pcie.check_pcie_acs"),
            Check("numa_affinity", CONFIGURATION, function="numa.check_numa_affinity"),
            Check("infiniband", HARDWARE, ("ib_ports_min", "ib_rate_min_gbps"), function="infiniband.check_infiniband"),
            Check("ib_port_speed", HARDWARE, function="infiniband.check_ib_port_speed"),
            Check("gpu_nic_rails", HARDWARE, function="infiniband.check_gpu_nic_rails"),
            Check(
                "pcie_aer",
                HARDWARE,
                ("fabric_aer_fatal_max", "fabric_aer_nonfatal_max"),
                function="pcie.check_pcie_aer",
            ),
            Check("peermem", SOFTWARE, function="infiniband.check_peermem"),
            Check("iommu", CONFIGURATION, ("iommu_passthrough_required",), function="kernel.check_iommu"),
            Check("numa_balancing", CONFIGURATION, ("numa_balancing_expected",), function="numa.check_numa_balancing"),
            Check("cpu_governor", CONFIGURATION, ("cpu_governor_expected",), function="kernel.check_cpu_governor"),
            Check("fabric_manager", SOFTWARE, function="kernel.check_fabric_manager"),
            Check("nccl_env", CONFIGURATION, function="nccl_env.check_nccl_env"),
            Check("bringup_drift", CONFIGURATION, ("bringup_required",), function="bringup.check_bringup_drift"),
            # the host's own hardware: memory errors (EDAC, machine checks), its memory free for a job, its NVMe drives
            Check("memory_errors", HARDWARE, ("host_edac_ue_max", EDAC_CE_KEY), function="memory.check_memory_errors"),
            Check("machine_checks", HARDWARE, function="memory.check_machine_checks"),
            Check("memory_available", ENVIRONMENT, (MEMORY_FREE,), function="memory.check_memory_available"),
            Check("nvme_health", HARDWARE, ("nvme_percentage_used_warn",), function="nvme.check_nvme_health"),
        ),
    ),
)

# ------------------------------------------------------------------------------------------------- benchmarks

BENCHMARK_GROUP = "benchmark"  # the node's own benchmarks
MULTINODE_GROUP = "benchmark_multinode"  # the NCCL and training runs across nodes
# How much each benchmark measures: smoke seconds a benchmark (one matmul shape in bf16, a short HBM pass,
# all_reduce at a few sizes); quick minutes a node; thorough the full sweeps. The soak runs for its own duration.
BENCHMARK_TIERS = ("smoke", "quick", "thorough")
# gpufleet_tier: smoke (the smoke benchmarks), acceptance (gpufleet_benchmarks, then the runs across nodes), soak.
RUN_TIERS = ("smoke", "acceptance", "soak")

# A quick benchmark figure judged from its samples, and measured again while close to its limit (checks/figures.py).
SAMPLED = ("sample_drop_pct_max", "sample_drops_allowed", "confirm_band_pct")
AGAIN = {"where": NODE, "confirm": MEASURED_AGAIN}
SAMPLED_FIGURE = {"against": (LIMIT, SAMPLES), **AGAIN}
HOST_MEMORY_KEYS, SCRATCH_FREE = ("host_memory_gbps_min", "host_memory_numa_below_pct_max"), "disk_scratch_free_gib_min"

BENCHMARKS = (
    Benchmark(
        "matmul",
        run_tiers=("smoke", "acceptance"),
        default=True,
        checks=(
            Check(
                "matmul_bf16",
                HARDWARE,
                ("matmul_bf16_tflops_min", "matmul_spread_pct_max") + SAMPLED,
                **SAMPLED_FIGURE,
            ),
        ),
    ),
    Benchmark(
        "memory",
        run_tiers=("smoke", "acceptance"),
        default=True,
        checks=(
            Check("memory_bandwidth", HARDWARE),
            Check("hbm_bandwidth", HARDWARE, ("hbm_copy_gbps_min",) + SAMPLED, **SAMPLED_FIGURE),
            Check("pcie_h2d_bandwidth", HARDWARE, ("pcie_h2d_gbps_min",) + SAMPLED, **SAMPLED_FIGURE),
            Check("pcie_d2h_bandwidth", HARDWARE, ("pcie_d2h_gbps_min",) + SAMPLED, **SAMPLED_FIGURE),
        ),
    ),
    Benchmark(
        "nccl",
        run_tiers=("smoke", "acceptance"),
        default=True,
        multinode=True,
        checks=(
            Check("nccl", SOFTWARE),
            Check("nccl_sendrecv", HARDWARE, ("nccl_sendrecv_pair_ratio_min",), against=(SIBLINGS,), **AGAIN),
            Check("nccl_transport", CONFIGURATION),
            Check("nccl_all_reduce", HARDWARE, ("nccl_allreduce_busbw_gbps_min",), against=(LIMIT,), **AGAIN),
            Check("nccl_all_gather", HARDWARE),
            Check("nccl_reduce_scatter", HARDWARE),
            Check("nccl_all_to_all", HARDWARE),
        ),
    ),
    Benchmark(
        "sdc",
        run_tiers=("acceptance", "soak"),
        default=True,
        watched=False,
        checks=(Check("sdc", HARDWARE, ("driver_version",)),),
    ),
    # The host's own throughput beside the GPUs (bench.host: memory per NUMA node, the scratch drive, a data loader)
    Benchmark(
        "host",
        run_tiers=("acceptance",),
        default=True,
        checks=(
            Check("host_memory_bandwidth", HARDWARE, HOST_MEMORY_KEYS, against=(LIMIT, SIBLINGS), **AGAIN),
            Check("disk_write_bandwidth", HARDWARE, ("disk_write_gbps_min", SCRATCH_FREE), against=(LIMIT,), **AGAIN),
            Check("disk_read_bandwidth", HARDWARE, ("disk_read_gbps_min", SCRATCH_FREE), against=(LIMIT,), **AGAIN),
            Check("data_loader", HARDWARE, ("loader_tokens_per_s_per_gpu_min",), against=(LIMIT,), **AGAIN),
        ),
    ),
    Benchmark(
        "train_gpt2",
        run_tiers=("acceptance",),
        multinode=True,
        checks=(
            Check(
                "train_gpt2",
                SOFTWARE,
                ("train_gpt2_tokens_per_s_per_gpu_min", "bf16_dense_peak_tflops"),
                against=(LIMIT,),
                **AGAIN,
            ),
            Check("train_scaling", HARDWARE, ("train_scaling_efficiency_min",), against=(LIMIT,), **AGAIN),
        ),
    ),
    Benchmark(
        "soak",
        run_tiers=("soak",),
        selectable=False,
        checks=(
            Check("soak", SOFTWARE, ("soak_remeasure_max_s",)),
            Check("soak_throttle", HARDWARE, ("soak_throttle_s_max", "xid_fail_codes")),
            Check(
                "soak_errors",
                HARDWARE,
                (
                    "xid_fail_codes",
                    "fleet_counter_nvlink_crc_per_s_fail",
                    "fleet_counter_nvlink_replay_recovery_max",
                    "fleet_counter_pcie_replay_per_min_warn",
                ),
            ),
            Check("soak_slowdown", HARDWARE, ("soak_slowdown_pct_max",)),
        ),
    ),
)

# ------------------------------------------------------------------------------------------------- the other groups

ONLY_THE_CONTROLLER = {"where": CONTROLLER, "confirm": INCONCLUSIVE}

# Results made outside the check groups and the benchmarks: each group's checks, in the order they come.
OTHER_GROUPS = (
    Group("profile", checks=(Check("profile", CONFIGURATION),)),
    Group(
        "counters",
        module="gpu_counters",
        checks=(
            Check("snapshot_before", SOFTWARE),
            Check("snapshot_after", SOFTWARE),
            Check("fabric_before", SOFTWARE),
            Check("fabric_after", SOFTWARE),
            Check("processes_after", ENVIRONMENT),
        ),
    ),
    Group("lock", module="node_lock", checks=(Check("node_lock", ENVIRONMENT),)),
    Group("connection", checks=(Check("reachable", ENVIRONMENT),)),
    Group(
        "finetune",
        checks=(
            Check("finetune", SOFTWARE, ("finetune_tokens_per_s_per_gpu_min", "bf16_dense_peak_tflops")),
            Check("finetune_processes", ENVIRONMENT),
        ),
    ),
    Group("report", checks=(Check("results_file", SOFTWARE),)),
    # a sweep's Slurm job that ended without finishing its node stage (its time limit, a failure, its node lost)
    Group("sweep", checks=(Check("sweep_job", ENVIRONMENT),)),
    Group(
        "fleet",
        checks=(
            Check(
                "gpu_vs_node",
                HARDWARE,
                ("fleet_gpu_below_node_warn_pct", "fleet_gpu_below_node_fail_pct", "fleet_below_baseline_warn_pct"),
                against=(SIBLINGS, OWN_PAST),
                **AGAIN,
            ),
            Check(
                "node_vs_fleet",
                HARDWARE,
                ("fleet_node_below_fleet_warn_pct", "fleet_node_below_fleet_fail_pct", "fleet_min_nodes"),
                against=(FLEET,),
                **ONLY_THE_CONTROLLER,
            ),
            Check(
                "node_vs_baseline",
                HARDWARE,
                ("fleet_below_baseline_warn_pct", "fleet_below_baseline_fail_pct"),
                against=(BASELINE,),
                **AGAIN,
            ),
            Check(
                "node_vs_baseline_fleet",
                HARDWARE,
                ("fleet_below_baseline_warn_pct", "fleet_below_baseline_fail_pct"),
                against=(BASELINE_FLEET,),
                **AGAIN,
            ),
            # A GPU's samples spread far more than its siblings': the node's own samples judgement (judge.samples,
            # SAMPLES above) measures such a figure again; here only the controller compares the spreads.
            Check(
                "sample_spread",
                ENVIRONMENT,
                ("fleet_sample_spread_pct_floor", "fleet_sample_spread_ratio_max"),
                against=(SIBLINGS,),
                **ONLY_THE_CONTROLLER,
            ),
            Check(
                "counters_during_run",
                HARDWARE,
                (
                    "fleet_counter_ecc_corrected_per_h_max",
                    "fleet_counter_nvlink_crc_per_s_fail",
                    "fleet_counter_nvlink_replay_recovery_max",
                    "fleet_counter_pcie_replay_per_min_warn",
                    "fleet_counter_row_remap_per_h_max",
                    "fleet_counter_xid_per_h_max",
                    "fleet_counter_min_window_h",
                ),
            ),
            Check("counters_since_previous_run", HARDWARE),
            Check(
                "fabric_during_run",
                HARDWARE,
                (
                    "fabric_aer_correctable_per_min_fail",
                    "fabric_ib_ber_max",
                    "fabric_ib_fatal_errors_max",
                    "fabric_ib_link_downed_max",
                    "fabric_ib_link_error_recovery_per_min_max",
                    "fabric_ib_local_ack_timeout_per_h_max",
                    "fabric_ib_rcv_errors_per_h_max",
                    "fabric_ib_xmit_discards_per_h_max",
                    "host_edac_ue_max",
                    EDAC_CE_KEY,
                    "nvme_media_errors_max",
                ),
            ),
            Check("fabric_since_previous_run", HARDWARE),
            Check("ib_ports_vs_fleet", HARDWARE, ("fleet_fabric_reference_share_min",)),
            Check("rails_vs_fleet", HARDWARE, ("fleet_fabric_reference_share_min",)),
            Check("returning_gpu", HARDWARE),
            # fleet.sdc and fleet.versions: the fleet's own judgement of checks whose node-side name means another
            Check("fleet.sdc", HARDWARE),
            Check("fleet.versions", CONFIGURATION),
        ),
    ),
)
# A module that could not run on the node: an `error` of the module's group, check `engine`.
ENGINE_CHECK = Check("engine", SOFTWARE)
# The seconds a node's benchmarks spent measuring again, and why (group benchmark; measure.measured_again).
MEASURED_AGAIN_CHECK = Check("measured_again", SOFTWARE)
# The PCIe links of the NICs, the GPUs and the ports above them, at the best the benchmarks loaded them to (group
# benchmark; checks.pcie_links).
PCIE_LINKS_CHECK = Check("pcie_links", HARDWARE)

# Profile keys no single check owns: the watch of every benchmark (measure again when disturbed, on the GPUs or
# the host, confirm a figure within a budget) and `gpufleet fleet locate`.
SHARED_THRESHOLDS = (
    "confirm_remeasure_max",
    "confirm_budget_s",
    "disturbed_remeasure_max",
    "disturbed_wait_s",
    "host_foreign_cpu_share_max",
    "host_swap_mib_s_max",
    "host_foreign_io_mib_s_max",
    "locate_busbw_ratio_min",
)

# ------------------------------------------------------------------------------------------------- outputs

# The report's renderings of report.json, written in this order (report/pipeline.py loops over them).
OUTPUTS = (
    Output("json", "report.json", "render_json"),
    Output("md", "report.md", "render_md"),
    Output("html", "report.html", "render_html"),
    Output("junit", "junit.xml", "render_junit"),
)

# ------------------------------------------------------------------------------------------------- lookups


def group(name: str) -> Group:
    """A check group by name; KeyError names the groups there are."""
    for g in CHECK_GROUPS:
        if g.name == name:
            return g
    raise KeyError(f"no check group {name!r}; expected one of {group_names()}")


def group_names() -> tuple[str, ...]:
    return tuple(g.name for g in CHECK_GROUPS)


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


def tier_benchmarks(run_tier: str) -> tuple[str, ...]:
    """The benchmarks a run tier runs; in acceptance, those gpufleet_benchmarks names (all it may name here)."""
    return tuple(b.name for b in BENCHMARKS if run_tier in b.run_tiers)


def watched_checks() -> tuple[Check, ...]:
    """`<step>_processes` of every watched benchmark: what else ran on its GPUs while it measured."""
    return tuple(Check(f"{b.name}_processes", ENVIRONMENT) for b in BENCHMARKS if b.watched)


def comparison_checks(where: str | None = None) -> tuple[Check, ...]:
    """The checks of group fleet that hold a figure against something (`against`), those judged `where`."""
    fleet = next(g for g in OTHER_GROUPS if g.name == "fleet")
    return tuple(c for c in fleet.checks if c.against and (where is None or c.where == where))


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
    keys = set(SHARED_THRESHOLDS)
    for g in CHECK_GROUPS + OTHER_GROUPS:
        keys.update(k for c in g.checks for k in c.thresholds)
    for b in BENCHMARKS:
        keys.update(k for c in b.checks for k in c.thresholds)
    return keys
