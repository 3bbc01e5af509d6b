"""The fabric through real validate.yml runs over three test hosts of our own (tests/testhosts.py), each seeing a
recorded sysfs tree at /sys (tests/sysfs_tree.py, bound over the host's /sys): node-c's HCAs sit in another order
and one of its ports trained at 2 lanes; between the two runs node-b's mlx5_3 flaps (link error recoveries, a link
down) and the bridge above its GPU 3 counts a fatal AER error. The second run's report names the flapping port, the
AER error and the odd node out, each with its evidence and its threshold's source.
The benchmarks run on the CPU: every node fails acceptance (no GPU), a logic check.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from playbooks import validate_on
from sysfs_tree import hgx
from testhosts import TOOL_PATH, TestFleet, skip_reason

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NODES = ["node-a", "node-b", "node-c"]
GPU3_BRIDGE = "0000:72:00.0"


def playbook(fleet: TestFleet, inventory: Path, reports: Path, run_id: str) -> tuple[int, str]:
    return validate_on(fleet, inventory, reports, run_id, timeout_s=540)


def result(report: dict, host: str, group: str, check: str) -> dict:
    (res,) = [r for r in report["nodes"][host]["results"] if r["group"] == group and r["check"] == check]
    return res


def test_report_names_the_flapping_port_the_aer_error_and_the_odd_node(tmp_path):
    why = skip_reason() or (None if shutil.which("nsenter", path=TOOL_PATH) else "missing nsenter (util-linux)")
    if why:
        pytest.skip(why)
    trees = {
        "node-a": hgx(tmp_path / "node-a"),
        "node-b": hgx(tmp_path / "node-b"),
        "node-c": hgx(tmp_path / "node-c", hca_names=(0, 1, 2, 3, 5, 4, 6, 7), ib_rates={2: "200 Gb/sec (2X NDR)"}),
    }
    reports = tmp_path / "reports"
    with TestFleet(NODES, net=235, tag="gff") as fleet:
        for name, tree in trees.items():
            fleet.sys_from(name, tree.root / "sys")
        # The engine of this checkout on the nodes; one benchmark, so the counters are read before and after it.
        nodes = {
            n: {"gpufleet_node_env": dict(fleet.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"))}
            for n in NODES
        }
        inventory = fleet.inventory(tmp_path / "hosts.yml", host_vars=nodes, gpufleet_benchmarks=["memory"])
        first, second = f"fab1-{uuid.uuid4().hex[:8]}", f"fab2-{uuid.uuid4().hex[:8]}"
        rc, out = playbook(fleet, inventory, reports, first)
        assert rc != 0 and "Fail when a node was not accepted" in out, out[-6000:]
        rep1 = json.loads((reports / first / "report.json").read_text())
        assert result(rep1, "node-b", "fleet", "fabric_during_run")["status"] == "pass", out[-3000:]
        # 8 ports, 48 PCIe devices, and the host's own: EDAC's 4 DIMMs and each controller's errors on none
        assert result(rep1, "node-b", "counters", "fabric_before")["value"] == 62

        trees["node-b"].ib_counter("mlx5_3", 1, "link_error_recovery", 40)
        trees["node-b"].ib_counter("mlx5_3", 1, "link_downed", 1)
        trees["node-b"].aer(GPU3_BRIDGE, "fatal", {"SDES": 1})
        rc, out = playbook(fleet, inventory, reports, second)
        assert rc != 0, out[-6000:]
    rep = json.loads((reports / second / "report.json").read_text())

    flapped = result(rep, "node-b", "fleet", "fabric_since_previous_run")
    assert flapped["status"] == "fail" and f"since run {first}" in flapped["reason"], flapped["reason"]
    assert (
        "mlx5_3 port 1: link error recoveries grew by 40" in flapped["reason"]
        and "(a flapping link)" in flapped["reason"]
    )
    assert "mlx5_3 port 1: link downs grew by 1" in flapped["reason"]
    assert "bridge 0000:72:00.0 (above 0000:73:00.0): fatal AER errors grew by 1" in flapped["reason"]
    sources = flapped["detail"]["thresholds"]
    assert "NVSentinel" in sources["fabric_ib_link_error_recovery_per_min_max"]["source"]
    assert "GCM" in sources["fabric_aer_fatal_max"]["source"]
    aer = result(rep, "node-b", "host_hygiene", "pcie_aer")
    assert aer["status"] == "fail" and "fatal: bridge 0000:72:00.0 (above 0000:73:00.0): 1 (SDES 1)" in aer["reason"]
    assert result(rep, "node-a", "fleet", "fabric_since_previous_run")["status"] == "pass"

    slow = result(rep, "node-c", "fleet", "ib_ports_vs_fleet")
    assert (
        slow["status"] == "fail"
        and "mlx5_2/1 at 200 Gb/sec (2X NDR) while 2 of 3 nodes run it at 400 Gb/sec (4X NDR)" in slow["reason"]
    )
    assert slow["threshold"]["key"] == "fleet_fabric_reference_share_min" and slow["threshold"]["source"]
    assert result(rep, "node-c", "host_hygiene", "ib_port_speed")["status"] == "fail"
    rails = result(rep, "node-c", "fleet", "rails_vs_fleet")
    assert rails["status"] == "warn" and "GPU 4 sits beside mlx5_5 where 2 of 3 nodes have mlx5_4" in rails["reason"]
    assert result(rep, "node-a", "fleet", "rails_vs_fleet")["status"] == "pass"
    md = (reports / second / "report.md").read_text()
    assert (
        "a flapping link" in md and "fatal AER errors" in md and "mlx5_2/1 at 200 Gb/sec" in md and "NVSentinel" in md
    )
