"""The fabric: InfiniBand port counters and PCIe AER counts as growth, the ports' speed and the GPU-HCA rails, on
a node and across nodes. Fake sysfs trees (sysfs_tree.hgx) read by the real commands: `gpufleet check --root`,
`gpufleet counters --root` before and after, `gpufleet record` and `gpufleet report` over two runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.base import profiles, schema
from gpufleet.checks import host_hygiene
from gpufleet.collect import counters, host
from gpufleet.fleet import fabric_growth
from gpufleet.comparisons import metrics
from gpufleet.comparisons.thresholds import Thresholds, thresholds_for

from sysfs_tree import hgx, vm

SRC = Path(__file__).resolve().parents[1] / "src"
# The H100 VM's NVML, recorded: hw shows its GPU whether or not this machine has one (and so exits 0).
VM_READINGS = SRC.parent / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"
H100 = "NVIDIA H100 80GB HBM3"
GPU3_BRIDGE = "0000:72:00.0"  # the switch's downstream port above GPU 3 (0000:73:00.0) of hgx()


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))


def _readings(tree) -> dict:
    return {"host": host.read(str(tree.root), tree.environ), "nvml": {}}


def _fabric(tree, phase: str, read_at: str) -> dict:
    res = counters.fabric_snapshot(phase, _readings(tree), boot_id="boot-1")
    res["detail"]["read_at"] = read_at
    return res


def _judge(before: dict, after: dict) -> dict:
    results = [dict(before, group="counters"), dict(after, group="counters")]
    thr = Thresholds(thresholds_for(None))
    return fabric_growth.fabric_during_run("n0", metrics.extract(results), thr)


# --- readings --------------------------------------------------------------------------------


def test_port_counters_and_aer_are_read_from_the_tree(tmp_path):
    tree = hgx(tmp_path)
    tree.ib_counter("mlx5_3", 1, "symbol_error", 17)
    tree.aer(GPU3_BRIDGE, "correctable", {"RxErr": 2, "BadTLP": 1})
    h = host.read(str(tree.root), tree.environ)
    port = h["infiniband"]["ports"][3]
    assert (port["hca"], port["lanes"], port["counters"]["symbol_error"], port["counters"]["rnr_nak_retry_err"]) == (
        "mlx5_3",
        4,
        17,
        0,
    )
    assert "lifespan" not in port["counters"] and "port_xmit_data" in port["counters"]
    by_bdf = {d["bdf"]: d for d in h["aer"]["devices"]}
    # every GPU, HCA and bridge up to the root port, each once; NVSwitches and the management NIC are not on a GPU's path
    assert len(by_bdf) == 48 and "0000:06:00.0" not in by_bdf and "0000:00:1c.0" not in by_bdf
    bridge = by_bdf[GPU3_BRIDGE]
    assert bridge["role"] == "bridge" and bridge["below"] == ["0000:73:00.0"]
    assert bridge["correctable"] == {"total": 3, "names": {"RxErr": 2, "BadTLP": 1}} and bridge["fatal"] == {
        "total": 0,
        "names": {},
    }
    assert by_bdf["0000:73:00.0"]["role"] == "gpu" and by_bdf["0000:74:00.0"]["role"] == "hca"


def test_aer_files_absent_or_unreadable_are_named(tmp_path):
    tree = hgx(tmp_path)
    for path in tree.root.glob("sys/devices/**/aer_dev_*"):
        path.unlink()
    aer = host.read(str(tree.root), tree.environ)["aer"]
    assert aer["present"] is False and "no aer_dev_* file" in aer["reason"]
    assert all(d["correctable"] is None and "not present" in d["reason"] for d in aer["devices"])
    res = host_hygiene.pcie.check_pcie_aer(_readings(tree), profiles.resolve(H100))
    assert res["status"] == schema.SKIP and "no aer_dev_* file" in res["reason"]


def test_no_infiniband_and_no_aer_is_a_skip_with_the_reasons(tmp_path):
    tree = hgx(tmp_path)
    for path in tree.root.glob("sys/devices/**/aer_dev_*"):
        path.unlink()
    (tree.root / "sys/class/infiniband").rename(tree.root / "ib-gone")
    res = counters.fabric_snapshot("before", _readings(tree), boot_id="b")
    assert res["status"] == schema.PASS and "EDAC memory errors of 6 DIMM(s)" in res["reason"]  # the host's own
    (tree.root / "sys/devices/system/edac").rename(tree.root / "edac-gone")
    res = counters.fabric_snapshot("before", _readings(tree), boot_id="b")
    assert res["status"] == schema.SKIP
    assert "no InfiniBand" in res["reason"] and "sys/class/infiniband: not present" in res["reason"]
    assert "no aer_dev_* file" in res["reason"] and "no EDAC (no EDAC memory controller" in res["reason"]


@pytest.mark.slow
def test_a_gpu_vm_without_infiniband_or_aer_statistics_skips_and_hw_says_why(tmp_path):
    # As on the H100 VM the engine runs on: the GPU on the root bus, no /sys/class/infiniband, no aer_dev_* files.
    tree = vm(tmp_path)
    for path in tree.root.glob("sys/devices/**/aer_dev_*"):
        path.unlink()
    r = _readings(tree)
    assert host_hygiene.pcie.check_pcie_aer(r, profiles.resolve(H100))["status"] == schema.SKIP
    assert host_hygiene.infiniband.check_gpu_nic_rails(r, profiles.resolve(H100))["status"] == schema.SKIP
    res = counters.fabric_snapshot("before", r, boot_id="b")
    assert res["status"] == schema.SKIP and "no aer_dev_* file" in res["reason"]
    text = _gpufleet("hw", "--root", str(tree.root), "--readings", str(VM_READINGS)).stdout
    assert "PCIe AER   not read (no aer_dev_* file under any GPU, HCA or bridge above them" in text
    # With the AER files back the snapshot is read, and the judgement says there is no InfiniBand to judge.
    for bdf in ("0000:00:05.0",):
        for sev in ("correctable", "nonfatal", "fatal"):
            tree.aer(bdf, sev, {})
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    res = _judge(before, _fabric(tree, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.PASS and "0 InfiniBand port(s) and 1 PCIe device(s)" in res["reason"]
    assert "no InfiniBand (" in res["reason"] and "infiniband: not present" in res["reason"]


# --- growth within a run ---------------------------------------------------------------------


def test_a_flapping_port_fails_with_its_rate_and_source(tmp_path):
    tree = hgx(tmp_path)
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    tree.ib_counter("mlx5_3", 1, "link_error_recovery", 80)  # 8 a minute over 10 minutes
    tree.ib_counter("mlx5_3", 1, "link_downed", 2)
    tree.ib_counter("mlx5_6", 1, "link_error_recovery", 30)  # 3 a minute: within
    res = _judge(before, _fabric(tree, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.FAIL and res["group"] == "fleet"
    assert "mlx5_3 port 1: link error recoveries grew by 80 in 10 min, 8/min (a flapping link)" in res["reason"]
    assert "mlx5_3 port 1: link downs grew by 2" in res["reason"]
    assert "mlx5_6" not in res["reason"]
    keys = res["detail"]["thresholds"]
    assert "NVSentinel" in keys["fabric_ib_link_error_recovery_per_min_max"]["source"]
    assert keys["fabric_ib_link_downed_max"]["value"] == 0
    assert res["threshold"]["key"] in keys and res["remedy"]
    moved = {d["name"]: d["counters"] for d in res["detail"]["devices"]}
    assert moved["mlx5_6 port 1"]["link_error_recovery"]["status"] == schema.PASS


def test_symbol_errors_over_the_spec_bit_error_ratio_at_the_port_rate(tmp_path):
    tree = hgx(tmp_path, ib_rates={5: "200 Gb/sec (2X NDR)"})
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    # Over 2 hours: 400 Gb/s allows 1e-12 x 400e9 x 3600 = 1440 an hour, 200 Gb/s half that.
    tree.ib_counter("mlx5_1", 1, "symbol_error", 2000)  # 1000/h at 400 Gb/s: within
    tree.ib_counter("mlx5_5", 1, "symbol_error", 2000)  # 1000/h at 200 Gb/s: over 720
    res = _judge(before, _fabric(tree, "after", "2026-11-24T10:00:00Z"))
    assert res["status"] == schema.FAIL
    assert "mlx5_5 port 1: symbol errors grew by 2000 in 2.0 h, 1,000/h" in res["reason"]
    assert "1e-12 x 200e9 b/s x 3600 s = 720 per hour" in res["reason"]
    assert "mlx5_1" not in res["reason"]
    assert "1e-12 x 400e9 b/s x 3600 s = 1,440 per hour" in res["detail"]["thresholds"]["fabric_ib_ber_max"]["source"]


def test_aer_on_a_gpu_bridge_fatal_fails_nonfatal_warns_and_correctable_as_a_rate(tmp_path):
    tree = hgx(tmp_path)
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    tree.aer(GPU3_BRIDGE, "fatal", {"SDES": 1})
    tree.aer("0000:33:00.0", "nonfatal", {"CmpltTO": 2})
    res = _judge(before, _fabric(tree, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.FAIL
    assert "bridge 0000:72:00.0 (above 0000:73:00.0): fatal AER errors grew by 1" in res["reason"]
    assert "fatal SDES 1" in res["reason"]
    assert "GPU 0000:33:00.0: non-fatal uncorrectable AER errors grew by 2" in res["reason"]
    assert "GCM" in res["detail"]["thresholds"]["fabric_aer_fatal_max"]["source"]
    # Correctable ones as a rate: 100 in 10 min, 10 a minute, is information with the rate (DCGM's diag fails a
    # device from 16 a minute); 160, 16 a minute, fails.
    tree2 = hgx(tmp_path / "2")
    before = _fabric(tree2, "before", "2026-11-24T08:00:00Z")
    tree2.aer(GPU3_BRIDGE, "correctable", {"RxErr": 100})
    res = _judge(before, _fabric(tree2, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.INFO and res["class"] is None and res["remedy"] is None
    assert (
        "bridge 0000:72:00.0 (above 0000:73:00.0): correctable AER errors grew by 100 in 10 min: 10 a minute (now 100; "
        "limit 16 a minute a device (DCGM diag, fabric_aer_correctable_per_min_fail); correctable RxErr 100)"
    ) in res["reason"]
    source = res["detail"]["thresholds"]["fabric_aer_correctable_per_min_fail"]["source"]
    assert "nvvs/plugin_src/pcie/Pcie.cpp" in source and "GCM" in source
    tree2.aer(GPU3_BRIDGE, "correctable", {"RxErr": 160})
    res = _judge(before, _fabric(tree2, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.FAIL and res["class"] == "hardware" and "DCGM's rate" in res["remedy"]
    assert "correctable AER errors grew by 160 in 10 min: 16 a minute" in res["reason"]


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda t: (t.root / "sys/class/infiniband/mlx5_2/ports/1/counters/link_downed").unlink(),
            "read before (0), unreadable or gone now",
        ),
        (lambda t: t.ib_counter("mlx5_2", 1, "link_downed", 255), "the maximum of its 8-bit IBTA PortCounters field"),
    ],
)
def test_a_counter_that_stops_counting_is_named(tmp_path, change, words):
    tree = hgx(tmp_path)
    tree.ib_counter("mlx5_2", 1, "port_rcv_errors", 50)
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    change(tree)
    res = _judge(before, _fabric(tree, "after", "2026-11-24T08:10:00Z"))
    assert "mlx5_2 port 1: link downs" in res["reason"] and words in res["reason"]
    assert res["status"] in (schema.WARN, schema.FAIL)


def test_a_counter_back_below_without_a_reboot_stopped_counting(tmp_path):
    tree = hgx(tmp_path)
    tree.ib_counter("mlx5_2", 1, "port_rcv_errors", 50)
    before = _fabric(tree, "before", "2026-11-24T08:00:00Z")
    tree.ib_counter("mlx5_2", 1, "port_rcv_errors", 3)
    res = _judge(before, _fabric(tree, "after", "2026-11-24T08:10:00Z"))
    assert res["status"] == schema.WARN
    assert "receive errors stopped counting: went back from 50 to 3 without a reboot" in res["reason"]


# --- the node checks ---------------------------------------------------------------------------


def test_port_trained_at_fewer_lanes_is_named(tmp_path):
    res = host_hygiene.infiniband.check_ib_port_speed(
        _readings(hgx(tmp_path, ib_rates={4: "200 Gb/sec (2X NDR)"})), profiles.resolve(H100)
    )
    assert res["status"] == schema.FAIL and res["value"] == 1
    assert (
        "mlx5_4/1 at 200 Gb/sec (2X NDR) (a lower rate and fewer lanes than its InfiniBand siblings at 400 Gb/sec (4X NDR))"
        in res["reason"]
    )
    ok = host_hygiene.infiniband.check_ib_port_speed(_readings(hgx(tmp_path / "ok")), profiles.resolve(H100))
    assert ok["status"] == schema.PASS and "8 active port(s) alike" in ok["reason"]


def test_pcie_aer_since_boot(tmp_path):
    tree = hgx(tmp_path)
    prof = profiles.resolve(H100)
    tree.aer(GPU3_BRIDGE, "correctable", {"RxErr": 4})
    res = host_hygiene.pcie.check_pcie_aer(_readings(tree), prof)
    assert res["status"] == schema.PASS and "bridge 0000:72:00.0 (above 0000:73:00.0): 4 (RxErr 4)" in res["reason"]
    tree.aer("0000:74:00.0", "nonfatal", {"CmpltTO": 1})
    res = host_hygiene.pcie.check_pcie_aer(_readings(tree), prof)
    assert res["status"] == schema.WARN and "non-fatal uncorrectable: HCA 0000:74:00.0: 1 (CmpltTO 1)" in res["reason"]
    tree.aer(GPU3_BRIDGE, "fatal", {"DLP": 1})
    res = host_hygiene.pcie.check_pcie_aer(_readings(tree), prof)
    assert (
        res["status"] == schema.FAIL and "fatal: bridge 0000:72:00.0 (above 0000:73:00.0): 1 (DLP 1)" in res["reason"]
    )
    assert res["threshold"]["key"] == "fabric_aer_fatal_max" and res["class"] == "hardware"


def test_rails_pair_each_gpu_with_the_hca_under_its_switch(tmp_path):
    res = host_hygiene.infiniband.check_gpu_nic_rails(
        _readings(hgx(tmp_path, hca_names=(0, 1, 2, 3, 5, 4, 6, 7))), profiles.resolve(H100)
    )
    assert res["status"] == schema.PASS
    rails = {r["gpu"]: r["hca"] for r in res["detail"]["rails"]}
    assert rails == {
        0: "mlx5_0",
        1: "mlx5_1",
        2: "mlx5_2",
        3: "mlx5_3",
        4: "mlx5_5",
        5: "mlx5_4",
        6: "mlx5_6",
        7: "mlx5_7",
    }
    assert all(r["shared_bridges"] == 2 and r["same_numa"] for r in res["detail"]["rails"])


def test_a_gpu_with_no_hca_beside_it_is_named(tmp_path):
    res = host_hygiene.infiniband.check_gpu_nic_rails(_readings(hgx(tmp_path, no_hca=(6,))), profiles.resolve(H100))
    assert res["status"] == schema.FAIL and res["value"] == 1
    assert "GPU 6 (0000:d3:00.0, NUMA node 1): nearest HCA mlx5_4 (0000:94:00.0) only through the CPU" in res["reason"]


# --- across nodes, through the real commands ---------------------------------------------------


def _gpufleet(*args: str, stdin: str | None = None, rc: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], input=stdin, capture_output=True, text=True, env=_env(), timeout=300
    )
    assert proc.returncode == rc, (args, proc.stderr[-2000:])
    return proc


def _node_stage(run_dir: Path, name: str, tree, disturb=None) -> None:
    """What the node stage does on one node: the host checks, the counters before and after the benchmarks (here:
    `disturb`, the fabric misbehaving meanwhile), each document recorded on the controller."""
    common = ["--root", str(tree.root), "--json", "--exit-zero", "--host", name, "--profile", "h100-sxm"]
    check = json.loads(_gpufleet("check", "--group", "host_hygiene", *common).stdout)
    before = json.loads(_gpufleet("counters", "--phase", "before", *common).stdout)
    if disturb:
        disturb(tree)
    after = json.loads(_gpufleet("counters", "--phase", "after", *common).stdout)
    check["results"] += before["results"] + after["results"]
    _gpufleet("record", str(run_dir), name, stdin=json.dumps(check))


@pytest.mark.slow
def test_report_names_the_flapping_port_the_aer_errors_and_the_odd_node(tmp_path):
    reports = tmp_path / "reports"
    trees = {
        "n0": hgx(tmp_path / "n0"),
        "n1": hgx(tmp_path / "n1"),
        "n2": hgx(tmp_path / "n2", hca_names=(0, 1, 2, 3, 5, 4, 6, 7), ib_rates={2: "200 Gb/sec (2X NDR)"}),
    }

    def flap(tree):
        tree.ib_counter("mlx5_3", 1, "link_error_recovery", 40)
        tree.ib_counter("mlx5_3", 1, "link_downed", 1)
        tree.aer(GPU3_BRIDGE, "fatal", {"SDES": 1})

    reports.mkdir()
    _gpufleet("run", "start", str(reports), "r1", *[a for n in trees for a in ("--host", n)])
    for name, tree in trees.items():
        _node_stage(reports / "r1", name, tree, flap if name == "n1" else None)
    _gpufleet("report", str(reports / "r1"), "--json", rc=1)  # a node not accepted: exit 1
    rep = json.loads((reports / "r1" / "report.json").read_text())

    def res(host: str, group: str, check: str) -> dict:
        return next(r for r in rep["nodes"][host]["results"] if r["group"] == group and r["check"] == check)

    flapped = res("n1", "fleet", "fabric_during_run")
    assert flapped["status"] == "fail"
    assert (
        "mlx5_3 port 1: link error recoveries grew by 40" in flapped["reason"]
        and "(a flapping link)" in flapped["reason"]
    )
    assert "bridge 0000:72:00.0 (above 0000:73:00.0): fatal AER errors grew by 1" in flapped["reason"]
    assert "NVSentinel" in flapped["detail"]["thresholds"]["fabric_ib_link_error_recovery_per_min_max"]["source"]
    assert res("n1", "host_hygiene", "pcie_aer")["status"] == "pass"  # read before the fatal one came
    assert res("n0", "fleet", "fabric_during_run")["status"] == "pass"
    assert res("n0", "fleet", "fabric_since_previous_run")["status"] == "skip"  # the first run: the reference
    slow = res("n2", "fleet", "ib_ports_vs_fleet")
    assert (
        slow["status"] == "fail"
        and "mlx5_2/1 at 200 Gb/sec (2X NDR) while 2 of 3 nodes run it at 400 Gb/sec (4X NDR) (n0, n1)"
        in slow["reason"]
    )
    assert slow["threshold"]["key"] == "fleet_fabric_reference_share_min" and "majority" in slow["threshold"]["source"]
    assert res("n2", "host_hygiene", "ib_port_speed")["status"] == "fail"
    rails = res("n2", "fleet", "rails_vs_fleet")
    assert rails["status"] == "warn" and "GPU 4 sits beside mlx5_5 where 2 of 3 nodes have mlx5_4" in rails["reason"]
    assert res("n0", "fleet", "rails_vs_fleet")["status"] == "pass"
    md = (reports / "r1" / "report.md").read_text()
    assert "fabric_during_run" in md and "a flapping link" in md and "NVSentinel" in md

    # Between the runs n1's port kept recovering, n0 was clean; each is judged against its own r1 snapshot.
    trees["n1"].ib_counter("mlx5_3", 1, "link_error_recovery", 400)
    _gpufleet("run", "start", str(reports), "r2", "--host", "n0", "--host", "n1")
    for name in ("n0", "n1"):
        _node_stage(reports / "r2", name, trees[name])
    _gpufleet("report", str(reports / "r2"), "--json", rc=1)
    rep = json.loads((reports / "r2" / "report.json").read_text())
    since = res("n1", "fleet", "fabric_since_previous_run")
    assert since["status"] == "fail" and "since run r1" in since["reason"]
    assert "mlx5_3 port 1: link error recoveries grew by 360" in since["reason"]
    assert res("n0", "fleet", "fabric_since_previous_run")["status"] == "pass"
