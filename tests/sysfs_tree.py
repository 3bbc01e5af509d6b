"""Build fake sysfs/procfs trees under a tmp dir, laid out the way the kernel does:
devices live under sys/devices/pci<domain>/<bridge>/.../<bdf>, and
sys/bus/pci/devices/<bdf> and sys/class/infiniband/<hca> are relative symlinks
into that tree. PCIe config space is written as real bytes.

    tree = hgx(tmp_path, acs_ctrl=0x001D)        # 8 GPUs, 8 HCAs, 4 NVSwitches
    readings = {"host": host.read(tree.root, tree.environ), "nvml": {}}
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

from node_trees import whole_node

# ACS control values: what Linux sets on switch ports when an IOMMU is on
# (source validation, P2P request/completion redirect, upstream forwarding), and all off.
ACS_REDIRECT_ON = 0x001D
ACS_OFF = 0x0000
FAKE_NVML_SOURCE = Path(__file__).resolve().parent / "data" / "fake_nvml.c"


def config_space(
    *, size: int = 4096, acs_ctrl: int | None = ACS_OFF, vendor: int = 0x10B5, device: int = 0xC010
) -> bytes:
    """Config space of a PCIe switch port: standard header, PM and PCIe
    capabilities, then an extended chain AER -> Secondary PCIe -> [ACS] -> DPC.
    acs_ctrl None leaves ACS out of the chain. Truncated to `size` bytes."""
    b = bytearray(4096)
    struct.pack_into("<HH", b, 0x00, vendor, device)
    struct.pack_into("<H", b, 0x06, 0x0010)  # status: capabilities list present
    b[0x09:0x0C] = bytes([0x00, 0x04, 0x06])  # class 0x060400: PCI-to-PCI bridge
    b[0x0E] = 0x01  # header type 1 (bridge)
    b[0x34] = 0x40
    b[0x40:0x42] = bytes([0x01, 0x68])  # power management -> 0x68
    b[0x68:0x6A] = bytes([0x10, 0x00])  # PCI Express capability, end of list

    def ext(off: int, cap_id: int, nxt: int, version: int = 1) -> None:
        struct.pack_into("<I", b, off, cap_id | version << 16 | nxt << 20)

    chain = [(0x100, 0x0001, 2), (0x148, 0x0019, 1)]  # AER v2, Secondary PCIe
    if acs_ctrl is not None:
        chain.append((0x200, 0x000D, 1))
    chain.append((0x300, 0x001D, 1))  # DPC
    for i, (off, cap, ver) in enumerate(chain):
        ext(off, cap, chain[i + 1][0] if i + 1 < len(chain) else 0, ver)
    if acs_ctrl is not None:
        struct.pack_into("<HH", b, 0x204, 0x005F, acs_ctrl)  # ACS capability, ACS control
    return bytes(b[:size])


# The port counters an mlx5 HCA shows under counters/ and hw_counters/ (a subset of each), all at 0.
IB_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
)
IB_HW_COUNTERS = ("rnr_nak_retry_err", "local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "lifespan")
# aer_dev_* names, as kernels from 5.x print them.
AER_NAMES = {
    "correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"),
    "nonfatal": (
        "Undefined",
        "DLP",
        "SDES",
        "TLP",
        "FCP",
        "CmpltTO",
        "CmpltAbrt",
        "UnxCmplt",
        "RxOF",
        "MalfTLP",
        "ECRC",
        "UnsupReq",
        "ACSViol",
    ),
    "fatal": (
        "Undefined",
        "DLP",
        "SDES",
        "TLP",
        "FCP",
        "CmpltTO",
        "CmpltAbrt",
        "UnxCmplt",
        "RxOF",
        "MalfTLP",
        "ECRC",
        "UnsupReq",
        "ACSViol",
    ),
}
AER_TOTAL = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


SYSTEMCTL = """#!/bin/sh
# stands in for systemctl in tests: answers is-active with a fixed state
[ "$1" = is-active ] || exit 64
echo {state}
exit {rc}
"""


class Tree:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.devpaths: dict[str, str] = {}  # bdf -> path relative to root
        self.environ: dict[str, str] = {}

    def write(self, rel: str, content: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink root/rel -> root/target_rel, as sysfs has."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (self.root / target_rel).mkdir(parents=True, exist_ok=True)
        path.symlink_to(os.path.relpath(self.root / target_rel, path.parent))

    def pci(
        self,
        bdf: str,
        *,
        parents: tuple[str, ...] = (),
        vendor: str,
        device: str,
        cls: str,
        driver: str | None = None,
        numa_node: int = -1,
        speed: str | None = None,
        width: int | None = None,
        config: bytes | None = None,
        iommu_group: int | None = None,
        iommu_type: str | None = None,
    ) -> str:
        domain = f"pci{bdf[:7]}"  # "0000:17" of "0000:17:00.0" names the root bus
        if parents:
            domain = f"pci{parents[0][:7]}"
        dev = "/".join(["sys/devices", domain, *parents, bdf])
        self.devpaths[bdf] = dev
        for name, val in (("vendor", vendor), ("device", device), ("class", cls), ("numa_node", str(numa_node))):
            self.write(f"{dev}/{name}", val + "\n")
        if speed:
            for pre in ("current", "max"):
                self.write(f"{dev}/{pre}_link_speed", speed + "\n")
                self.write(f"{dev}/{pre}_link_width", f"{width}\n")
        self.write(f"{dev}/config", config if config is not None else config_space(size=256, acs_ctrl=None))
        if driver:
            self.link(f"{dev}/driver", f"sys/bus/pci/drivers/{driver}")
        if iommu_group is not None:
            group = f"sys/kernel/iommu_groups/{iommu_group}"
            if iommu_type:
                self.write(f"{group}/type", iommu_type + "\n")
            self.link(f"{dev}/iommu_group", group)
        self.link(f"sys/bus/pci/devices/{bdf}", dev)
        for sev in AER_NAMES:
            self.aer(bdf, sev, {})
        return dev

    def aer(self, bdf: str, severity: str, counts: dict[str, int]) -> None:
        """Write a device's aer_dev_<severity> with these counts (the others 0) and their TOTAL_ line."""
        lines = [f"{n} {counts.get(n, 0)}" for n in AER_NAMES[severity]]
        lines.append(f"{AER_TOTAL[severity]} {sum(counts.values())}")
        self.write(f"{self.devpaths[bdf]}/aer_dev_{severity}", "\n".join(lines) + "\n")

    def ib_counter(self, hca: str, port: int, name: str, value: int) -> None:
        """Set one port counter (counters/ or hw_counters/, wherever the name lives)."""
        pdir = self.root / "sys/class/infiniband" / hca / "ports" / str(port)
        sub = "hw_counters" if name in IB_HW_COUNTERS else "counters"
        (pdir / sub / name).write_text(f"{value}\n")

    def ib_port(
        self,
        hca: str,
        port: int,
        *,
        bdf: str,
        state: str = "4: ACTIVE",
        phys_state: str = "5: LinkUp",
        rate: str = "400 Gb/sec (4X NDR)",
        link_layer: str = "InfiniBand",
    ) -> None:
        hdir = f"{self.devpaths[bdf]}/infiniband/{hca}"
        if not (self.root / hdir / "device").is_symlink():
            self.link(f"{hdir}/device", self.devpaths[bdf])
            self.link(f"sys/class/infiniband/{hca}", hdir)
        for name, val in (("state", state), ("phys_state", phys_state), ("rate", rate), ("link_layer", link_layer)):
            self.write(f"{hdir}/ports/{port}/{name}", val + "\n")
        for name in IB_COUNTERS:
            self.write(f"{hdir}/ports/{port}/counters/{name}", "0\n")
        for name in IB_HW_COUNTERS:
            self.write(f"{hdir}/ports/{port}/hw_counters/{name}", "12\n" if name == "lifespan" else "0\n")

    def modules(self, names: list[str]) -> None:
        self.write("proc/modules", "".join(f"{n} 16384 0 - Live 0x0000000000000000 (OE)\n" for n in names))

    def numa(self, cpulists: list[str], balancing: int | None) -> None:
        for i, cpus in enumerate(cpulists):
            self.write(f"sys/devices/system/node/node{i}/cpulist", cpus + "\n")
        if balancing is not None:
            self.write("proc/sys/kernel/numa_balancing", f"{balancing}\n")

    def cpus(self, governors: list[str | None]) -> None:
        for i, gov in enumerate(governors):
            self.write(f"sys/devices/system/cpu/cpu{i}/online", "1\n")
            if gov is not None:
                self.write(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_governor", gov + "\n")

    def net(self, interfaces: dict[str, str]) -> None:
        for name, operstate in interfaces.items():
            self.write(f"sys/class/net/{name}/operstate", operstate + "\n")

    def systemctl(self, state: str, rc: int, bindir: Path) -> None:
        """A real tiny systemctl on a PATH of its own, named in self.environ."""
        bindir.mkdir(parents=True, exist_ok=True)
        exe = bindir / "systemctl"
        exe.write_text(SYSTEMCTL.format(state=state, rc=rc))
        exe.chmod(0o755)
        self.environ["PATH"] = str(bindir)


def _base(tree: Tree, kernel: str = "6.8.0-49-generic", pretty: str = "Ubuntu 22.04.5 LTS") -> None:
    tree.write("proc/sys/kernel/osrelease", kernel + "\n")
    tree.write("proc/sys/kernel/arch", "x86_64\n")
    tree.write("etc/os-release", f'NAME="Ubuntu"\nPRETTY_NAME="{pretty}"\nID=ubuntu\n')


def hgx(
    tmp: Path,
    *,
    acs_ctrl: int | None = ACS_OFF,
    config_size: int = 4096,
    ib_down: tuple[int, ...] = (),
    ib_rate: str = "400 Gb/sec (4X NDR)",
    ib_rates: dict[int, str] | None = None,
    hca_names: tuple[int, ...] = tuple(range(8)),
    no_hca: tuple[int, ...] = (),
    peermem: bool = True,
    iommu_type: str = "identity",
    governors: tuple[str, ...] = ("performance",) * 8,
    numa_balancing: int = 0,
    fabricmanager: tuple[str, int] = ("active", 0),
    nic_numa: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1),
    gpu_numa: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1),
    nccl_conf: str = "NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=eth\n",
    env: dict | None = None,
) -> Tree:
    """An HGX H100-like host: 2 sockets, 8 GPUs each behind a PCIe switch shared
    with one ConnectX-7 NDR HCA, 4 NVSwitches, 8 active IB ports.

    ib_rates: the rate text of the port of switch i (a port trained lower); hca_names: the number n of mlx5_n
    behind switch i (another cabling of the rails); no_hca: switches whose HCA is missing."""
    tree = Tree(tmp / "root")
    _base(tree)
    bridge_cfg = config_space(size=config_size, acs_ctrl=acs_ctrl)
    for i in range(8):
        rb = 0x10 + 0x20 * i
        rp, up, dn_gpu, dn_nic = (
            f"0000:{rb:02x}:01.0",
            f"0000:{rb + 1:02x}:00.0",
            f"0000:{rb + 2:02x}:00.0",
            f"0000:{rb + 2:02x}:01.0",
        )
        gpu, nic = f"0000:{rb + 3:02x}:00.0", f"0000:{rb + 4:02x}:00.0"
        common = dict(driver="pcieport", speed="32.0 GT/s PCIe", width=16, config=bridge_cfg, cls="0x060400")
        tree.pci(rp, vendor="0x8086", device="0x352a", numa_node=gpu_numa[i], **common)
        tree.pci(up, parents=(rp,), vendor="0x10b5", device="0xc010", numa_node=gpu_numa[i], **common)
        tree.pci(dn_gpu, parents=(rp, up), vendor="0x10b5", device="0xc010", numa_node=gpu_numa[i], **common)
        if i not in no_hca:
            tree.pci(dn_nic, parents=(rp, up), vendor="0x10b5", device="0xc010", numa_node=nic_numa[i], **common)
        tree.pci(
            gpu,
            parents=(rp, up, dn_gpu),
            vendor="0x10de",
            device="0x2330",
            cls="0x030200",
            driver="nvidia",
            numa_node=gpu_numa[i],
            speed="32.0 GT/s PCIe",
            width=16,
            iommu_group=100 + i,
            iommu_type=iommu_type,
        )
        if i in no_hca:
            continue
        tree.pci(
            nic,
            parents=(rp, up, dn_nic),
            vendor="0x15b3",
            device="0x1021",
            cls="0x020700",
            driver="mlx5_core",
            numa_node=nic_numa[i],
            speed="32.0 GT/s PCIe",
            width=16,
            iommu_group=200 + i,
            iommu_type=iommu_type,
        )
        down = i in ib_down
        tree.ib_port(
            f"mlx5_{hca_names[i]}",
            1,
            bdf=nic,
            state="1: DOWN" if down else "4: ACTIVE",
            phys_state="2: Polling" if down else "5: LinkUp",
            rate=(ib_rates or {}).get(i, ib_rate),
        )
    for k in range(4):  # NVSwitches behind root ports of their own
        rp = f"0000:0{k + 2}:01.0"
        tree.pci(
            rp,
            vendor="0x8086",
            device="0x352a",
            cls="0x060400",
            driver="pcieport",
            numa_node=0,
            config=config_space(acs_ctrl=ACS_REDIRECT_ON),
        )
        tree.pci(
            f"0000:0{k + 6}:00.0",
            parents=(rp,),
            vendor="0x10de",
            device="0x22a3",
            cls="0x068000",
            driver="nvidia-nvswitch",
            numa_node=0,
        )
    tree.pci(
        "0000:00:1c.0",
        vendor="0x8086",
        device="0x1592",
        cls="0x020000",
        driver="ice",
        numa_node=0,
        speed="16.0 GT/s PCIe",
        width=8,
    )
    tree.modules(["nvidia_uvm", "nvidia", "mlx5_ib", "ib_core", "mlx5_core"] + (["nvidia_peermem"] if peermem else []))
    tree.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=UUID=x ro intel_iommu=on iommu=pt\n")
    tree.numa(["0-55,112-167", "56-111,168-223"], numa_balancing)
    tree.cpus(list(governors))
    tree.net({"lo": "unknown", "eth0": "up", **{f"ibp{0x14 + 0x20 * i}s0": "up" for i in range(8)}})
    if nccl_conf is not None:
        tree.write("etc/nccl.conf", nccl_conf)
    tree.systemctl(*fabricmanager, bindir=tmp / "bin")
    tree.environ.update({"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "=eth0", **(env or {})})
    whole_node(tree)  # EDAC's DIMMs, the memory, the kernel log (node_trees)
    return tree


def vm(tmp: Path) -> Tree:
    """A cloud VM: one GPU and a virtio NIC straight on the root bus, one NUMA
    node that the GPU does not report, no IOMMU, InfiniBand, cpufreq or NUMA balancing."""
    tree = Tree(tmp / "root")
    _base(tree, kernel="5.15.0-119-generic")
    tree.pci("0000:00:00.0", vendor="0x8086", device="0x1237", cls="0x060000")
    tree.pci("0000:00:03.0", vendor="0x1af4", device="0x1041", cls="0x020000", driver="virtio-pci")
    tree.pci(
        "0000:00:05.0",
        vendor="0x10de",
        device="0x2330",
        cls="0x030200",
        driver="nvidia",
        speed="32.0 GT/s PCIe",
        width=16,
    )
    tree.modules(["nvidia_uvm", "nvidia"])
    tree.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro console=ttyS0\n")
    tree.numa(["0-15"], None)
    tree.cpus([None] * 4)
    tree.net({"lo": "unknown", "ens3": "up"})
    (tmp / "bin").mkdir(exist_ok=True)
    tree.environ.update({"PATH": str(tmp / "bin")})  # no systemctl: never needed without NVSwitch
    whole_node(tree, sockets=0, memory_gib=200)  # no EDAC, as the H100 VM
    return tree


def fake_nvml(library: Path, state: str) -> Path:
    """Build the NVML stand-in (tests/data/fake_nvml.c) at `library`, answering from the file `state` ("<NVML bus id>
    <persistence 0|1>" a line; no file: a driver not loaded). Needs a C compiler."""
    library.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DSTATE_FILE="{state}"', "-o", str(library), str(FAKE_NVML_SOURCE)],
        check=True,
        capture_output=True,
    )
    return library
