"""Host hygiene: collect.host over fake sysfs/procfs trees, then the checks."""

from __future__ import annotations

import json
import os

import pytest

from gpufleet.node import host_documents
from gpufleet.base import profiles, schema
from gpufleet.checks import GROUPS, host_hygiene
from gpufleet.collect import host, kernel_log
from sysfs_tree import ACS_OFF, ACS_REDIRECT_ON, Tree, config_space, hgx, vm

H100 = "NVIDIA H100 80GB HBM3"
SITE = {"ib_ports_min": 8, "ib_rate_min_gbps": 400}
CHECK_NAMES = [n for n, _ in GROUPS["host_hygiene"]]


def run(tree: Tree, overrides: dict | None = None) -> dict[str, dict]:
    """Read the tree and run every host hygiene check: {check: result}."""
    readings = {
        "host": host.read(str(tree.root), tree.environ),
        "nvml": {},
        "kernel_log": kernel_log.read(str(tree.root)),
    }
    prof = profiles.resolve(H100, overrides=SITE if overrides is None else overrides)
    return {name: fn(readings, prof) for name, fn in GROUPS["host_hygiene"]}


def statuses(results: dict[str, dict]) -> dict[str, str]:
    return {n: r["status"] for n, r in results.items()}


# A fake tree has no bring-up record: bringup_drift skips there (tests/test_bringup.py covers it); nor an NVMe drive
# (tests/test_host_health.py adds them).
UNTOUCHED = {"bringup_drift": schema.SKIP, "nvme_health": schema.SKIP}


def only(results: dict[str, dict], broken: dict[str, str]) -> None:
    """The broken checks have the given status; every other check passes."""
    assert statuses(results) == {n: broken.get(n, UNTOUCHED.get(n, schema.PASS)) for n in CHECK_NAMES}
    for r in results.values():
        assert r["reason"]
        if r["status"] in (schema.FAIL, schema.WARN):
            assert r["remedy"], r


# --- readings ------------------------------------------------------------------------


def test_hgx_readings_follow_the_tree(tmp_path):
    tree = hgx(tmp_path)
    h = host.read(str(tree.root), tree.environ)
    assert h["errors"] == []
    assert h["kernel"] == "6.8.0-49-generic" and h["os"] == "Ubuntu 22.04.5 LTS"
    kinds = [d["kind"] for d in h["pci"]]
    assert (kinds.count("gpu"), kinds.count("nic"), kinds.count("nvswitch")) == (8, 9, 4)
    gpu = next(d for d in h["pci"] if d["bdf"] == "0000:33:00.0")
    assert gpu["upstream"] == ["0000:30:01.0", "0000:31:00.0", "0000:32:00.0"]
    assert (gpu["driver"], gpu["numa_node"], gpu["current_link_gen"], gpu["current_link_width"]) == ("nvidia", 0, 5, 16)
    mgmt = next(d for d in h["pci"] if d["bdf"] == "0000:00:1c.0")
    assert (mgmt["kind"], mgmt["upstream"], mgmt["max_link_gen"], mgmt["max_link_width"]) == ("nic", [], 4, 8)
    # Bridges above GPUs and NICs only: 8 x (root port, switch up, 2 downstream); not the NVSwitch root ports.
    assert len(h["acs"]) == 32 and all(b["status"] == "ok" and b["ctrl"] == ACS_OFF for b in h["acs"])
    assert "0000:02:01.0" not in {b["bdf"] for b in h["acs"]}
    port = h["infiniband"]["ports"][3]
    assert port == port | {
        "hca": "mlx5_3",
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "rate_gbps": 400,
        "link_layer": "InfiniBand",
        "pci_bdf": "0000:74:00.0",
    }
    assert h["modules"]["loaded"]["nvidia_peermem"] is True
    assert h["iommu"]["cmdline_flags"] == {"intel_iommu": "on", "iommu": "pt"}
    assert {g["mode"] for g in h["iommu"]["gpu_groups"]} == {"passthrough"}
    assert [n["node"] for n in h["numa"]["nodes"]] == [0, 1] and h["numa"]["numa_balancing"] == 0
    assert h["cpu_governors"]["counts"] == {"performance": 8}
    assert h["fabricmanager"]["state"] == "active" and h["fabricmanager"]["rc"] == 0
    # The environment wins over /etc/nccl.conf, as in NCCL; the file fills the rest.
    eff = h["nccl"]["effective"]
    assert eff["NCCL_SOCKET_IFNAME"] == {"value": "=eth0", "source": "environment"}
    assert eff["NCCL_DEBUG"] == {"value": "WARN", "source": str(tree.root / "etc/nccl.conf")}


