"""The host's own hardware health: EDAC's memory errors per controller and DIMM, machine checks in the kernel log,
each NVMe drive's health log (recorded as its 512 bytes, through nvme-cli's JSON, and the admin command's bytes),
the memory a job would get. Recorded trees (sysfs_tree, node_trees) read by the real readers and judged by the real
checks; the counters' growth through `gpufleet check`, `gpufleet counters` before and after, `gpufleet record` and
`gpufleet report` over two runs, into the store and the Prometheus textfiles.
"""

from __future__ import annotations

import json
import sqlite3
import struct

import pytest

from gpufleet.base import profiles, schema
from gpufleet.checks.host_hygiene import system_memory, nvme_health
from gpufleet.collect import counters, host, kernel_log
from gpufleet.collect.host import nvme as nvme_reader
from gpufleet.comparisons import metrics
from gpufleet.comparisons.thresholds import Thresholds, thresholds_for
from gpufleet.fleet import fabric_growth

from node_trees import edac, kmsg, meminfo, nvme, smart_log
from sysfs_tree import hgx, vm
from test_fabric import _gpufleet, _node_stage

H100 = "NVIDIA H100 80GB HBM3"


def _readings(tree) -> dict:
    return {"host": host.read(str(tree.root), tree.environ), "nvml": {}, "kernel_log": kernel_log.read(str(tree.root))}


def _profile(**overrides):
    return profiles.resolve(H100, overrides=overrides or None)


# --- EDAC -------------------------------------------------------------------------------------


def test_edac_counts_are_read_per_controller_and_dimm(tmp_path):
    tree = hgx(tmp_path)
    edac(tree, {"mc0": {"dimm0": (0, 0), "dimm1": (3, 0)}, "mc1": {"dimm0": (0, 0)}})
    e = host.read(str(tree.root), tree.environ)["edac"]
    assert e["present"] and [mc["mc"] for mc in e["controllers"]] == ["mc0", "mc1"]
    mc0 = e["controllers"][0]
    assert (mc0["name"], mc0["ce"], mc0["ue"], mc0["seconds_since_reset"]) == ("i10nm_edac", 3, 0, 7200)
    assert [(d["dimm"], d["ce"], d["label"]) for d in mc0["dimms"]] == [
        ("dimm0", 0, "CPU_SrcID#0_MC0_Chan#0_DIMM#0"),
        ("dimm1", 3, "CPU_SrcID#0_MC0_Chan#1_DIMM#0"),
    ]


def test_a_clean_node_passes_and_no_edac_is_one_skip_with_the_reason(tmp_path):
    tree = hgx(tmp_path / "a")
    edac(tree, {"mc0": {"dimm0": (0, 0)}, "mc1": {"dimm0": (0, 0)}})
    res = system_memory.check_memory_errors(_readings(tree), _profile())
    assert res["status"] == schema.PASS and "no memory error on 2 memory controller(s), 2 DIMM(s)" in res["reason"]
    # A VM: no EDAC at all. One skip saying so; the counter snapshot says it too and still reads what it has.
    r = _readings(vm(tmp_path / "b"))
    res = system_memory.check_memory_errors(r, _profile())
    assert res["status"] == schema.SKIP and "no EDAC memory controller" in res["reason"]
    assert "sys/devices/system/edac/mc: not present" in res["reason"] and "virtual machine" in res["reason"]
    snap = counters.fabric_snapshot("before", r, boot_id="b")
    assert snap["status"] == schema.PASS and "no EDAC (no EDAC memory controller" in snap["reason"]
    assert not [d for d in snap["detail"]["devices"] if d["kind"] in ("edac", "nvme")]


