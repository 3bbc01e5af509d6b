"""A GPU's memory repairs through NVML: remapped HBM rows (Ampere and later) and retired pages (before Ampere)."""

from __future__ import annotations

from gpufleet.collect.nvml.binding import pynvml


def read_remapped_rows(handle) -> dict:
    corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    return {"correctable": corr, "uncorrectable": unc, "pending": bool(pending), "failure": bool(failure)}


def read_retired_pages(handle) -> dict:
    sbe = pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = pynvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    return {"sbe": len(sbe), "dbe": len(dbe), "pending": pending == pynvml.NVML_FEATURE_ENABLED}
