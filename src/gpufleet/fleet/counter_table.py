"""The error counters the fleet layer judges as growth, and which of them survive a reboot."""

from __future__ import annotations

from gpufleet.checks.counter_rates import (
    AER_CORRECTABLE_KEY,
    CRC_KEY,
    EDAC_CE_KEY,
    INCREASE,
    PCIE_REPLAY_KEY,
    RATES,
    REPLAY_RECOVERY_KEY,
)

# (name, what it counts, source counters, how the sources combine, threshold key; None: any growth fails). The
# NVLink and PCIe replay counters go by checks.counter_rates' rule (RATES: a rate; INCREASE: any increase), the
# others by their growth per hour.
COUNTERS = (
    ("ecc_uncorrected", "uncorrected ECC errors", ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"), max, None),
    ("row_remap_uncorrectable", "rows remapped for uncorrectable errors", ("row_remap_uncorrectable",), sum, None),
    ("row_remap_failure", "row remapping failures", ("row_remap_failure",), sum, None),
    (
        "ecc_corrected",
        "corrected ECC errors",
        ("ecc_corrected_volatile", "ecc_corrected_aggregate"),
        max,
        "fleet_counter_ecc_corrected_per_h_max",
    ),
    (
        "row_remap_correctable",
        "rows remapped for correctable errors",
        ("row_remap_correctable",),
        sum,
        "fleet_counter_row_remap_per_h_max",
    ),
    ("nvlink_crc_flit", RATES["nvlink_crc_flit"].label, ("nvlink_crc_flit",), sum, CRC_KEY),
    ("nvlink_crc_data", RATES["nvlink_crc_data"].label, ("nvlink_crc_data",), sum, CRC_KEY),
    ("nvlink_replay", INCREASE["nvlink_replay"], ("nvlink_replay",), sum, REPLAY_RECOVERY_KEY),
    ("nvlink_recovery", INCREASE["nvlink_recovery"], ("nvlink_recovery",), sum, REPLAY_RECOVERY_KEY),
    ("pcie_replay", RATES["pcie_replay"].label, ("pcie_replay",), sum, PCIE_REPLAY_KEY),
    ("xid", "Xid events", ("xid",), sum, "fleet_counter_xid_per_h_max"),
)
# Kept across reboots and driver reloads (the InfoROM); every other counter starts again from zero.
PERSISTENT = {
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "row_remap_correctable",
    "row_remap_uncorrectable",
    "row_remap_failure",
    "row_remap_pending",
}


# The fabric's counters (collect.counters.fabric_snapshot), judged per device:
# (name, what it counts, device kind, how judged, threshold key, status over it). How judged:
#   count    more than the key's value in one window
#   per_min  the window's average per minute over the key's value
#   per_h    per hour over the key's value (a window shorter than fleet_counter_min_window_h by count)
#   ber      per hour over what the port's rate allows at the key's bit error ratio: BER x rate x 3600 s
#   rate     checks.counter_rates' rule: `info` with the rate below the key's limit, its status at or over it
# fmt: off
FABRIC_COUNTERS = (
    ("symbol_error", "symbol errors", "ib_port", "ber", "fabric_ib_ber_max", "fail"),
    ("link_downed", "link downs", "ib_port", "count", "fabric_ib_link_downed_max", "fail"),
    ("link_error_recovery", "link error recoveries", "ib_port", "per_min", "fabric_ib_link_error_recovery_per_min_max", "fail"),
    ("excessive_buffer_overrun_errors", "excessive buffer overruns", "ib_port", "count", "fabric_ib_fatal_errors_max", "fail"),
    ("local_link_integrity_errors", "local link integrity errors", "ib_port", "count", "fabric_ib_fatal_errors_max", "fail"),
    ("rnr_nak_retry_err", "RNR NAK retries exhausted", "ib_port", "count", "fabric_ib_fatal_errors_max", "fail"),
    ("port_rcv_errors", "receive errors", "ib_port", "per_h", "fabric_ib_rcv_errors_per_h_max", "warn"),
    ("port_rcv_remote_physical_errors", "remote physical errors", "ib_port", "per_h", "fabric_ib_rcv_errors_per_h_max", "warn"),
    ("port_xmit_discards", "transmit discards", "ib_port", "per_h", "fabric_ib_xmit_discards_per_h_max", "warn"),
    ("local_ack_timeout_err", "local ACK timeouts", "ib_port", "per_h", "fabric_ib_local_ack_timeout_per_h_max", "warn"),
    ("aer_fatal", "fatal AER errors", "pcie", "count", "fabric_aer_fatal_max", "fail"),
    ("aer_nonfatal", "non-fatal uncorrectable AER errors", "pcie", "count", "fabric_aer_nonfatal_max", "warn"),
    ("aer_correctable", RATES["aer_correctable"].label, "pcie", "rate", AER_CORRECTABLE_KEY, RATES["aer_correctable"].at_limit),
    # the host's own (collect.host_counters): EDAC's memory errors per DIMM, each NVMe drive's health log
    ("edac_ue", "uncorrected memory errors (EDAC)", "edac", "count", "host_edac_ue_max", "fail"),
    ("edac_ce", RATES["edac_ce"].label, "edac", "rate", EDAC_CE_KEY, RATES["edac_ce"].at_limit),
    ("nvme_media_errors", "NVMe media and data integrity errors", "nvme", "count", "nvme_media_errors_max", "fail"),
)
# fmt: on
# Kept across reboots: a drive's health log counts over its life; EDAC's start again at each boot, as AER's do.
FABRIC_PERSISTENT = {"nvme_media_errors"}
# Widths of the IBTA PortCounters fields (InfiniBand Architecture Specification, PortCounters attribute): such a
# counter stops at its maximum and counts no more until it is reset.
PORT_COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