def test_an_uncorrected_error_fails_and_corrected_ones_are_a_rate_against_mcelogs_limit(tmp_path):
    tree = hgx(tmp_path)
    edac(tree, {"mc0": {"dimm0": (0, 0), "dimm1": (0, 1)}}, seconds_since_reset=7200)
    res = system_memory.check_memory_errors(_readings(tree), _profile())
    assert res["status"] == schema.FAIL and res["class"] == "hardware"
    assert (
        'mc0 (i10nm_edac) dimm1 "CPU_SrcID#0_MC0_Chan#1_DIMM#0" (location channel 1 slot 0): 1 uncorrected'
        in (res["reason"])
    )
    assert "replace it" in res["remedy"] and res["threshold"]["key"] == "host_edac_ue_max"
    # 12 corrected in the 2 hours since boot: under a day counts as one, 12 a day is past mcelog's 10: warn.
    edac(tree, {"mc0": {"dimm0": (12, 0), "dimm1": (0, 0)}})
    res = system_memory.check_memory_errors(_readings(tree), _profile())
    assert res["status"] == schema.WARN and "dimm0" in res["reason"] and "12 corrected, 12 a day" in res["reason"]
    assert "limit 10 a day a DIMM" in res["reason"] and "(mcelog, host_edac_ce_per_day_warn)" in res["reason"]
    assert "mcelog" in res["threshold"]["host_edac_ce_per_day_warn"]["source"]
    # 3 in two days since the reset: a rate under the limit is information, not a verdict.
    edac(tree, {"mc0": {"dimm0": (3, 0), "dimm1": (0, 0)}}, seconds_since_reset=2 * 86400)
    res = system_memory.check_memory_errors(_readings(tree), _profile())
    assert res["status"] == schema.INFO and "1.5 a day" in res["reason"]


def test_edac_counts_growing_during_the_run_and_since_the_previous_one(tmp_path):
    tree = hgx(tmp_path)
    edac(tree, {"mc0": {"dimm0": (0, 0), "dimm1": (2, 0)}})
    before = counters.fabric_snapshot("before", _readings(tree), boot_id="boot-1")
    assert before["status"] == schema.PASS and "EDAC memory errors of 3 DIMM(s) or controller(s)" in before["reason"]
    ids = {d["id"]: d for d in before["detail"]["devices"] if d["kind"] == "edac"}
    assert sorted(ids) == ["edac:mc0", "edac:mc0/dimm0", "edac:mc0/dimm1"] and ids["edac:mc0/dimm1"]["counters"] == {
        "edac_ce": 2,
        "edac_ue": 0,
    }
    edac(tree, {"mc0": {"dimm0": (0, 1), "dimm1": (4, 0)}})
    after = counters.fabric_snapshot("after", _readings(tree), boot_id="boot-1")
    before["detail"]["read_at"], after["detail"]["read_at"] = "2026-11-24T08:00:00Z", "2026-11-24T08:10:00Z"
    res = fabric_growth.fabric_during_run(
        "n0",
        metrics.extract([dict(before, group="counters"), dict(after, group="counters")]),
        Thresholds(thresholds_for(None)),
    )
    assert res["status"] == schema.FAIL
    assert (
        'dimm0 "CPU_SrcID#0_MC0_Chan#0_DIMM#0" (location channel 0 slot 0): uncorrected memory errors (EDAC) grew by 1'
        in res["reason"]
    )
    assert "corrected memory errors (EDAC) grew by 2 in 10 min: 2 a day" in res["reason"]  # information beside
    assert "3 EDAC DIMM(s) or controller(s)" in res["detail"]["judged"] and "replace the DIMM" in res["remedy"]


# --- machine checks ------------------------------------------------------------------------------


def test_machine_checks_are_named_by_cpu_and_bank(tmp_path):
    tree = hgx(tmp_path)
    kmsg(tree, "Linux version 6.8.0", "mce: [Hardware Error]: Machine check events logged")
    res = system_memory.check_machine_checks(_readings(tree), _profile())
    assert res["status"] == schema.INFO and "1 'Machine check events logged' line(s)" in res["reason"]
    kmsg(
        tree,
        "Linux version 6.8.0",
        "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: 8c00004000010090",  # corrected (UC clear)
        "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000000402",  # UC and PCC set
        "mce: [Hardware Error]: TSC 0 ADDR 1ffff MISC 8c",
    )
    res = system_memory.check_machine_checks(_readings(tree), _profile())
    assert res["status"] == schema.FAIL and res["value"] == 1 and res["class"] == "hardware"
    assert "CPU 3 bank 4: status 0xb200000000000402 (uncorrected, processor context corrupt)" in res["reason"]
    assert [(e["cpu"], e["bank"], e["uncorrected"]) for e in res["detail"]["events"]] == [(12, 7, False), (3, 4, True)]
    kmsg(tree, "Linux version 6.8.0")
    assert system_memory.check_machine_checks(_readings(tree), _profile())["status"] == schema.PASS
    (tree.root / "dev/kmsg").unlink()
    res = system_memory.check_machine_checks(_readings(tree), _profile())
    assert res["status"] == schema.ERROR and "dev/kmsg" in res["reason"]


