"""A site's own workloads, as its profile declares them (`workloads:`), checked when the profile is read: the
benchmark `workloads` runs each on the node (benchmarks/workloads/workloads_measure.py) and
benchmarks/workloads/workloads_judge.py holds its figure against the one the site's guide promises. docs/workloads.md says how a site writes one:

    workloads:
      - name: image_ddp                            # letters, digits, _ . -
        command: "{python} -m torch.distributed.run --nproc-per-node {gpus} -m gpufleet.train.image_ddp"
        # or script: /shared/guides/multigpu_job.sh  (run with bash; its #SBATCH lines are comments there)
        image: /cluster/containers/pytorch_25.06_arm64.sif   # optional: run inside it (apptainer/singularity exec --nv)
        figure: {regex: 'images/s: ([0-9.]+)', unit: images/s}   # or {json_key: images_per_s, unit: images/s}
        gpus: [1, all]                             # the GPU counts it runs at; all: every GPU the node may use
        expected:                                  # one a GPU count: the figure and where it comes from
          "1": {value: 2598, source: "the site's PyTorchSingleGpu.md"}
          all: {value: 36926, source: "the site's PyTorchMultiGpu.md"}
        below_expected_pct_max: 10                 # optional; else the profile's workload_below_expected_pct_max
        scaling_efficiency_min: 0.9                # optional, null: not judged; else workload_scaling_efficiency_min
        timeout_s: 600                             # optional, each run
        env: {NCCL_DEBUG: WARN}                    # optional

Placeholders in a command: {python} (the engine's interpreter), {gpus}, {nnodes}, {node_rank}, {master_addr},
{master_port}. Nothing here imports the rest of gpufleet.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ALL = "all"
PLACEHOLDERS = ("python", "gpus", "nnodes", "node_rank", "master_addr", "master_port")
DEFAULT_TIMEOUT_S = 600
KEYS = {"name", "command", "script", "image", "figure", "gpus", "expected", "below_expected_pct_max",
        "scaling_efficiency_min", "timeout_s", "env"}  # fmt: skip


def count_key(count) -> str:
    """How `expected` names a GPU count: "1", "2", "all"."""
    return str(count)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _command_problem(w: dict) -> str | None:
    if ("command" in w) == ("script" in w):
        return "give one of 'command' (the command line) or 'script' (a batch script run with bash)"
    command = w.get("command")
    if "command" in w and not (
        (isinstance(command, str) and command.strip())
        or (isinstance(command, list) and command and all(isinstance(a, str) for a in command))
    ):
        return "'command' must be a command line (a string) or its words (a list of strings)"
    if "script" in w and not (isinstance(w["script"], str) and w["script"].strip()):
        return "'script' must be the path of a batch script on the node"
    words = [command] if isinstance(command, str) else command or []
    for word in words:
        for name in re.findall(r"\{(\w*)\}", word):
            if name not in PLACEHOLDERS:
                return (
                    f"'command' names {{{name}}}; the placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )
    return None


def _figure_problem(figure) -> str | None:
    if not isinstance(figure, dict) or ("regex" in figure) == ("json_key" in figure):
        return "'figure' must say how its figure is read: {regex: '...([0-9.]+)...', unit: ...} or {json_key: ..., unit: ...}"
    if not isinstance(figure.get("unit"), str) or not figure["unit"].strip():
        return "'figure' needs its 'unit' (images/s, tokens/s, ...)"
    if "regex" in figure:
        try:
            pattern = re.compile(str(figure["regex"]))
        except re.error as exc:
            return f"'figure.regex' does not compile: {exc}"
        if pattern.groups < 1:
            return "'figure.regex' needs a group around the number: ([0-9.]+)"
    elif not isinstance(figure["json_key"], str) or not figure["json_key"].strip():
        return "'figure.json_key' must be the key of the number in a JSON line of the output (a.b for nested)"
    return None


def _counts_problem(w: dict) -> str | None:
    gpus = w.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return "'gpus' must list the GPU counts it runs at, each a number or 'all'"
    for count in gpus:
        if not (count == ALL or (isinstance(count, int) and not isinstance(count, bool) and count > 0)):
            return f"'gpus' holds {count!r}; expected a GPU count (1, 2, ...) or 'all'"
    if len({count_key(c) for c in gpus}) != len(gpus):
        return "'gpus' names a count twice"
    expected = w.get("expected")
    if not isinstance(expected, dict):
        return "'expected' must give, for each GPU count of 'gpus', {value: its figure or null, source: where it comes from}"
    keys = {count_key(c) for c in gpus}
    named = {str(k) for k in expected}
    if named != keys:
        missing, more = sorted(keys - named), sorted(named - keys)
        return "'expected' " + "; ".join(
            ([f"lacks {', '.join(missing)}"] if missing else [])
            + ([f"names {', '.join(more)}, not in 'gpus'"] if more else [])
        )
    for key, entry in expected.items():
        if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
            return f"'expected.{key}' must be {{value: a figure or null, source: where it comes from}}"
        if entry["value"] is not None and not (_number(entry["value"]) and entry["value"] > 0):
            return f"'expected.{key}.value' is {entry['value']!r}; expected a positive figure or null"
    return None


def _limits_problem(w: dict) -> str | None:
    for key, lo, hi in (
        ("below_expected_pct_max", 0, 100),
        ("scaling_efficiency_min", 0, None),
        ("timeout_s", 1, None),
    ):
        v = w.get(key)
        if v is not None and not (_number(v) and v >= lo and (hi is None or v <= hi)):
            return f"'{key}' is {v!r}; expected a number from {lo}" + (f" to {hi}" if hi is not None else "")
    env = w.get("env")
    if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) for k in env)):
        return "'env' must map variable names to values"
    return None


def problem(workloads) -> str | None:
    """What is wrong with a profile's `workloads`, naming the workload and the key; None when nothing is."""
    if not isinstance(workloads, list):
        return "'workloads' must be a list of workloads (docs/workloads.md)"
    seen = set()
    for i, w in enumerate(workloads):
        if not isinstance(w, dict) or not isinstance(w.get("name"), str) or not NAME.fullmatch(w["name"]):
            return f"workloads[{i}] needs a 'name' of letters, digits, _ . - (docs/workloads.md)"
        if w["name"] in seen:
            return f"two workloads are named {w['name']!r}"
        seen.add(w["name"])
        unknown = sorted(set(w) - KEYS)
        if unknown:
            return f"workload {w['name']!r}: unknown key {unknown[0]!r}; expected some of {', '.join(sorted(KEYS))}"
        for check in (_command_problem, lambda w: _figure_problem(w.get("figure")), _counts_problem, _limits_problem):
            why = check(w)
            if why:
                return f"workload {w['name']!r}: {why}"
    return None