def test_read_this_machine_returns_documented_keys():
    h = host.read("/")
    json.dumps(h)  # recorded as JSON by `gpufleet collect`
    for key in (
        "root",
        "kernel",
        "os",
        "is_root",
        "pci",
        "acs",
        "infiniband",
        "modules",
        "iommu",
        "numa",
        "cpu_governors",
        "fabricmanager",
        "nccl",
        "bringup",
        "errors",
    ):
        assert key in h, key
    assert isinstance(h["pci"], list) and isinstance(h["acs"], list)
    assert isinstance(h["infiniband"]["present"], bool)
    assert h["is_root"] == (os.geteuid() == 0)
    prof = profiles.resolve(None)
    for name, fn in GROUPS["host_hygiene"]:
        assert (
            schema.timed("host_hygiene", name, lambda fn=fn: fn({"host": h, "nvml": {}}, prof))["status"]
            in schema.STATUSES
        )


def test_read_never_raises_on_an_empty_root(tmp_path):
    h = host.read(str(tmp_path), {})
    assert h["pci"] == [] and h["kernel"] is None
    assert {e["section"] for e in h["errors"]} >= {"kernel", "os", "pci"}
    assert h["infiniband"]["present"] is False and h["modules"]["readable"] is False


# --- the HGX host and what breaks it -----------------------------------------------------------


def test_hgx_passes_everything(tmp_path):
    only(run(hgx(tmp_path)), {})


def test_hgx_through_the_engine(tmp_path):
    tree = hgx(tmp_path)
    readings = {
        "host": host.read(str(tree.root), tree.environ),
        "nvml": {"gpus": [{"name": H100}]},
        "kernel_log": kernel_log.read(str(tree.root)),
    }
    doc = host_documents.check_host(readings, ["host_hygiene"], host="node0", overrides=SITE)
    assert doc["profile"]["name"] == "h100-sxm"
    assert [r["check"] for r in doc["results"]] == CHECK_NAMES
    assert schema.verdict(doc["results"]) == schema.PASS


def test_acs_redirect_on_fails_naming_bridge_and_device(tmp_path):
    res = run(hgx(tmp_path, acs_ctrl=ACS_REDIRECT_ON))
    only(res, {"pcie_acs": schema.FAIL})
    r = res["pcie_acs"]
    assert r["value"] == 32
    redirect = "(p2p_request_redirect, p2p_completion_redirect; ctrl 0x001d)"
    assert f"0000:12:00.0 {redirect} above GPU 0000:13:00.0;" in r["reason"]
    assert f"0000:12:01.0 {redirect} above NIC 0000:14:00.0;" in r["reason"]
    assert "and 28 more (detail.bridges)" in r["reason"]
    assert sum(bool(b["redirect"]) for b in r["detail"]["bridges"]) == 32
    assert "setpci -s 0000:10:01.0 ECAP_ACS+6.w=0" in r["remedy"] and "host_tuning" in r["remedy"]
    assert len(r["detail"]["remedy_commands"]) == 32


def test_bridges_without_acs_capability_pass(tmp_path):
    r = run(hgx(tmp_path, acs_ctrl=None))["pcie_acs"]
    assert r["status"] == schema.PASS and "32 without an ACS capability" in r["reason"]
    assert {b["status"] for b in r["detail"]["bridges"]} == {"no_acs"}


