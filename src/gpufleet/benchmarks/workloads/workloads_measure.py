"""A site's own workloads (its profile's `workloads:`, base/workload_specs.py) run on this node, each at every GPU
count it declares, and its figure read from what it printed.

Each run is one process group with its own timeout (killed whole when it passes it), given the first N GPUs this
node may use (CUDA_VISIBLE_DEVICES) and the placeholders of its command; a `script` runs with bash, inside the Slurm
job a sweep gives it (its #SBATCH lines are comments there); an `image` runs the command inside it with the node's
apptainer or singularity (`exec --nv`). Without a GPU on the machine `all` is two processes' worth: a CPU run is a
logic check of the same code, not the node's figure. The figure is the last match of the regex's first group, or the
JSON key of the last line of the output that holds it. The output keeps every run: command, exit code, seconds, the
figure, the log's tail; and the CPUs the runs could use (collect.host.platform), beside the figures that depend on
them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.base import workload_specs
from gpufleet.base.registry import registers
from gpufleet.bench import BENCHMARK_VERSION
from gpufleet.bench.launch import free_port, run_group
from gpufleet.bench.monitor import sampled
from gpufleet.collect.host.platform import read_cpu_allocation

CPU_ALL = 2  # what `all` means on a machine without GPUs: two processes, a logic check
RUNTIMES = ("apptainer", "singularity")
TAIL_CHARS = 3000


def gpus_of(count, visible: int) -> int:
    """A declared count on this node: `all` is every GPU it may use (CPU_ALL without any)."""
    return (visible or CPU_ALL) if count == workload_specs.ALL else int(count)


def argv_of(w: dict, fields: dict) -> list[str]:
    """The run's command line, its placeholders filled; a `script` runs with bash."""
    if "script" in w:
        return ["bash", w["script"]]
    words = shlex.split(w["command"]) if isinstance(w["command"], str) else list(w["command"])
    return [word.format(**fields) for word in words]


def in_image(argv: list[str], image: str | None) -> tuple[list[str], str | None]:
    """(the command inside the declared image, None) or (argv, why it cannot run there)."""
    if not image:
        return argv, None
    runtime = next((shutil.which(r) for r in RUNTIMES if shutil.which(r)), None)
    if runtime is None:
        return argv, f"the workload runs in the image {image}, and neither apptainer nor singularity is on PATH"
    if not os.path.exists(image):
        return argv, f"the workload's image {image} is not on this node"
    return [runtime, "exec", "--nv", image, *argv], None


def figure_of(text: str, figure: dict) -> tuple[float | None, str | None]:
    """(the figure, None) or (None, why none was read)."""
    if "regex" in figure:
        found = re.findall(figure["regex"], text)
        if not found:
            return None, f"no line of the output matched {figure['regex']!r}"
        last = found[-1][0] if isinstance(found[-1], tuple) else found[-1]
        try:
            return float(str(last).replace(",", "")), None
        except ValueError:
            return None, f"{figure['regex']!r} matched {last!r}, not a number"
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        for part in figure["json_key"].split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
    return None, f"no JSON line of the output holds the number {figure['json_key']!r}"


def run_one(w: dict, count, visible: int, options: dict) -> dict:
    """One run of a workload at one GPU count."""
    gpus, nnodes = gpus_of(count, visible), options.get("nnodes") or 1
    fields = {
        "python": sys.executable,
        "gpus": gpus,
        "nnodes": nnodes,
        "node_rank": options.get("node_rank", 0),
        # Inside one node the port only has to be free here (launch.torchrun does the same).
        "master_addr": options.get("master_addr", "127.0.0.1") if nnodes > 1 else "127.0.0.1",
        "master_port": options.get("master_port") if nnodes > 1 else free_port(),
    }
    run = {"gpus": workload_specs.count_key(count), "gpu_count": gpus}
    try:
        argv, why = in_image(argv_of(w, fields), w.get("image"))
    except (KeyError, IndexError, ValueError) as exc:
        argv, why = [], f"its command cannot be filled in: {exc}"
    run["command"] = argv
    if why:
        return {**run, "error": why}
    env = {**os.environ, **{k: str(v) for k, v in (w.get("env") or {}).items()}, "PYTHONUNBUFFERED": "1"}
    env["GPUFLEET_WORKLOAD_GPUS"] = str(gpus)
    if visible:
        shown = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = ",".join((shown or [str(i) for i in range(visible)])[:gpus])
    timeout_s = w.get("timeout_s") or workload_specs.DEFAULT_TIMEOUT_S
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log:
        try:
            rc, timed_out = run_group(argv, log, env, timeout_s)
        except OSError as exc:
            return {**run, "error": f"could not start {argv[0]}: {exc.strerror or exc}"}
        log.seek(0)
        text = log.read().decode(errors="replace")
    run.update(rc=rc, seconds=round(time.monotonic() - t0, 2), log_tail=text[-TAIL_CHARS:])
    if timed_out:
        return {**run, "error": f"did not end within its timeout_s of {timeout_s:g} s (its process group killed)"}
    if rc != 0:
        return {**run, "error": f"exited with {rc}"}
    value, why = figure_of(text, w["figure"])
    return {**run, "figure": value} if why is None else {**run, "error": why}


def run(workloads: list[dict], visible: int, *, only: list | None = None, **options) -> dict:
    """Every declared workload at every count (`only`: [[name, count key], ...], those alone: a measurement again)."""
    out = []
    for w in workloads:
        runs = [
            run_one(w, count, visible, options)
            for count in w["gpus"]
            if only is None or [w["name"], workload_specs.count_key(count)] in only
        ]
        if runs:
            out.append({"name": w["name"], "runs": runs})
    return {
        "benchmark": "workloads",
        "device": "cuda" if visible else "cpu",
        "declared": workloads,
        "workloads": out,
        "cpu_allocation": read_cpu_allocation(Path("/")),
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "what": "each workload the profile declares, at each GPU count, one process group after another",
            "gpus_visible": visible,
            **({"measured_again": only} if only is not None else {}),
        },
    }


@registers("workloads", "run")
def run_workloads(steps, only: list | None = None) -> dict:
    """The site's workloads the profile declares (all, or `only` those to measure again), watched as the others
    (steps: the node's measure.NodeSteps)."""
    return sampled(lambda: run(steps.profile.get("workloads") or [], steps.gpus, only=only, **steps.torchrun))
