"""What the tests of the fleet in service share (test_service.py, test_service_ladder.py): recorded readings made
into a node's faults, the real engine's run folders over them, the site's commands as stand-ins that record their
calls, a user's Slurm job, and the sweep's command line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster
from gpufleet.base import slurm
from gpufleet.collect import kernel_log, nvml
from slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"
THRESHOLDS = json.dumps({"gpus_expected": 1})  # the recording is of a one-GPU VM
SERIAL = "1752624014921"  # the recorded GPU's
SWEEP = "sweep"

needs_slurm = pytest.mark.skipif(bool(slurm_cluster.skip_reason()), reason=str(slurm_cluster.skip_reason()))


def readings(
    path: Path,
    *,
    xids: int = 0,
    serial: str | None = None,
    note: str = "",
    no_driver: bool = False,
    inforom: str | None = None,
    dmi: dict | None = None,
) -> Path:
    """The recording as a whole node (its host sections as `gpufleet collect` gives them on a machine without a
    bring-up record or AER device), its GPU idle, with `xids` Xid 79 lines in its kernel log (each ending in `note`)
    and another board's serial when given; `no_driver`: as collect.nvml reads a node without libnvidia-ml.so;
    `inforom`: the GPU's InfoROM image as NVML gives it, with the software readings that make it a version; `dmi`:
    the machine's identity as collect.host.dmi read it."""
    doc = json.loads(READINGS.read_text())
    gpu = doc["nvml"]["gpus"][0]
    gpu["processes"] = []
    if serial:
        gpu["serial"] = serial
    if inforom:
        gpu["inforom_image_version"] = inforom
        doc["software"] = {}
    doc["host"]["aer"] = {"devices": [], "present": False, "reason": "no GPU or HCA on the PCI bus"}
    doc["host"]["bringup"] = {
        "path": "/etc/gpufleet/bringup.json",
        "present": False,
        "readable": False,
        "reason": "/etc/gpufleet/bringup.json: not present",
        "roles": {},
    }
    bus = gpu["pci_bus_id"][:-2]
    doc["kernel_log"]["xid_events"] = [
        kernel_log.parse_xid(f"NVRM: Xid (PCI:{bus}): 79, pid={i + 1}, GPU has fallen off the bus.{note}")
        for i in range(xids)
    ]
    if no_driver:
        doc["nvml"] = {"available": False, "error": nvml.NO_DRIVER, "gpus": []}
    if dmi is not None:
        doc["host"]["dmi"] = dmi
    path.write_text(json.dumps(doc))
    return path


def gpufleet(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def judged_run(
    reports: Path,
    run_id: str,
    nodes: dict[str, Path],
    env: dict | None = None,
    *,
    playbook: str = "validate",
    thresholds: str = THRESHOLDS,
    counters: bool = False,
) -> Path:
    """A run folder as validate.yml leaves it, from the real engine over recorded readings: run.json, each node's
    checks (and with `counters` its counter snapshots), the report (indexed into reports/gpufleet.db)."""
    done = gpufleet(
        "run",
        "start",
        str(reports),
        run_id,
        "--playbook",
        playbook,
        "--tier",
        "acceptance",
        *(f"--host={h}" for h in nodes),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    run_dir = reports / run_id
    for host, recorded in nodes.items():
        common = ["--readings", str(recorded), "--host", host, "--json", "--exit-zero", "--thresholds", thresholds]
        doc = json.loads(gpufleet("check", *common, env=env).stdout)
        for phase in ("before", "after") if counters else ():
            doc["results"] += json.loads(gpufleet("counters", "--phase", phase, *common, env=env).stdout)["results"]
        (run_dir / "hosts" / f"{host}.json").write_text(json.dumps(doc))
    gpufleet("report", str(run_dir), "--json", env=env)
    assert (run_dir / "report.json").exists()
    return run_dir


def stand_in(path: Path, calls: Path, word: str) -> Path:
    """A site command that only records how it was called."""
    path.write_text(f'#!/bin/sh\necho "{word} $*" >> {calls}\n')
    path.chmod(0o755)
    return path


def calls_of(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def sbatch(cluster: SlurmCluster, *args: str) -> str:
    """A user's job; its output nowhere (sbatch's default is slurm-<id>.out in this folder)."""
    done = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", *args],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    return slurm_fields(cluster, job_id).get("JobState", "")


def slurm_fields(cluster: SlurmCluster, job_id: str) -> dict:
    return slurm.fields(cluster.scontrol("show", "job", "-o", job_id))


def sweep_args(
    tmp_path: Path, python: str = sys.executable, *extra: str, nodes: tuple = ("sn1", "sn2", "sn3")
) -> list[str]:
    recorded = tmp_path / "readings"
    recorded.mkdir(exist_ok=True)
    for name in nodes:
        if not (recorded / f"{name}.json").exists():  # a test's own readings of a node stay
            readings(recorded / f"{name}.json")
    return [
        "slurm",
        "sweep",
        "--tier",
        "smoke",
        "--partition",
        "gpu",
        "--sweep-partition",
        SWEEP,
        "--python",
        python,
        "--lock-path",
        str(tmp_path / "node.lock"),
        "--thresholds",
        THRESHOLDS,
        f"--node-arg=--readings={recorded}/{{node}}.json",
        "--reports-dir",
        str(tmp_path / "reports"),
        *extra,
    ]


# ---------------------------------------------------------------- sweeps


@contextlib.contextmanager
def sweep_started(cluster: SlurmCluster, args: list[str]):
    """`gpufleet slurm sweep ARGS` running, stopped should the test end before it (what it said then printed: pytest
    shows it beside the failure)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            out, err = proc.communicate()
            print(f"the sweep, stopped: stdout {out[-3000:]}\nstderr {err[-3000:]}")


def ladder_cmd(cluster, run_dir: Path, calls: Path, *extra: str) -> subprocess.CompletedProcess:
    reset, reboot = stand_in(calls.parent / "reset", calls, "reset"), stand_in(calls.parent / "reboot", calls, "reboot")
    return gpufleet(
        "ladder",
        str(run_dir),
        "--json",
        f"--command=reset_gpu={reset} {{gpu_index}} {{slurm_node}}",
        f"--command=reboot={reboot} {{slurm_node}}",
        *extra,
        env=cluster.env(),
    )


def steps_of(done: subprocess.CompletedProcess, host: str) -> list[dict]:
    assert done.stdout, done.stderr
    return [s for s in json.loads(done.stdout)["steps"] if s["host"] == host]
