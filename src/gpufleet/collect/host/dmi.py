"""The machine's own identity from the firmware's DMI (SMBIOS) tables, as the kernel shows them in /sys/class/dmi/id:
the board's, the chassis' and the product's serial numbers and the product UUID, which a certificate binds beside
the GPUs (certify/), and the vendor and model names that say what they belong to.

    {"path": "/sys/class/dmi/id", "board_serial": "...", "chassis_serial": "...", "product_serial": "...",
     "product_uuid": "...", "board_vendor", "board_name", "sys_vendor", "product_name",
     "unreadable": {field: why}}

The kernel lets only root read the serials and the UUID (mode 0400): read as another user each is None and
`unreadable` says so. A value firmware leaves as a placeholder ("To Be Filled By O.E.M.", "Default string", all
zeros) names no machine: it is None, with that said, so two boards with the same placeholder never look alike.
"""

from __future__ import annotations

import errno
from pathlib import Path


DMI = "sys/class/dmi/id"
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


def _placeholder(value: str) -> bool:
    return value.lower().replace(" ", "").replace(".", "") in PLACEHOLDERS


def read_dmi(root: Path) -> dict:
    """The DMI identity under root (the module docstring); never raises."""
    folder = Path(root) / DMI
    out: dict = {"path": str(folder), "unreadable": {}}
    for field in SERIALS + NAMES:
        path = folder / field
        try:
            value = path.read_text(errors="replace").strip()
            why = None
        except PermissionError:
            value, why = None, f"{path}: only root may read it (mode 0400); run as root to bind it"
        except OSError as exc:
            value, why = None, f"{path}: " + ("not present" if exc.errno == errno.ENOENT else exc.strerror or str(exc))
        if value is not None and _placeholder(value):
            value, why = None, f"{path}: the firmware's placeholder {value!r}, which names no machine"
        out[field] = value
        if why:
            out["unreadable"][field] = why
    return out
