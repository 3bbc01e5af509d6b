"""The machine's identity read on the node (collect/host/dmi.py) and carried in the host document: sysfs first, then
dmidecode where it is on PATH, every field not read said with why; never raises."""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.base import schema
from gpufleet.collect import host
from gpufleet.collect.host import dmi

# What /sys/class/dmi/id holds on a machine whose firmware fills the tables (the kernel's names, one value a file).
SYSFS = {
    "sys_vendor": "Supermicro",
    "product_name": "SYS-821GE-TNHR",
    "product_serial": "S908765431",
    "board_vendor": "Supermicro",
    "board_name": "X13DEG-OAD",
    "board_serial": "OM234567890",
    "chassis_vendor": "Supermicro",
    "chassis_type": "23",
    "chassis_serial": "C8210AB76500418",
    "bios_version": "2.1",
}
# `dmidecode -t 0,1,2,3` as dmidecode prints it (its sections and keys), for a machine without sysfs' copy.
DMIDECODE = """# dmidecode 3.5
Getting SMBIOS data from sysfs.
SMBIOS 3.5.0 present.

Handle 0x0000, DMI type 0, 26 bytes
BIOS Information
\tVendor: American Megatrends International, LLC.
\tVersion: 2.1
\tRelease Date: 03/14/2024
\tCharacteristics:
\t\tPCI is supported

Handle 0x0001, DMI type 1, 27 bytes
System Information
\tManufacturer: Supermicro
\tProduct Name: SYS-821GE-TNHR
\tVersion: 0123456789
\tSerial Number: S908765431
\tUUID: 00000000-0000-0000-0000-3cecefabcdef
\tSKU Number: To be filled by O.E.M.

Handle 0x0002, DMI type 2, 15 bytes
Base Board Information
\tManufacturer: Supermicro
\tProduct Name: X13DEG-OAD
\tSerial Number: OM234567890

Handle 0x0003, DMI type 3, 22 bytes
Chassis Information
\tManufacturer: Supermicro
\tType: Other
\tSerial Number: C8210AB76500418
\tAsset Tag: rack-7-u12
"""


def tree(root: Path, fields: dict[str, str]) -> Path:
    folder = root / "sys/class/dmi/id"
    folder.mkdir(parents=True)
    for name, value in fields.items():
        (folder / name).write_text(value + "\n")
    return root


def test_sysfs_gives_the_identity_and_says_why_a_field_is_missing(tmp_path):
    root = tree(tmp_path, SYSFS)
    (root / "sys/class/dmi/id/product_uuid").mkdir()  # unreadable as a file: its reason, not a crash
    got = dmi.read_dmi(root, path_env=str(tmp_path / "no-bin"))
    assert got["source"] == "sysfs" and got["present"] and got["reason"] is None
    assert {k: got["fields"][k] for k in SYSFS} == SYSFS
    assert (
        "Is a directory" in got["not_read"]["product_uuid"]
        and "dmidecode is not on PATH" in got["not_read"]["product_uuid"]
    )
    assert got["not_read"]["chassis_asset_tag"].endswith("chassis_asset_tag: not present; dmidecode is not on PATH")
    assert set(got["fields"]) == set(dmi.FIELDS) and all(got["fields"][k] is None for k in got["not_read"])


def test_without_sysfs_dmidecode_fills_in_and_its_failure_is_said(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dmidecode"
    printed = tmp_path / "printed.txt"
    printed.write_text(DMIDECODE)
    script.write_text(f'#!/bin/sh\n[ "$1 $2" = "-t {dmi.DMIDECODE_TYPES}" ] || exit 2\ncat {printed}\n')
    script.chmod(0o755)
    got = dmi.read_dmi(tmp_path, path_env=str(bin_dir))
    assert got["source"] == "dmidecode" and not got["present"]
    assert got["fields"]["chassis_serial"] == "C8210AB76500418" and got["fields"]["chassis_asset_tag"] == "rack-7-u12"
    assert got["fields"]["product_uuid"] == "00000000-0000-0000-0000-3cecefabcdef"
    assert got["fields"]["bios_date"] == "03/14/2024" and got["fields"]["board_serial"] == "OM234567890"
    # What the firmware left as a placeholder names no machine: not read, and said so (collect.host.dmi.PLACEHOLDERS).
    for field, printed_as in (("product_version", "0123456789"), ("product_sku", "To be filled by O.E.M.")):
        assert got["fields"][field] is None
        assert got["not_read"][field] == (
            f"dmidecode (System Information: {dmi.FIELDS[field][1]}): the firmware's placeholder "
            f"{printed_as!r}, which names no machine"
        )
    # The board's asset tag is in neither: said so, with both readers' reasons.
    assert "not present" in got["not_read"]["board_asset_tag"]
    script.write_text("#!/bin/sh\necho '/dev/mem: Permission denied' >&2\nexit 1\n")
    got = dmi.read_dmi(tmp_path, path_env=str(bin_dir))
    assert got["source"] is None and got["reason"].endswith("not present, and dmidecode gave nothing")
    assert "exited 1: /dev/mem: Permission denied" in got["not_read"]["chassis_serial"]


def test_the_host_document_carries_the_machine(tmp_path):
    """collect.host.read() reads it beside the other host sections; the host document carries it as `machine`,
    and a document from readings without it says why."""
    root = tree(tmp_path, SYSFS)
    readings = {"host": host.read(str(root), {"PATH": os.defpath})}
    assert readings["host"]["dmi"]["fields"]["chassis_serial"] == SYSFS["chassis_serial"]
    machine = schema.machine(readings)
    assert machine["chassis_serial"] == SYSFS["chassis_serial"] and machine["source"] == "sysfs"
    assert "product_uuid" in machine["not_read"]
    assert schema.machine({"host": {}})["not_read"] == {
        "dmi": "the node's readings hold no DMI section (made before it was read)"
    }
