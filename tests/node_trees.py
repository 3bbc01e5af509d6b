"""The host's own hardware in fake sysfs trees (sysfs_tree.Tree), laid out as the kernel does: EDAC's memory
controllers and DIMMs, NVMe controllers with their health log recorded as the drive's 512 bytes, /proc/meminfo,
machine-check lines in the kernel log. sysfs_tree.hgx() and vm() give every tree the healthy host of whole_node().

    tree = hgx(tmp_path); edac(tree, {"mc0": {"dimm0": (0, 0)}}); nvme(tree, "nvme0", smart_log())
"""

from __future__ import annotations

import shutil
import struct

EDAC = "sys/devices/system/edac/mc"
NVME_BDF = "0000:c1:00.0"


def edac(tree, controllers: dict, *, seconds_since_reset: int = 7200, name: str = "i10nm_edac") -> None:
    """controllers: {"mc0": {"dimm0": (ce, ue), ...}}, every controller of the host (written again whole); an empty
    dict of DIMMs: a controller that names none. The controller's counts are its DIMMs' sums (no errors off a DIMM)."""
    shutil.rmtree(tree.root / EDAC, ignore_errors=True)
    for mc, dimms in controllers.items():
        folder = f"{EDAC}/{mc}"
        ce, ue = sum(c for c, _ in dimms.values()), sum(u for _, u in dimms.values())
        for f, v in (
            ("mc_name", name),
            ("size_mb", "65536"),
            ("seconds_since_reset", str(seconds_since_reset)),
            ("ce_count", str(ce)),
            ("ue_count", str(ue)),
            ("ce_noinfo_count", "0"),
            ("ue_noinfo_count", "0"),
        ):
            tree.write(f"{folder}/{f}", v + "\n")
        for i, (dimm, (dce, due)) in enumerate(dimms.items()):
            d = f"{folder}/{dimm}"
            tree.write(f"{d}/dimm_ce_count", f"{dce}\n")
            tree.write(f"{d}/dimm_ue_count", f"{due}\n")
            tree.write(f"{d}/dimm_label", f"CPU_SrcID#0_{mc.upper()}_Chan#{i}_DIMM#0\n")
            tree.write(f"{d}/dimm_location", f"channel {i} slot 0\n")
            tree.write(f"{d}/size", "32768\n")
            tree.write(f"{d}/dimm_mem_type", "Registered-DDR5\n")


def smart_log(
    *,
    critical_warning: int = 0,
    temperature_k: int = 311,
    spare: int = 100,
    spare_threshold: int = 10,
    used: int = 3,
    media_errors: int = 0,
    error_log_entries: int = 12,
    unsafe_shutdowns: int = 7,
    power_on_hours: int = 8123,
) -> bytes:
    """A SMART / Health Information log page (Log Identifier 02h) as a drive returns it, laid out by the NVMe Base
    Specification 2.0, section 5.16.1.3: byte 0 Critical Warning, bytes 2:1 Composite Temperature (K), byte 3
    Available Spare, byte 4 its threshold, byte 5 Percentage Used, bytes 47:32 Data Units Read, 63:48 Written,
    143:128 Power On Hours, 159:144 Unsafe Shutdowns, 175:160 Media and Data Integrity Errors, 191:176 Number of
    Error Information Log Entries, 195:192 Warning Composite Temperature Time; 16-byte counters little-endian."""
    page = bytearray(512)
    page[0] = critical_warning
    page[1:3] = temperature_k.to_bytes(2, "little")
    page[3], page[4], page[5] = spare, spare_threshold, used
    for offset, value in (
        (32, 123_456_789),
        (48, 98_765_432),
        (128, power_on_hours),
        (144, unsafe_shutdowns),
        (160, media_errors),
        (176, error_log_entries),
    ):
        page[offset : offset + 16] = value.to_bytes(16, "little")
    struct.pack_into("<II", page, 192, 4, 1)  # minutes over the warning and the critical temperature
    return bytes(page)


def nvme(
    tree,
    controller: str,
    log: bytes | None,
    *,
    serial: str = "S6CKNA0W123456",
    model: str = "SAMSUNG MZQL27T6HBLA-00A07",
    bdf: str = NVME_BDF,
    transport: str = "pcie",
) -> None:
    """An NVMe controller under sys/class/nvme, its PCI function, and its health log recorded as <root>/dev/<name>
    (None: no recording, as where the log could not be read)."""
    if bdf not in tree.devpaths:
        tree.pci(
            bdf,
            vendor="0x144d",
            device="0xa80a",
            cls="0x010802",
            driver="nvme",
            numa_node=1,
            speed="16.0 GT/s PCIe",
            width=4,
        )
    folder = f"{tree.devpaths[bdf]}/nvme/{controller}"
    for f, v in (
        ("model", model),
        ("serial", serial),
        ("firmware_rev", "GDC5602Q"),
        ("transport", transport),
        ("state", "live"),
    ):
        tree.write(f"{folder}/{f}", v + "\n")
    if not (tree.root / folder / "device").is_symlink():  # written again: the drive's log changed
        tree.link(f"{folder}/device", tree.devpaths[bdf])
        tree.link(f"sys/class/nvme/{controller}", folder)
    if log is not None:
        tree.write(f"dev/{controller}", log)


def meminfo(tree, total_gib: float, available_gib: float, hugepages_free: int = 0) -> None:
    kib = lambda gib: int(gib * 2**20)  # noqa: E731
    tree.write(
        "proc/meminfo",
        f"MemTotal:       {kib(total_gib)} kB\nMemFree:        {kib(available_gib) // 2} kB\n"
        f"MemAvailable:   {kib(available_gib)} kB\nHugePages_Total:    {hugepages_free}\n"
        f"HugePages_Free:     {hugepages_free}\nHugepagesize:       2048 kB\n",
    )


def kmsg(tree, *messages: str) -> None:
    """The kernel log of the tree: kmsg records, one a message."""
    tree.write("dev/kmsg", "".join(f"6,{i},{1000 * i},-;{m}\n" for i, m in enumerate(messages)))


def whole_node(tree, *, sockets: int = 2, memory_gib: float = 2048) -> None:
    """A healthy host's own hardware: a memory controller a socket with two DIMMs, no error counted; its memory
    mostly free; a kernel log that booted (no machine check). No NVMe drive: nvme() adds one."""
    if sockets:
        edac(tree, {f"mc{i}": {"dimm0": (0, 0), "dimm1": (0, 0)} for i in range(sockets)})
    meminfo(tree, memory_gib, memory_gib * 0.93)
    kmsg(tree, "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-051)", "Command line: BOOT_IMAGE=/vmlinuz ro")
