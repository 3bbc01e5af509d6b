"""The kinds of entry of the registry (registry.py holds the entries): what each declares.

- A check: its name, the group its results carry, the class of its warn and fail (failure_class.py says what
  each class means), the profile keys it judges against (files/profiles/generic.yml declares each, or the benchmark
  whose checks alone judge against it: Threshold); the function
  that makes it is registered by its module (registry.ROLES: `check`). A check whose figure is held against something declares what (`against`), where it is judged (`where`: on the node, or on
  the controller, which alone sees the run's other nodes), how a figure past a limit is confirmed before it warns
  or fails (`confirm`, comparisons/confirm.py: measured again on the node; or, seen only where nobody can measure
  it again, inconclusive), and, judged on the node too, registers its rows there (`rows`). A reading (a counter, a setting, an Xid) stands as read: no `confirm`.
- A check group (`gpufleet check --group G`, and the gpufleet.cluster module of the same name on the node).
- A benchmark (`gpufleet bench NAME`), declared in its folder (benchmarks/<name>/<name>_declared.py, registry.declare()):
  the checks of its results, the run tiers it runs in (in the order of the declarations index,
  benchmarks/__init__.py), whether gpufleet_benchmarks may name it and does by default, whether it runs across nodes under torchrun,
  whether a sampler watches its GPUs (its `<name>_processes` result); how it measures, how its output is judged,
  how it is measured again in part, are registered by the modules that do it (registry.ROLES: `run`, `judge`,
  `again`, `confirm`, `combine`).
- A run tier (gpufleet_tier, `gpufleet fleet run --tier`): what its node stage runs, at which depth, whether the
  runs across nodes follow it, how long a sweep's job of it may take. Checked once, on the controller before any
  node (run_tier()); what a node runs is stage_plan()'s lookup of it; Ansible reads it (plugins/filter/registry.py) or is generated from it (make generate).
- A metric: what a metric key of the comparisons means (label, unit, Prometheus family, per GPU or shared).
- An output of the report: its key in the report's `files`, its file (or folder) under the run folder; the function
  that makes it is registered by its module (registry.ROLES: `render` for a file of the finished report alone, or
  `write` for one that writes itself, given report/pipeline.py's Made: run_dir, report, fleet and options).
- A file of a reports folder (or of a node: its lock): its name (`<host>` for one a node), where it lies (the
  reports folder's top, each run folder, the node), its form (JSON, text, an SQLite store, a folder), what it holds,
  and what each command that reads or writes it does when it finds it damaged (`uses`: REFUSES, NAMES, MAKES,
  REPAIRS, GOES_ON, JUDGES, below), on the run it acts on, and on a run beside it (`beside`); layout.py holds them.
  The names the reports folder keeps for itself and the file-fault matrix (tests/test_file_faults.py) come from them.

Nothing here imports the rest of gpufleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The failure classes (failure_class.py explains them).
HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE = "hardware", "environment", "configuration", "software"
CLASSES = (HARDWARE, ENVIRONMENT, CONFIGURATION, SOFTWARE)

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
    against: tuple[str, ...] = ()  # what its figure is held against (LIMIT, SIBLINGS, ...); () for a reading
    where: str = NODE
    confirm: str | None = None  # MEASURED_AGAIN or INCONCLUSIVE; None: a reading, which stands as read
    text: str = ""  # what it checks, for docs/checks.md, where no function of its own has a docstring to say it

    @property
    def confirmed(self) -> bool:
        """A figure measured again on the node while it is past or near a limit (measure.watched)."""
        return self.confirm == MEASURED_AGAIN


@dataclass(frozen=True)
class Group:
    name: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Benchmark:
    name: str
    checks: tuple[Check, ...]  # the checks of its results (group `benchmark`, across nodes `benchmark_multinode`)
    run_tiers: tuple[str, ...]  # the run tiers whose node stage runs it
    selectable: bool = True  # gpufleet_benchmarks may name it (where the run tier lets it choose)
    default: bool = False  # in gpufleet_benchmarks' default
    multinode: bool = False  # runs across nodes under torchrun (nnodes > 1)
    watched: bool = True  # a sampler lists its GPUs' processes: its `<name>_processes` result
    thresholds: tuple[Threshold, ...] = ()  # the profile keys its checks alone judge against, with their defaults


@dataclass(frozen=True)
class Threshold:
    """A profile key a benchmark declares (its checks alone judge against it): what generic.yml holds of a key shared
    by several, merged into generic's keys when the profiles load (profiles.load_all)."""

    key: str
    type: str  # what every value must be: int, number, str, bool or list
    value: object  # the default; None: no expectation (a model profile or the inventory sets it)
    source: str  # where the default comes from
    min: float | None = None  # the bounds of a number, inclusive
    max: float | None = None

    def entry(self) -> dict:
        """The key as a profile file holds it."""
        bounds = {k: v for k, v in (("min", self.min), ("max", self.max)) if v is not None}
        return {"type": self.type, **bounds, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class RunTier:
    name: str
    text: str  # what its node stage does, for help and the generated documentation
    depth: str | None = None  # the depth of its benchmarks; None: the run's (gpufleet_benchmark_depth)
    chosen: bool = False  # gpufleet_benchmarks chooses its benchmarks (default: those declared default)
    across_nodes: bool = False  # the runs across nodes (and the fine-tune) follow its node stage
    sweep_minutes: int | None = None  # a sweep job's default time limit; None: never swept (it lasts hours)


@dataclass(frozen=True)
class Metric:
    key: str  # the key, each {field} a part that varies: matmul_{dtype}_tflops
    label: str  # for sentences, with the fields in words (`words`; else as they are)
    unit: str
    family: str  # the Prometheus family, named in base units; its labels are the key's fields
    to_base: float = 1  # the factor from `unit` to the family's base unit
    per_gpu: bool = False
    words: dict = field(default_factory=dict)  # field -> {value: words}, which also lists the values it may take
    shared_when: tuple[str, str] | None = None  # (field, value): the figure is the whole run's, every node's alike
    of_host: bool = False  # a figure of the host's own (its CPUs, memory, drives), not of a GPU or its links


@dataclass(frozen=True)
class Output:
    name: str  # its key in the report summary's `files`
    file: str  # under the run folder (a folder for one that writes several files)
    made_by: str = "report"  # the command that writes it: the report's own, or one after it (`gpufleet certify`)


# Where a file lies (File.where).
REPORTS, RUN, ON_NODE = "reports folder", "run folder", "node"
# Its form (File.form).
JSON, TEXT, SQLITE, FOLDER = "json", "text", "sqlite", "folder"
# What a command does with a file it finds damaged (empty, cut short, random bytes, not UTF-8, another shape), not a
# plain file (a folder, a FIFO, a symbolic link, a socket) or unreadable (its mode), never waiting on it and never
# ending in a traceback. Missing, a file is made where the command makes or repairs it; a command that `needs` it
# refuses.
REFUSES = "refuses"  # exit 2, one line naming the file and what to do; the file left as it was, nothing else done
NAMES = "names"  # goes on without it, naming it in its output (its exit its own); the file left as it was
MAKES = "makes"  # writes it again whole from what it comes from (nothing is lost: it is derived); a folder there is
# never replaced, whatever it holds: refused as by REFUSES (the same for a folder-form file in any state but missing)
REPAIRS = "repairs"  # the documented repair: what was there moved aside (kept, named), the file made again
GOES_ON = "goes on"  # not what the command acts on: left as it was, its exit its own (the report and `gpufleet store
# rebuild` name it)
JUDGES = "judges"  # what the command's verdict is on (`gpufleet verify`: a certificate, the report it names): one that
# holds no valid one is judged not valid (exit 1, naming it and why); one that cannot be read as a file (missing, a
# folder, a FIFO, unreadable) is refused as by REFUSES; the file left as it was
VERBS = (REFUSES, NAMES, MAKES, REPAIRS, GOES_ON, JUDGES)


@dataclass(frozen=True)
class File:
    name: str  # under `where`; <host> stands for an inventory host name, <lock> for gpufleet_lock_path
    where: str  # REPORTS, RUN or ON_NODE
    form: str  # JSON, TEXT, SQLITE or FOLDER
    text: str  # what it holds
    uses: dict = field(default_factory=dict)  # command (as typed after `gpufleet`) -> what it does with it damaged
    needs: tuple[str, ...] = ()  # the commands of `uses` that refuse when it is missing
    beside: dict = field(default_factory=dict)  # for a run folder's file: command -> what it does acting on
    # another run of the same reports folder
    given: tuple[str, ...] = ()  # the commands of `uses` given its path on their command line: a link there is the
    # operator's own and is followed (a FIFO is still never waited on)


# What gives an entry its behaviour: a function of an upper module, registered there (`@registers(entry, role)`), so
# that nothing here names the modules above it. Each reader imports the modules that register what it reads (its
# index), so the import graph, and import-linter, see every dependency. The entry, each role, and that index:
ROLES = {
    "check": "`<group>.<check>`: fn(readings, profile) -> result (checks/__init__.py imports the groups); of group "
    "fleet, fn(host, node_metrics, thresholds, against, settle) -> result (fleet/compare.py)",
    "rows": "`fleet.<check>` judged on the node too: fn(host, node_metrics, thresholds, against) -> rows "
    "(comparisons/node.py)",
    "run": "`<benchmark>`: fn(steps) -> output, steps a measure.NodeSteps (in benchmarks/<name>/, whose modules "
    "benchmarks/node_index.py imports, which node/measure.py imports)",
    "measure": "`<benchmark>` measured by its depth alone, without `run`: fn(depth) -> output (benchmarks/<name>/)",
    "judge": "`<benchmark>`: fn(output, profile) -> results (benchmarks/<name>/, through node/measure.py's index)",
    "again": "`<benchmark>` measured again in part when disturbed: fn(first output, profile) -> its run's options",
    "confirm": "`<benchmark>` whose confirmation measures only the figures that asked: fn(output, results, asked, "
    "profile) -> its run's options (with `what`, in words), or None for the whole step",
    "combine": "`<benchmark>` with `again` or `confirm`: fn(first output, again's output) -> output, what is judged",
    "figures": "`<benchmark>` whose figures the fleet compares: fn(result, figures) reads one of its results' "
    "figures into a comparisons.metrics.Figures (benchmarks/<name>/<name>_figures.py, which its declaration imports)",
    "render": "`output.<name>`: fn(report) -> str, written to its file (report/pipeline.py)",
    "write": "`output.<name>`: fn(made) -> None, which writes its file itself (report/pipeline.py)",
}
_REGISTERED: dict[tuple[str, str], Callable] = {}


def registers(entry: str, role: str) -> Callable:
    """Decorator: the function that gives `entry` its `role` (ROLES), kept here by the module that holds it."""

    def keep(fn: Callable) -> Callable:
        _REGISTERED[entry, role] = fn
        return fn

    return keep


def registered(entry: str, role: str, *, needed: bool = True) -> Callable | None:
    """The function registered for `entry`'s `role`; None for one not registered, unless `needed` (KeyError naming
    the entry, the role and the index that should have imported it)."""
    fn = _REGISTERED.get((entry, role))
    if fn is None and needed:
        raise KeyError(f"{entry!r} has no {role!r} registered: {ROLES[role]}")
    return fn
