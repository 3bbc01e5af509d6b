"""Fake sysfs/procfs trees for the molecule test hosts, built with tests/sysfs_tree.py and tests/node_trees.py
(copied beside this file), so the roles' discovery and runtime writes have GPUs, NVSwitches and HCAs to work on.

    python3 make_fake_node.py hgx  DEST   # 8 GPUs, 4 NVSwitches, 8 InfiniBand HCAs; ACS redirect on,
                                          # powersave governors, NUMA balancing on, driver 550.127.05
    python3 make_fake_node.py roce DEST   # one ConnectX port with an Ethernet link layer (RoCE)

The tree is DEST/root; an existing DEST is left as it is, so a second prepare changes nothing.
"""

import sys
from pathlib import Path

from sysfs_tree import ACS_REDIRECT_ON, Tree, hgx

DRIVER_VERSION = "550.127.05"


def roce(tmp: Path) -> Tree:
    tree = Tree(tmp / "root")
    tree.write("proc/sys/kernel/osrelease", "6.8.0-49-generic\n")
    tree.pci("0000:00:01.0", vendor="0x8086", device="0x352a", cls="0x060400", driver="pcieport")
    tree.pci(
        "0000:01:00.0", parents=("0000:00:01.0",), vendor="0x15b3", device="0x101d", cls="0x020000",
        driver="mlx5_core", speed="16.0 GT/s PCIe", width=16,
    )
    tree.ib_port("mlx5_0", 1, bdf="0000:01:00.0", rate="200 Gb/sec (4X HDR)", link_layer="Ethernet")
    tree.net({"lo": "unknown", "docker0": "up", "eno1": "down", "ens1f0np0": "up"})
    tree.modules(["mlx5_ib", "ib_core", "mlx5_core"])
    return tree


def main(kind: str, dest: str) -> int:
    out = Path(dest)
    if (out / "root").exists():
        print(f"{out / 'root'} exists")
        return 0
    if kind == "hgx":
        tree = hgx(out, acs_ctrl=ACS_REDIRECT_ON, governors=("powersave",) * 8, numa_balancing=1, peermem=False,
                   nccl_conf=None)
        tree.write("sys/module/nvidia/version", DRIVER_VERSION + "\n")
    elif kind == "roce":
        roce(out)
    else:
        print(f"unknown kind {kind!r}; expected hgx or roce", file=sys.stderr)
        return 2
    print(f"made {kind} tree at {out / 'root'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
