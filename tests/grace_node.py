"""A 4 x GH200 node of the seed's shape, built by hand (no GH200 was read to make it): its host as a fake sysfs tree
(sysfs_tree.Tree), its NVML readings and the figures its benchmarks are replayed with from
tests/data/readings/gh200-4gpu-built.json, whose `provenance` and `stand_ins` say where each value comes from.

    tree = gh200(tmp_path)                      # aarch64, 4 Grace CPUs of 72 cores, 36 NUMA nodes, Slingshot NICs
    readings = node_readings(tree)              # {"nvml", "host", "kernel_log"}, as `gpufleet collect` writes them
    outs = outputs(readings, halve={"hbm_copy_gbps": 2})   # matmul, memory and host outputs, GPU 2's HBM halved
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from node_trees import whole_node
from sysfs_tree import ACS_OFF, Tree, config_space

from gpufleet.collect import host

DATA = Path(__file__).resolve().parent / "data" / "readings" / "gh200-4gpu-built.json"
GPUS = ("0009:01:00.0", "0019:01:00.0", "0029:01:00.0", "0039:01:00.0")
CPU_NODES, NODES = 4, 36  # the seed's numactl -H: nodes 0-3 with 72 CPUs each, 4-35 of GPU memory
CPUS_PER_NODE = 72


def built() -> dict:
    return json.loads(DATA.read_text())


def _distance(i: int) -> str:
    """The seed's distances: 10 local, 40 to another CPU, 80 from a CPU to its own GPU's memory and 120 to another's,
    255 to the memory nodes no GPU memory sits on (each GPU's 7 more nodes, for its MIG instances)."""
    row = []
    for j in range(NODES):
        if i == j:
            row.append(10)
        elif i < CPU_NODES and j < CPU_NODES:
            row.append(40)
        elif min(i, j) < CPU_NODES and (max(i, j) - 4) % 8 == 0:
            cpu, mem = min(i, j), max(i, j)
            row.append(80 if (mem - 4) // 8 == cpu else 120)
        else:
            row.append(255)
    return " ".join(map(str, row))


def gh200(tmp: Path, *, slurm_cpus: int | None = None) -> Tree:
    """A 4-superchip node: each GPU under its Grace CPU's root port on NUMA node i, a Slingshot NIC (HPE Cassini,
    PCIe Gen5 x16) beside it, no InfiniBand, no NVSwitch. slurm_cpus: this process inside a Slurm job's cgroup that
    was given that many CPUs of node 0 (--cpus-per-task)."""
    tree = Tree(tmp / "root")
    tree.write("proc/sys/kernel/osrelease", "5.14.21-150500.55.65_13.0.73-cray_shasta_c_64k\n")
    tree.write("proc/sys/kernel/arch", "aarch64\n")
    tree.write("etc/os-release", 'NAME="SLES"\nPRETTY_NAME="SUSE Linux Enterprise Server 15 SP5"\nID=sles\n')
    for i, gpu in enumerate(GPUS):
        domain = gpu[:4]
        rp, nic_rp, nic = (
            f"{domain}:00:00.0",
            f"{int(domain, 16) - 8:04x}:00:00.0",
            f"{int(domain, 16) - 8:04x}:01:00.0",
        )
        bridge = dict(cls="0x060400", driver="pcieport", numa_node=i, speed="32.0 GT/s PCIe", width=16,
                      config=config_space(acs_ctrl=ACS_OFF))  # fmt: skip
        tree.pci(rp, vendor="0x10de", device="0x22b2", **bridge)
        tree.pci(gpu, parents=(rp,), vendor="0x10de", device="0x2342", cls="0x030200", driver="nvidia", numa_node=i,
                 speed="32.0 GT/s PCIe", width=16)  # fmt: skip
        # What a C2C GPU's PCIe attributes show is not known here: a link that looks trained down, which no check may
        # judge (the GPU reaches its CPU over NVLink-C2C).
        tree.write(f"{tree.devpaths[gpu]}/current_link_speed", "2.5 GT/s PCIe\n")
        tree.write(f"{tree.devpaths[gpu]}/current_link_width", "1\n")
        tree.pci(nic_rp, vendor="0x10de", device="0x22b2", **bridge)
        tree.pci(nic, parents=(nic_rp,), vendor="0x17db", device="0x0501", cls="0x020000", driver="cxi_core",
                 numa_node=i, speed="32.0 GT/s PCIe", width=16)  # fmt: skip
    tree.modules(["nvidia_uvm", "nvidia", "cxi_core", "cxi_user"])
    tree.write("proc/cmdline", "BOOT_IMAGE=/boot/Image root=live:LABEL=ROOT iommu.passthrough=1 init_on_alloc=0\n")
    for node in range(NODES):
        cpus = f"{node * CPUS_PER_NODE}-{(node + 1) * CPUS_PER_NODE - 1}" if node < CPU_NODES else ""
        tree.write(f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
        tree.write(f"sys/devices/system/node/node{node}/distance", _distance(node) + "\n")
    tree.write("proc/sys/kernel/numa_balancing", "0\n")
    tree.cpus(["performance"] * (CPU_NODES * CPUS_PER_NODE))
    tree.write("sys/devices/system/cpu/online", f"0-{CPU_NODES * CPUS_PER_NODE - 1}\n")
    allowed = f"0-{(slurm_cpus or CPU_NODES * CPUS_PER_NODE) - 1}"
    tree.write("proc/self/status", f"Name:\tpython\nCpus_allowed_list:\t{allowed}\n")
    if slurm_cpus:
        job = "system.slice/slurmstepd.scope/job_53925/step_0/user/task_0"
        tree.write("proc/self/cgroup", f"0::/{job}\n")
        tree.write("sys/fs/cgroup/system.slice/slurmstepd.scope/job_53925/cpuset.cpus.effective", allowed + "\n")
        tree.environ.update({"SLURM_JOB_ID": "53925", "SLURM_CPUS_PER_TASK": str(slurm_cpus)})
    tree.net({"lo": "unknown", "nmn0": "up", **{f"hsn{i}": "up" for i in range(4)}})
    tree.write("etc/nccl.conf", "NCCL_SOCKET_IFNAME=hsn\n")
    (tmp / "bin").mkdir(exist_ok=True)
    tree.environ.update({"PATH": str(tmp / "bin"), "NCCL_SOCKET_IFNAME": "hsn"})
    whole_node(tree, sockets=CPU_NODES, memory_gib=480)
    return tree


def node_readings(tree: Tree, *, c2c_halved: int | None = None) -> dict:
    """The node's readings; c2c_halved: that GPU's NVLink-C2C links at half their speed."""
    data = built()
    nv = data["nvml"]
    if c2c_halved is not None:
        for link in nv["gpus"][c2c_halved]["c2c"]["links"]:
            link["max_gbps"] /= 2
    return {"nvml": nv, "host": host.read(str(tree.root), tree.environ), "kernel_log": data["kernel_log"]}


def _samples(value: float, n: int = 20) -> dict:
    """n timed samples within 1% of `value`, as a quiet GPU gives them."""
    values = [round(value * (1 + 0.01 * ((k % 5) - 2) / 2), 3) for k in range(n)]
    return {"values": values, "n": n, "min": min(values), "median": sorted(values)[n // 2], "max": max(values),
            "spread_pct": round(100 * (max(values) - min(values)) / value, 2)}  # fmt: skip


def _monitor(readings: dict) -> dict:
    per_gpu = {
        str(g["index"]): {
            "pci_bus_id": g["pci_bus_id"],
            "throttled": [],
            "causes": [],
            "reasons": [],
            "reasons_mask": 0,
        }
        for g in readings["nvml"]["gpus"]
    }
    return {"error": None, "foreign": [], "per_gpu": per_gpu, "processes": [], "processes_unreadable": {}}


def outputs(readings: dict, *, halve: dict | None = None) -> dict:
    """The matmul, memory and host benchmarks' outputs of the node from the built figures; halve: {figure: GPU
    index} (matmul_bf16_tflops, hbm_copy_gbps, h2d_gbps, d2h_gbps) at half its value on that GPU."""
    figures = {k: v["value"] for k, v in built()["figures"].items()}
    halve = halve or {}

    def fig(name: str, i: int) -> float:
        return figures[name] / 2 if halve.get(name) == i else figures[name]

    gpus = readings["nvml"]["gpus"]
    ident = {str(g["index"]): {"uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"]} for g in gpus}
    mon = _monitor(readings)
    matmul = {
        "benchmark": "matmul", "device": "cuda", "versions": {}, "monitor": copy.deepcopy(mon),
        "method": {"tier": "quick", "dtypes": ["bf16"]},
        "summary": {"bf16": {"tflops_min": min(fig("matmul_bf16_tflops", i) for i in range(len(gpus))),
                             "spread_pct": 0.0}},
        "per_device": {d: {"device": ident[d], "bf16": {"tflops": fig("matmul_bf16_tflops", int(d)), "per_shape": [],
                                                        "samples_tflops": _samples(fig("matmul_bf16_tflops", int(d)))}}
                       for d in ident},
    }  # fmt: skip
    hbm = {d: {**ident[d], "correct": True, "hbm_copy_gbps": fig("hbm_copy_gbps", int(d)),
               "samples_gbps": _samples(fig("hbm_copy_gbps", int(d)))} for d in ident}  # fmt: skip
    pcie = {d: {**ident[d], "correct": True, "h2d_gbps": fig("h2d_gbps", int(d)), "d2h_gbps": fig("d2h_gbps", int(d)),
                "samples_h2d_gbps": _samples(fig("h2d_gbps", int(d))),
                "samples_d2h_gbps": _samples(fig("d2h_gbps", int(d)))} for d in ident}  # fmt: skip
    memory = {
        "benchmark": "memory", "device": "cuda", "monitor": copy.deepcopy(mon), "method": {"tier": "quick"},
        "host_link": "nvlink_c2c",
        "summary": {"hbm_copy_gbps_min": min(v["hbm_copy_gbps"] for v in hbm.values()),
                    "h2d_gbps_min": min(v["h2d_gbps"] for v in pcie.values()),
                    "d2h_gbps_min": min(v["d2h_gbps"] for v in pcie.values())},
        "per_device": {"hbm": hbm, "pcie": pcie},
    }  # fmt: skip
    host_out = {
        "benchmark": "host", "device": "cuda", "gpus_idle": True, "monitor": copy.deepcopy(mon),
        "cpu_allocation": readings["host"]["cpu_allocation"],
        "memory": {"per_node": {str(n): {"cpus": CPUS_PER_NODE, "gbps": figures["host_memory_gbps"], "threads": 64}
                                for n in range(CPU_NODES)}},
        "disk": {"skipped": "no scratch folder given (gpufleet_scratch_dir)"},
        "loader": {"tokens_per_s_per_gpu": figures["loader_tokens_per_s_per_gpu"], "gpus": len(gpus), "workers": 8,
                   "samples_per_s_per_gpu": figures["loader_tokens_per_s_per_gpu"] / 4096, "cpu_us_per_sample": 90},
    }  # fmt: skip
    return {"matmul": matmul, "memory": memory, "host": host_out}
