"""The error counters the fleet layer judges as growth, and which of them survive a reboot.
"""

from __future__ import annotations




# (name, what it counts, source counters, how the sources combine, threshold key; None: any growth fails)
COUNTERS = (
    ("ecc_uncorrected", "uncorrected ECC errors", ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"), max, None),
    ("row_remap_uncorrectable", "rows remapped for uncorrectable errors", ("row_remap_uncorrectable",), sum, None),
    ("row_remap_failure", "row remapping failures", ("row_remap_failure",), sum, None),
    ("ecc_corrected", "corrected ECC errors", ("ecc_corrected_volatile", "ecc_corrected_aggregate"), max,
     "fleet_counter_ecc_corrected_per_h_max"),
    ("row_remap_correctable", "rows remapped for correctable errors", ("row_remap_correctable",), sum,
     "fleet_counter_row_remap_per_h_max"),
    ("nvlink_crc", "NVLink CRC errors", ("nvlink_crc_data", "nvlink_crc_flit"), sum, "fleet_counter_nvlink_crc_per_h_max"),
    ("nvlink_replay", "NVLink replays", ("nvlink_replay",), sum, "fleet_counter_nvlink_replay_recovery_per_h_max"),
    ("nvlink_recovery", "NVLink recoveries", ("nvlink_recovery",), sum, "fleet_counter_nvlink_replay_recovery_per_h_max"),
    ("pcie_replay", "PCIe replays", ("pcie_replay",), sum, "fleet_counter_pcie_replay_per_h_max"),
    ("xid", "Xid events", ("xid",), sum, "fleet_counter_xid_per_h_max"),
)
# Kept across reboots and driver reloads (the InfoROM); every other counter starts again from zero.
PERSISTENT = {"ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "row_remap_correctable", "row_remap_uncorrectable",
              "row_remap_failure", "row_remap_pending"}
