"""The machine's identity as its firmware gives it (SMBIOS/DMI): system, board and chassis vendor, product, serial and
asset tag, the product UUID, the BIOS version; what a vendor's RMA desk asks for beside the GPU's serial, and what a
certificate binds beside the GPUs (SERIALS, with NAMES saying what they belong to: collect.board, certify/).

Read from sysfs (/sys/class/dmi/id: the kernel's copy of the DMI tables; the serials and the system UUID are
readable by root alone, mode 0400), else from `dmidecode` where it is on PATH (it reads the tables itself, as root).
A value firmware leaves as a placeholder ("To Be Filled By O.E.M.", "Default string", all zeros) names no machine:
it is None, with that said, so two boards with the same placeholder never look alike. Never raises: a field that
could not be read is None, and `not_read` says why.

    read_dmi(root, path_env) -> {"path", "present", "source": "sysfs" | "dmidecode" | None,
                                 "fields": {field: text or None}, "not_read": {field: reason}, "reason"}
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpufleet.collect.host.files import read_text

TIMEOUT_S = 10
# sysfs file -> (dmidecode section, its key): the same field in both.
FIELDS = {
    "sys_vendor": ("System Information", "Manufacturer"),
    "product_name": ("System Information", "Product Name"),
    "product_version": ("System Information", "Version"),
    "product_serial": ("System Information", "Serial Number"),
    "product_uuid": ("System Information", "UUID"),
    "product_sku": ("System Information", "SKU Number"),
    "board_vendor": ("Base Board Information", "Manufacturer"),
    "board_name": ("Base Board Information", "Product Name"),
    "board_version": ("Base Board Information", "Version"),
    "board_serial": ("Base Board Information", "Serial Number"),
    "board_asset_tag": ("Base Board Information", "Asset Tag"),
    "chassis_vendor": ("Chassis Information", "Manufacturer"),
    "chassis_type": ("Chassis Information", "Type"),
    "chassis_version": ("Chassis Information", "Version"),
    "chassis_serial": ("Chassis Information", "Serial Number"),
    "chassis_asset_tag": ("Chassis Information", "Asset Tag"),
    "bios_vendor": ("BIOS Information", "Vendor"),
    "bios_version": ("BIOS Information", "Version"),
    "bios_date": ("BIOS Information", "Release Date"),
}
DMIDECODE_TYPES = "0,1,2,3"  # BIOS, system, base board, chassis
# What identifies the machine (a certificate binds them), and what says what they belong to.
SERIALS = ("board_serial", "chassis_serial", "product_serial", "product_uuid")
NAMES = ("board_vendor", "board_name", "sys_vendor", "product_name")
# Firmware's placeholders for a value nobody wrote (compared lower case, spaces and dots dropped).
PLACEHOLDERS = {
    "",
    "tobefilledbyoem",
    "defaultstring",
    "notspecified",
    "notapplicable",
    "none",
    "0",
    "0123456789",
    "systemserialnumber",
    "chassisserialnumber",
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
}


def placeholder(value: str) -> bool:
    return value.lower().replace(" ", "").replace(".", "") in PLACEHOLDERS


def parse_dmidecode(text: str) -> dict[str, str]:
    """{sysfs field: value} from `dmidecode -t 0,1,2,3` output (the first section of each kind)."""
    seen: dict[tuple[str, str], str] = {}
    section = None
    for line in text.splitlines():
        if line and not line.startswith(("\t", " ")):
            section = line.strip() if line.strip() in {s for s, _ in FIELDS.values()} else None
        elif section and ":" in line and line.startswith("\t") and not line.startswith("\t\t"):
            key, _, value = line.strip().partition(":")
            seen.setdefault((section, key.strip()), value.strip())
    return {field: seen[where] for field, where in FIELDS.items() if where in seen}


def _dmidecode(path_env: str | None) -> tuple[dict[str, str], str | None]:
    exe = shutil.which("dmidecode", path=path_env)
    if exe is None:
        return {}, "dmidecode is not on PATH"
    cmd = [exe, "-t", DMIDECODE_TYPES]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, env={"LC_ALL": "C"}
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {}, f"{' '.join(cmd)} could not run: {exc}"
    if proc.returncode != 0:
        return {}, f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-200:] or 'no output'}"
    return parse_dmidecode(proc.stdout), None


def _sysfs(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, why); a serial only root may read says so."""
    text, why = read_text(path)
    if why and path.is_file() and not os.access(path, os.R_OK):
        why = f"{path}: only root may read it (mode 0400); run as root to read it"
    return text, why


def read_dmi(root: Path, path_env: str | None = None) -> dict:
    """The DMI identity (module docstring); never raises. `path_env`: where to look for dmidecode (None: $PATH)."""
    base = Path(root) / "sys/class/dmi/id"
    fields: dict[str, str | None] = {}
    not_read: dict[str, str] = {}
    read_from: dict[str, str] = {}
    for field in FIELDS:
        fields[field], why = _sysfs(base / field)
        if why:
            not_read[field] = why
        else:
            read_from[field] = str(base / field)
    if not_read:
        found, why = _dmidecode(path_env)
        for field in list(not_read):
            if found.get(field) is not None:
                fields[field] = found[field]
                read_from[field] = f"dmidecode ({FIELDS[field][0]}: {FIELDS[field][1]})"
                del not_read[field]
            elif why:
                not_read[field] += f"; {why}"
    for field, where in read_from.items():  # read, but naming nothing
        if placeholder(fields[field] or ""):
            not_read[field] = f"{where}: the firmware's placeholder {fields[field]!r}, which names no machine"
            fields[field] = None
    sources = set(read_from.values())
    source = "sysfs" if any(s.startswith(str(base)) for s in sources) else ("dmidecode" if sources else None)
    return {
        "path": str(base),
        "present": base.is_dir(),
        "source": source,
        "fields": fields,
        "not_read": not_read,
        "reason": None if source else f"{base}: not present, and dmidecode gave nothing",
    }