# --- NVMe -------------------------------------------------------------------------------------------


def test_the_log_page_decodes_by_the_specs_layout():
    fields = nvme_reader.decode_smart_log(
        smart_log(
            critical_warning=0x05, temperature_k=318, spare=4, spare_threshold=10, used=91, media_errors=2**70 + 3
        )
    )
    assert fields["critical_warning"] == 5 and fields["temperature_c"] == 45
    assert (fields["available_spare_pct"], fields["available_spare_threshold_pct"], fields["percentage_used"]) == (
        4,
        10,
        91,
    )
    assert fields["media_errors"] == 2**70 + 3  # a 128-bit counter, both halves
    assert (fields["power_on_hours"], fields["unsafe_shutdowns"], fields["error_log_entries"]) == (8123, 7, 12)
    assert (fields["data_units_read"], fields["warning_temp_minutes"], fields["critical_temp_minutes"]) == (
        123_456_789,
        4,
        1,
    )
    with pytest.raises(ValueError, match="512 bytes"):
        nvme_reader.decode_smart_log(b"\0" * 100)


def test_the_admin_command_asks_for_log_page_02h_of_every_namespace():
    # _IOWR('N', 0x41, struct nvme_admin_cmd): read-write, 72 bytes, type 'N', number 0x41 (linux/nvme_ioctl.h)
    assert nvme_reader.NVME_IOCTL_ADMIN_CMD == (3 << 30) | (72 << 16) | (ord("N") << 8) | 0x41
    cmd = nvme_reader.get_log_page_command(0xDEADBEEF000)
    assert len(cmd) == 72 and cmd[0] == 0x02  # opcode: Get Log Page
    nsid, addr, data_len, cdw10 = (
        struct.unpack_from("<I", cmd, 4)[0],
        struct.unpack_from("<Q", cmd, 24)[0],
        struct.unpack_from("<I", cmd, 36)[0],
        struct.unpack_from("<I", cmd, 40)[0],
    )
    assert (nsid, addr, data_len) == (0xFFFFFFFF, 0xDEADBEEF000, 512)
    assert cdw10 & 0xFF == 0x02 and cdw10 >> 16 == 127  # log 02h, 128 dwords less one


def test_a_healthy_drive_passes_and_each_failing_field_is_named(tmp_path):
    tree = hgx(tmp_path)
    nvme(tree, "nvme0", smart_log())
    r = _readings(tree)
    drive = r["host"]["nvme"]["drives"][0]
    assert (drive["source"], drive["serial"], drive["pci_bdf"], drive["log"]["temperature_c"]) == (
        "recorded",
        "S6CKNA0W123456",
        "0000:c1:00.0",
        38,
    )
    res = nvme_health.check_nvme_health(r, _profile())
    assert res["status"] == schema.PASS and "1 NVMe drive(s) healthy" in res["reason"] and "nvme0 38 C" in res["reason"]
    nvme(tree, "nvme0", smart_log(critical_warning=0x0C))
    res = nvme_health.check_nvme_health(_readings(tree), _profile())
    assert res["status"] == schema.FAIL and res["class"] == "hardware"
    assert (
        "nvme0 (SAMSUNG MZQL27T6HBLA-00A07, serial S6CKNA0W123456, 0000:c1:00.0): critical warning 0x0c"
        in res["reason"]
    )
    assert "reliability degraded by media or internal errors, media placed in read-only mode" in res["reason"]
    nvme(tree, "nvme0", smart_log(spare=8, spare_threshold=10))
    res = nvme_health.check_nvme_health(_readings(tree), _profile())
    assert res["status"] == schema.FAIL and "available spare 8% below its threshold 10%" in res["reason"]
    assert "replace the drive" in res["remedy"]
    nvme(tree, "nvme0", smart_log(used=93))
    res = nvme_health.check_nvme_health(_readings(tree), _profile())
    assert res["status"] == schema.WARN and "93% of its rated endurance used (warn from 90%)" in res["reason"]
    assert "plan its replacement" in res["remedy"]
    nvme(tree, "nvme0", smart_log(media_errors=2))
    res = nvme_health.check_nvme_health(_readings(tree), _profile())
    assert res["status"] == schema.INFO and "2 media and data integrity error(s) over its life" in res["reason"]