def test_config_space_of_64_bytes_is_an_error(tmp_path):
    res = run(hgx(tmp_path, acs_ctrl=ACS_REDIRECT_ON, config_size=64))
    r = res["pcie_acs"]
    assert r["status"] == schema.ERROR
    assert r["reason"].startswith("needs root to read PCIe extended config space")
    assert r["detail"]["bridges"][0]["config_bytes"] == 64


def test_one_ib_port_down(tmp_path):
    res = run(hgx(tmp_path, ib_down=(3,)))
    only(res, {"infiniband": schema.FAIL})
    r = res["infiniband"]
    assert r["value"] == 7 and r["threshold"]["value"] == 8
    assert "7 of at least 8" in r["reason"] and "mlx5_3/1 (DOWN, Polling)" in r["reason"]
    # With no port floor set, a down port is only a warning.
    assert run(hgx(tmp_path / "b", ib_down=(3,)), {"ib_rate_min_gbps": 400})["infiniband"]["status"] == schema.WARN


def test_ib_rate_below_floor(tmp_path):
    r = run(hgx(tmp_path, ib_rate="200 Gb/sec (4X HDR)"))["infiniband"]
    assert r["status"] == schema.FAIL and "below the rate floor of 400 Gb/s" in r["reason"]
    assert "mlx5_0/1 at 200 Gb/sec (4X HDR)" in r["reason"]


def test_peermem_not_loaded(tmp_path):
    res = run(hgx(tmp_path, peermem=False))
    only(res, {"peermem": schema.FAIL})
    assert "nvidia_peermem is not loaded" in res["peermem"]["reason"]


def test_nccl_ib_disable_with_active_ib(tmp_path):
    res = run(hgx(tmp_path, env={"NCCL_IB_DISABLE": "1"}))
    only(res, {"nccl_env": schema.FAIL})
    assert (
        "NCCL_IB_DISABLE=1 (from environment) on a host with 8 active InfiniBand port(s)" in res["nccl_env"]["reason"]
    )


def test_nccl_conf_sets_what_env_leaves_and_env_wins(tmp_path):
    conf = "NCCL_IB_DISABLE=1\nNCCL_P2P_DISABLE=1\n"
    r = run(hgx(tmp_path, nccl_conf=conf))["nccl_env"]
    assert r["status"] == schema.FAIL and "nccl.conf)" in r["reason"] and "NCCL_P2P_DISABLE=1" in r["reason"]
    r = run(hgx(tmp_path / "b", nccl_conf=conf, env={"NCCL_IB_DISABLE": "0", "NCCL_P2P_DISABLE": "0"}))["nccl_env"]
    assert r["status"] == schema.PASS
    assert r["detail"]["effective"]["NCCL_IB_DISABLE"]["source"] == "environment"


@pytest.mark.parametrize(
    "env, status, words",
    [
        ({"NCCL_SOCKET_IFNAME": "=eth1"}, schema.FAIL, "selects none of this host's interfaces"),
        ({"NCCL_SOCKET_IFNAME": "^eth,ib,lo"}, schema.FAIL, "selects none"),
        ({"NCCL_SOCKET_IFNAME": "^eth,ib"}, schema.WARN, "only the loopback"),
        ({"NCCL_SOCKET_IFNAME": "ib,en"}, schema.PASS, "NCCL environment sane"),
        ({"NCCL_SOCKET_IFNAME": "=eth0:29500"}, schema.PASS, "NCCL environment sane"),
        ({"NCCL_ALGO": "Ring"}, schema.WARN, "NCCL_ALGO=Ring (from environment) overrides"),
        ({"NCCL_PROTO": "Simple"}, schema.WARN, "NCCL_PROTO=Simple"),
        ({"NCCL_SHM_DISABLE": "1"}, schema.WARN, "NCCL_SHM_DISABLE=1"),
        ({"NCCL_DEBUG": "info"}, schema.WARN, "NCCL_DEBUG=info"),
        ({"NCCL_P2P_DISABLE": "1"}, schema.FAIL, "NCCL_P2P_DISABLE=1"),
    ],
)
def test_nccl_env_variables(tmp_path, env, status, words):
    r = run(hgx(tmp_path, env=env))["nccl_env"]
    assert r["status"] == status and words in r["reason"]


