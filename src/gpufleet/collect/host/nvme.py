"""Each local NVMe drive's own health log: the SMART / Health Information log page (Log Identifier 02h) of every
PCIe NVMe controller under sys/class/nvme, read through nvme-cli (`nvme smart-log <dev> -o json`) when it is on
the PATH, else with the admin command itself (NVME_IOCTL_ADMIN_CMD, Get Log Page) and decoded from its 512 bytes.

    {"present": bool, "path", "reason": why no drive (None when any), "drives": [{
        "controller": "nvme0", "device": "/dev/nvme0", "model", "serial", "firmware", "pci_bdf", "transport",
        "source": "nvme-cli" | "ioctl" | "recorded", "reason": why its log was not read (None when read),
        "log": {critical_warning, temperature_c, available_spare_pct, available_spare_threshold_pct,
                percentage_used, media_errors, error_log_entries, unsafe_shutdowns, power_on_hours,
                data_units_read, data_units_written, warning_temp_minutes, critical_temp_minutes} or None}]}

The layout of the log page (NVM Express Base Specification 2.0, section 5.16.1.3, "SMART / Health Information
(Log Page Identifier 02h)"; the same bytes as struct nvme_smart_log in Linux's include/linux/nvme.h):

    byte 0        Critical Warning (bit 0 spare below threshold, 1 temperature, 2 reliability degraded,
                  3 read-only, 4 volatile memory backup failed, 5 persistent memory region read-only)
    bytes 1-2     Composite Temperature, kelvins        byte 3  Available Spare, %
    byte 4        Available Spare Threshold, %          byte 5  Percentage Used (may exceed 100)
    bytes 32-47   Data Units Read (1,000 x 512 bytes)   48-63   Data Units Written
    bytes 128-143 Power On Hours                        144-159 Unsafe Shutdowns
    bytes 160-175 Media and Data Integrity Errors       176-191 Number of Error Information Log Entries
    bytes 192-195 Warning Composite Temperature Time (minutes); 196-199 Critical Composite Temperature Time
    (the 16-byte counters little-endian 128-bit integers, the others little-endian)

Only root opens /dev/nvmeN. Under a root other than "/" (a recorded tree), <root>/dev/nvmeN is a regular file
holding the 512 bytes recorded, read as the log page. Fabric-attached controllers (NVMe over TCP, RDMA, FC) are
not the node's own drives and are left out.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

from gpufleet.collect.host.files import listdir, read_text

SYS_NVME = "sys/class/nvme"
LOG_BYTES = 512
LOG_SMART = 0x02  # Log Identifier: SMART / Health Information
GET_LOG_PAGE = 0x02  # admin opcode
NSID_ALL = 0xFFFFFFFF  # the controller's log, every namespace together
# _IOWR('N', 0x41, struct nvme_admin_cmd): 72 bytes (include/uapi/linux/nvme_ioctl.h)
NVME_IOCTL_ADMIN_CMD = 0xC0484E41
ADMIN_CMD = struct.Struct(
    "<BBHIIIQQIIIIIIIIII"
)  # opcode flags rsvd nsid cdw2 cdw3 metadata addr mlen dlen cdw10-15 timeout result
TIMEOUT_S = 10
CRITICAL_WARNING_BITS = {
    0: "available spare below its threshold",
    1: "temperature past its threshold",
    2: "reliability degraded by media or internal errors",
    3: "media placed in read-only mode",
    4: "volatile memory backup device failed",
    5: "persistent memory region read-only",
}
# nvme-cli's JSON keys -> the log's fields here
_CLI_KEYS = {
    "avail_spare": "available_spare_pct",
    "spare_thresh": "available_spare_threshold_pct",
    "percent_used": "percentage_used",
    "media_errors": "media_errors",
    "num_err_log_entries": "error_log_entries",
    "unsafe_shutdowns": "unsafe_shutdowns",
    "power_on_hours": "power_on_hours",
    "data_units_read": "data_units_read",
    "data_units_written": "data_units_written",
    "warning_temp_time": "warning_temp_minutes",
    "critical_comp_time": "critical_temp_minutes",
}


def _u128(buf: bytes, off: int) -> int:
    lo, hi = struct.unpack_from("<QQ", buf, off)
    return hi << 64 | lo


def decode_smart_log(buf: bytes) -> dict:
    """The fields of a SMART / Health Information log page from its 512 bytes (the module docstring's layout)."""
    if len(buf) < LOG_BYTES:
        raise ValueError(f"a SMART / Health log page is {LOG_BYTES} bytes; got {len(buf)}")
    kelvin = struct.unpack_from("<H", buf, 1)[0]
    return {
        "critical_warning": buf[0],
        "temperature_c": kelvin - 273 if kelvin else None,
        "available_spare_pct": buf[3],
        "available_spare_threshold_pct": buf[4],
        "percentage_used": buf[5],
        "data_units_read": _u128(buf, 32),
        "data_units_written": _u128(buf, 48),
        "power_on_hours": _u128(buf, 128),
        "unsafe_shutdowns": _u128(buf, 144),
        "media_errors": _u128(buf, 160),
        "error_log_entries": _u128(buf, 176),
        "warning_temp_minutes": struct.unpack_from("<I", buf, 192)[0],
        "critical_temp_minutes": struct.unpack_from("<I", buf, 196)[0],
    }


def get_log_page_command(addr: int) -> bytearray:
    """The admin command Get Log Page for the SMART / Health log of every namespace into `addr`: CDW10 carries the
    Log Identifier (bits 7:0) and the number of dwords less one (NUMDL, bits 31:16)."""
    cdw10 = ((LOG_BYTES // 4 - 1) << 16) | LOG_SMART
    return bytearray(
        ADMIN_CMD.pack(
            GET_LOG_PAGE, 0, 0, NSID_ALL, 0, 0, 0, addr, 0, LOG_BYTES, cdw10, 0, 0, 0, 0, 0, TIMEOUT_S * 1000, 0
        )
    )


def read_log_ioctl(device: str) -> bytes:
    """The 512 bytes of the SMART / Health log page through the kernel's admin passthrough; OSError when the device
    cannot be opened (root only) or the command fails (its NVMe status in the message)."""
    buf = ctypes.create_string_buffer(LOG_BYTES)
    cmd = get_log_page_command(ctypes.addressof(buf))
    fd = os.open(device, os.O_RDONLY)
    try:
        status = fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd, True)
    finally:
        os.close(fd)
    if status != 0:
        raise OSError(f"Get Log Page 02h completed with NVMe status 0x{status:x}")
    return buf.raw


def _cli_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def from_cli_json(doc: dict) -> dict:
    """nvme-cli's `smart-log -o json`: critical_warning a number (or, verbose, {"value": n, ...}), temperature in
    kelvins, the 128-bit counters as numbers."""
    keys = {k.lower(): v for k, v in doc.items()}
    warning = keys.get("critical_warning")
    if isinstance(warning, dict):
        warning = warning.get("value", warning.get("Value"))
    kelvin = _cli_int(keys.get("temperature"))
    out = {"critical_warning": _cli_int(warning), "temperature_c": kelvin - 273 if kelvin else None}
    out.update({field: _cli_int(keys.get(key)) for key, field in _CLI_KEYS.items()})
    return out


def _nvme_cli(exe: str, device: str) -> dict:
    proc = subprocess.run(
        [exe, "smart-log", device, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=dict(os.environ, LC_ALL="C"),
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise OSError(f"`nvme smart-log {device}` exit {proc.returncode}: {tail[-1] if tail else 'no output'}")
    return from_cli_json(json.loads(proc.stdout))


def _health_log(device: Path, real_root: bool, path_env: str | None) -> tuple[dict | None, str, str | None]:
    """(the decoded log, its source, why it was not read)."""
    exe = shutil.which("nvme", path=path_env)
    try:
        if not real_root and device.is_file():  # a recorded tree: the log page's bytes, as the drive gave them
            return decode_smart_log(device.read_bytes()), "recorded", None
        if exe:
            return _nvme_cli(exe, str(device)), "nvme-cli", None
        if device.exists() and not stat.S_ISCHR(device.stat().st_mode):
            return None, "ioctl", f"{device} is not a character device"
        return decode_smart_log(read_log_ioctl(str(device))), "ioctl", None
    except PermissionError:
        return (
            None,
            "nvme-cli" if exe else "ioctl",
            f"{device}: permission denied (only root reads a drive's health log)",
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        return None, "nvme-cli" if exe else "ioctl", f"{device}: {why}"


def read_nvme(root: Path, path_env: str | None = None) -> dict:
    """Every local (PCIe) NVMe controller and its health log (module docstring); never raises."""
    base = root / SYS_NVME
    names = listdir(base)
    if not names:
        why = "not present" if names is None else "empty"
        return {"present": False, "path": str(base), "reason": f"no NVMe controller ({base}: {why})", "drives": []}
    real_root = os.path.realpath(root) == "/"
    drives = []
    for name in names:
        folder = base / name
        transport = read_text(folder / "transport")[0]
        if transport not in (None, "pcie"):
            continue
        field = {f: read_text(folder / f)[0] for f in ("model", "serial", "firmware_rev")}
        device = root / "dev" / name
        log, source, why = _health_log(device, real_root, path_env)
        drives.append(
            {
                "controller": name,
                "device": str(device),
                "model": field["model"],
                "serial": field["serial"],
                "firmware": field["firmware_rev"],
                "pci_bdf": os.path.basename(os.path.realpath(folder / "device"))
                if (folder / "device").exists()
                else None,
                "transport": transport,
                "source": source,
                "reason": why,
                "log": log,
            }
        )
    reason = None if drives else f"no local NVMe drive ({base} lists only fabric-attached controllers)"
    return {"present": bool(drives), "path": str(base), "reason": reason, "drives": drives}


def drive_name(d: dict) -> str:
    """'nvme0 (SAMSUNG MZQL27T6HBLA, serial S6CK..., 0000:c1:00.0)'."""
    about = [d.get("model"), f"serial {d['serial']}" if d.get("serial") else None, d.get("pci_bdf")]
    return d["controller"] + (f" ({', '.join(filter(None, about))})" if any(about) else "")