def test_a_fabric_controller_is_left_out_and_a_log_not_read_is_an_error(tmp_path):
    tree = hgx(tmp_path)
    nvme(tree, "nvme1", None, bdf="0000:c2:00.0", transport="tcp")
    r = _readings(tree)
    assert not r["host"]["nvme"]["present"] and "fabric-attached" in r["host"]["nvme"]["reason"]
    assert nvme_health.check_nvme_health(r, _profile())["status"] == schema.SKIP
    nvme(tree, "nvme0", None)  # no recording and no device node: as a drive whose log this user cannot read
    res = nvme_health.check_nvme_health(_readings(tree), _profile())
    assert res["status"] == schema.ERROR and "nvme0 (SAMSUNG" in res["reason"] and "become" in res["remedy"]
    assert (
        vm(tmp_path / "vm")
        and nvme_health.check_nvme_health(_readings(vm(tmp_path / "vm2")), _profile())["status"] == schema.SKIP
    )


def test_nvme_clis_json_is_read_where_it_is_installed(tmp_path):
    tree = hgx(tmp_path)
    nvme(tree, "nvme0", None)
    recorded = {  # `nvme smart-log /dev/nvme0 -o json` of nvme-cli 2.x (temperature in kelvins)
        "critical_warning": 0,
        "temperature": 313,
        "avail_spare": 100,
        "spare_thresh": 10,
        "percent_used": 95,
        "endurance_grp_critical_warning_summary": 0,
        "data_units_read": 4567,
        "data_units_written": 8910,
        "host_read_commands": 1,
        "host_write_commands": 2,
        "controller_busy_time": 3,
        "power_cycles": 40,
        "power_on_hours": 9000,
        "unsafe_shutdowns": 5,
        "media_errors": 0,
        "num_err_log_entries": 77,
        "warning_temp_time": 0,
        "critical_comp_time": 0,
    }
    bindir = tmp_path / "bin"
    (bindir / "nvme").write_text(f"#!/bin/sh\n[ \"$1\" = smart-log ] || exit 64\necho '{json.dumps(recorded)}'\n")
    (bindir / "nvme").chmod(0o755)
    r = _readings(tree)
    drive = r["host"]["nvme"]["drives"][0]
    assert drive["source"] == "nvme-cli" and drive["log"]["percentage_used"] == 95
    assert drive["log"]["temperature_c"] == 40 and drive["log"]["error_log_entries"] == 77
    assert nvme_health.check_nvme_health(r, _profile())["status"] == schema.WARN


# --- available memory --------------------------------------------------------------------------------


def test_a_host_whose_memory_a_neighbour_holds_fails_and_huge_pages_count_as_free(tmp_path):
    tree = hgx(tmp_path)
    meminfo(tree, 2048, 1900)
    res = system_memory.check_memory_available(_readings(tree), _profile())
    assert res["status"] == schema.PASS and "1900.0 GiB of 2048.0 GiB available (92.8%)" in res["reason"]
    meminfo(tree, 2048, 600)
    res = system_memory.check_memory_available(_readings(tree), _profile())
    assert res["status"] == schema.FAIL and res["class"] == "environment" and "under 50%" in res["reason"]
    meminfo(tree, 2048, 600, hugepages_free=500 * 512)  # 500 GiB of 2 MiB pages kept for jobs
    assert system_memory.check_memory_available(_readings(tree), _profile())["status"] == schema.PASS
    (tree.root / "proc/meminfo").unlink()
    assert system_memory.check_memory_available(_readings(tree), _profile())["status"] == schema.ERROR


# --- through the commands, the store and the exports ---------------------------------------------------