def test_nccl_conf_line_with_spaces_has_no_effect(tmp_path):
    r = run(hgx(tmp_path, nccl_conf="# site defaults\nNCCL_DEBUG = INFO\n"))["nccl_env"]
    assert r["status"] == schema.WARN and "line 2 'NCCL_DEBUG = INFO' has no effect" in r["reason"]


def test_socket_ifname_syntax():
    ifs = ["docker0", "eth0", "eth1", "ib0", "lo"]
    assert host_hygiene.nccl_env.socket_ifname_matches("eth", ifs) == ["eth0", "eth1"]
    assert host_hygiene.nccl_env.socket_ifname_matches("=eth", ifs) == []
    assert host_hygiene.nccl_env.socket_ifname_matches("=eth1,ib0", ifs) == ["eth1", "ib0"]
    assert host_hygiene.nccl_env.socket_ifname_matches("^docker,lo", ifs) == ["eth0", "eth1", "ib0"]
    assert host_hygiene.nccl_env.socket_ifname_matches("^=eth0", ifs) == ["docker0", "eth1", "ib0", "lo"]
    assert (
        host_hygiene.nccl_env.nccl_int("1") == 1
        and host_hygiene.nccl_env.nccl_int("0x10") == 16
        and host_hygiene.nccl_env.nccl_int("yes") == 0
    )


def test_fabric_manager_inactive_fails(tmp_path):
    res = run(hgx(tmp_path, fabricmanager=("inactive", 3)))
    only(res, {"fabric_manager": schema.FAIL})
    assert res["fabric_manager"]["detail"]["rc"] == 3
    assert "nvidia-fabricmanager is inactive with 4 NVSwitch(es)" in res["fabric_manager"]["reason"]


def test_fabric_manager_without_systemctl_is_an_error(tmp_path):
    tree = hgx(tmp_path)
    tree.environ["PATH"] = str(tmp_path / "empty")
    r = run(tree)["fabric_manager"]
    assert r["status"] == schema.ERROR and "systemctl not found on PATH" in r["reason"]


def test_iommu_translated(tmp_path):
    res = run(hgx(tmp_path, iommu_type="DMA-FQ"))
    only(res, {"iommu": schema.WARN})
    assert "group type DMA-FQ" in res["iommu"]["reason"]
    r = run(hgx(tmp_path / "b", iommu_type="DMA"), SITE | {"iommu_passthrough_required": True})["iommu"]
    assert r["status"] == schema.FAIL and r["threshold"]["value"] is True


def test_numa_gpus_without_a_local_nic(tmp_path):
    res = run(hgx(tmp_path, nic_numa=(0,) * 8))
    only(res, {"numa_affinity": schema.WARN})
    r = res["numa_affinity"]
    assert "4 GPU(s) sit on NUMA node(s) [1] with no NIC while NICs sit on node(s) [0]" in r["reason"]
    assert r["detail"]["gpus"]["0000:93:00.0"] == 1 and r["detail"]["nics"]["0000:94:00.0"] == 0


def test_numa_unknown_on_a_two_socket_host(tmp_path):
    r = run(hgx(tmp_path, gpu_numa=(-1,) * 8))["numa_affinity"]
    assert r["status"] == schema.WARN and "8 GPU(s) report numa_node -1 on a host with 2 NUMA nodes" in r["reason"]


def test_tuning_off_profile(tmp_path):
    res = run(hgx(tmp_path, numa_balancing=1, governors=("performance",) * 6 + ("powersave",) * 2))
    only(res, {"numa_balancing": schema.FAIL, "cpu_governor": schema.FAIL})
    assert res["numa_balancing"]["reason"] == "kernel.numa_balancing is 1, expected 0"
    assert res["cpu_governor"]["reason"] == "2 of 8 CPUs not on the performance governor: {'powersave': 2}"


