"""The node's CPU architecture and the CPUs this process may use, with what gave it them.

architecture: the kernel's own word (/proc/sys/kernel/arch; on this machine's root, uname), "x86_64" or
"aarch64" (a Grace node). cpu_allocation: the CPUs online, those this process may run on (Cpus_allowed_list of
/proc/self/status), the cgroup cpuset that allows them and Slurm's word for the job's allocation
(SLURM_CPUS_PER_TASK, SLURM_CPUS_ON_NODE, SLURM_JOB_CPUS_PER_NODE): a figure that depends on the host's CPUs (the
memory triad, the data loader, a site's workload) is recorded beside it, since a job given 72 of 288 CPUs measures
72 CPUs' worth.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from gpufleet.collect.host.files import parse_cpulist, read_text

# What Slurm says of a job's CPUs (sbatch(1), OUTPUT ENVIRONMENT VARIABLES).
SLURM_CPU_VARIABLES = ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE")


def read_architecture(root: Path) -> tuple[str | None, str | None]:
    """(the CPU architecture, None) or (None, reason)."""
    if os.path.realpath(root) == "/":
        return os.uname().machine, None
    return read_text(root / "proc/sys/kernel/arch")


def _cgroup_cpuset(root: Path) -> dict:
    """The cpuset of this process's cgroup (v2: the unified hierarchy's cpuset.cpus.effective)."""
    text, reason = read_text(root / "proc/self/cgroup")
    if text is None:
        return {"cpus": None, "path": None, "reason": reason}
    unified = next((line.split("::", 1)[1] for line in text.splitlines() if line.startswith("0::")), None)
    if unified is None:
        return {"cpus": None, "path": None, "reason": "no cgroup v2 (unified) line in /proc/self/cgroup"}
    folder = root / "sys/fs/cgroup" / unified.strip().lstrip("/")
    for candidate in (folder, *folder.parents):
        cpus, _ = read_text(candidate / "cpuset.cpus.effective")
        if cpus is not None:
            return {"cpus": cpus, "path": str(candidate / "cpuset.cpus.effective"), "reason": None}
        if candidate == root / "sys/fs/cgroup":
            break
    return {"cpus": None, "path": None, "reason": f"no cpuset.cpus.effective at or above {folder}"}


def read_cpu_allocation(root: Path, environ: Mapping[str, str] | None = None) -> dict:
    """{online, allowed, allowed_list, share_pct, cgroup: {cpus, path, reason}, slurm: {variable: value}, reason}."""
    environ = os.environ if environ is None else environ
    online_text, reason = read_text(root / "sys/devices/system/cpu/online")
    status, status_reason = read_text(root / "proc/self/status")
    allowed_list = next(
        (
            line.split(":", 1)[1].strip()
            for line in (status or "").splitlines()
            if line.startswith("Cpus_allowed_list:")
        ),
        None,
    )
    online, allowed = parse_cpulist(online_text), parse_cpulist(allowed_list)
    return {
        "online": len(online) or None,
        "allowed": len(allowed) or None,
        "allowed_list": allowed_list,
        "share_pct": round(100 * len(allowed) / len(online), 1) if online and allowed else None,
        "cgroup": _cgroup_cpuset(root),
        "slurm": {k: environ[k] for k in SLURM_CPU_VARIABLES if environ.get(k)},
        "reason": reason or status_reason or (None if allowed_list else "no Cpus_allowed_list in /proc/self/status"),
    }


def allocation_text(alloc: dict | None) -> str:
    """'on 72 of 288 CPUs (Slurm job 53925, --cpus-per-task 72; cgroup cpuset 0-71)', or '' when it is every CPU."""
    alloc = alloc or {}
    if not alloc.get("allowed") or not alloc.get("online") or alloc["allowed"] == alloc["online"]:
        return ""
    slurm = alloc.get("slurm") or {}
    why = []
    if slurm.get("SLURM_JOB_ID"):
        per_task = slurm.get("SLURM_CPUS_PER_TASK")
        why.append(f"Slurm job {slurm['SLURM_JOB_ID']}" + (f", --cpus-per-task {per_task}" if per_task else ""))
    if (alloc.get("cgroup") or {}).get("cpus"):
        why.append(f"cgroup cpuset {alloc['cgroup']['cpus']}")
    return f"on {alloc['allowed']} of {alloc['online']} CPUs" + (f" ({'; '.join(why)})" if why else "")