def test_edac_and_nvme_counters_reach_the_report_the_store_and_prometheus(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    trees = {n: hgx(tmp_path / n) for n in ("n0", "n1")}
    for t in trees.values():
        edac(t, {"mc0": {"dimm0": (0, 0), "dimm1": (0, 0)}})
        nvme(t, "nvme0", smart_log(media_errors=1))
        meminfo(t, 2048, 1900)

    def failing(tree):
        edac(tree, {"mc0": {"dimm0": (0, 0), "dimm1": (0, 1)}})
        nvme(tree, "nvme0", smart_log(media_errors=4))

    for t in trees.values():
        t.write("proc/sys/kernel/random/boot_id", "boot-1\n")
    _gpufleet("run", "start", str(reports), "r1", "--host", "n0", "--host", "n1")
    for name, tree in trees.items():
        _node_stage(reports / "r1", name, tree, failing if name == "n1" else None)
    _gpufleet("report", str(reports / "r1"), "--json", rc=1)
    rep = json.loads((reports / "r1" / "report.json").read_text())

    def res(h: str, group: str, check: str) -> dict:
        return next(r for r in rep["nodes"][h]["results"] if r["group"] == group and r["check"] == check)

    grown = res("n1", "fleet", "fabric_during_run")
    assert grown["status"] == "fail" and "uncorrected memory errors (EDAC) grew by 1" in grown["reason"]
    assert (
        "NVMe nvme0 (SAMSUNG MZQL27T6HBLA-00A07, serial S6CKNA0W123456, 0000:c1:00.0): NVMe media and data "
        "integrity errors grew by 3" in grown["reason"]
    )
    assert res("n0", "fleet", "fabric_during_run")["status"] == "pass"
    assert res("n1", "host_hygiene", "nvme_health")["status"] == "info"  # read before the errors came
    with sqlite3.connect(reports / "gpufleet.db") as db:
        rows = dict(
            db.execute(
                "SELECT counter, value FROM counters WHERE host = 'n1' AND uuid IN ('edac:mc0/dimm1', 'nvme:S6CKNA0W123456')"
            ).fetchall()
        )
    assert rows == {"edac_ue": 1, "edac_ce": 0, "nvme_media_errors": 4}
    prom = (reports / "r1" / "prometheus" / "n1.prom").read_text()
    assert 'gpufleet_device_counter{counter="edac_ue",device="edac:mc0/dimm1",kind="edac",node="n1"} 1.0' in prom
    assert (
        'gpufleet_device_counter{counter="nvme_percentage_used",device="nvme:S6CKNA0W123456",kind="nvme",node="n1"} 3.0'
        in prom
    )

    # Between the runs n1 rebooted (EDAC's counts start again) and its drive lost more data: a drive's counts are
    # its life's, judged across the reboot.
    trees["n1"].write("proc/sys/kernel/random/boot_id", "boot-2\n")
    edac(trees["n1"], {"mc0": {"dimm0": (0, 0), "dimm1": (0, 0)}})
    nvme(trees["n1"], "nvme0", smart_log(media_errors=6))
    _gpufleet("run", "start", str(reports), "r2", "--host", "n1")
    _node_stage(reports / "r2", "n1", trees["n1"])
    _gpufleet("report", str(reports / "r2"), "--json", rc=1)
    rep = json.loads((reports / "r2" / "report.json").read_text())
    since = res("n1", "fleet", "fabric_since_previous_run")
    assert since["status"] == "fail" and "since run r1" in since["reason"]
    assert "NVMe media and data integrity errors grew by 2" in since["reason"] and "EDAC" not in since["reason"]


def test_a_recording_made_before_these_readers_skips_saying_so():
    readings = {"host": {"pci": []}, "nvml": {}, "kernel_log": {"readable": True, "lines": 1, "xid_events": []}}
    for check in (
        system_memory.check_memory_errors,
        system_memory.check_memory_available,
        nvme_health.check_nvme_health,
    ):
        res = check(readings, _profile())
        assert res["status"] == schema.SKIP and "recorded before gpufleet read it" in res["reason"], res
    res = system_memory.check_machine_checks(
        readings, _profile()
    )  # the kernel log was read: no machine check line in it
    assert res["status"] == schema.PASS