# --- a virtual machine: skips with reasons ------------------------------------------------------


# What a VM lacks of an HGX node: these checks skip there, saying why; every other check of the group passes.
VM_SKIPS = (
    "pcie_acs",
    "infiniband",
    "ib_port_speed",
    "gpu_nic_rails",
    "peermem",
    "numa_balancing",
    "cpu_governor",
    "fabric_manager",
    "memory_errors",
)


def test_vm_skips_with_reasons(tmp_path):
    res = run(vm(tmp_path), {})
    only(res, dict.fromkeys(VM_SKIPS, schema.SKIP))
    assert "no EDAC memory controller" in res["memory_errors"]["reason"]
    assert "sit on the root bus" in res["pcie_acs"]["reason"]
    assert res["infiniband"]["reason"] == "no InfiniBand HCA found under /sys/class/infiniband"
    assert res["cpu_governor"]["reason"] == "no CPU frequency scaling exposed (cpufreq absent)"
    assert res["numa_affinity"]["reason"].startswith("single NUMA node")
    assert res["iommu"]["reason"].startswith("no IOMMU active")
    assert "numa_balancing: not present" in res["numa_balancing"]["reason"]


def test_vm_with_ib_expected_fails(tmp_path):
    r = run(vm(tmp_path), {"ib_ports_min": 2})["infiniband"]
    assert r["status"] == schema.FAIL and "expected at least 2 active InfiniBand port(s)" in r["reason"]


def test_no_gpu_skips_gpu_checks(tmp_path):
    tree = Tree(tmp_path / "root")
    tree.pci("0000:00:03.0", vendor="0x1af4", device="0x1041", cls="0x020000")
    res = run(tree, {})
    assert {n: res[n]["status"] for n in ("pcie_acs", "numa_affinity", "iommu")} == {
        n: schema.SKIP for n in ("pcie_acs", "numa_affinity", "iommu")
    }


# --- config space decoding -------------------------------------------------------------------------


def test_decode_acs_variants():
    on = host.decode_acs(config_space(acs_ctrl=ACS_REDIRECT_ON))
    assert on["status"] == "ok" and on["cap_offset"] == "0x200" and on["ctrl"] == 0x1D
    assert {k for k, v in on["ctrl_bits"].items() if v} == {
        "source_validation",
        "p2p_request_redirect",
        "p2p_completion_redirect",
        "upstream_forwarding",
    }
    assert host.decode_acs(config_space(size=256))["status"] == "no_ext_config"  # PCIe, but no ECAM access
    conventional = bytearray(config_space(size=256))
    conventional[0x06] = 0  # no capability list: a conventional PCI device
    assert host.decode_acs(bytes(conventional))["status"] == "no_acs"
    assert host.decode_acs(config_space(size=64))["status"] == "needs_root"
    looped = bytearray(config_space(acs_ctrl=None))
    looped[0x102:0x104] = (0x100 << 4).to_bytes(2, "little")  # AER's next points back at itself
    assert host.decode_acs(bytes(looped))["ext_caps"] == ["0x0001@0x100"]  # the walk ends


def test_parsers():
    assert host.parse_link_speed("32.0 GT/s PCIe") == 5
    assert host.parse_link_speed("2.5 GT/s") == 1
    assert host.parse_link_speed("Unknown") is None
    assert host.parse_rate_gbps("400 Gb/sec (4X NDR)") == 400
    assert host.parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert host.upstream_chain("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0") == ["0000:00:01.0"]
    assert host.pci_kind("0x15b3", "0x020700") == "nic" and host.pci_kind("0x10de", "0x068000") == "nvswitch"
    assert host.pci_kind("0x10de", "0x030000") == "gpu" and host.pci_kind("0x10de", "0x040300") == "other"
