"""One picture of the fleet's software and firmware: the readings of collect.software over fake trees, the
versions of a host document, and the fleet's table built from host documents that differ in one component,
through the real report (report.json, report.md, report.html) and `gpufleet versions`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import report
from gpufleet.base import schema
from gpufleet.collect import software
from gpufleet.fleet import versions
from gpufleet.commands.records import run_versions

from test_fleet_synthetic import node_doc, write_run

REPO = Path(__file__).resolve().parents[1]
PLUGIN_A, PLUGIN_B = "a" * 64, "b" * 64


def versions_of(**changes) -> dict:
    """A node's versions as schema.versions() writes them, the same on every node unless changed."""
    base = {
        "engine": "0.1.0",
        "driver": "570.124.06",
        "cuda_driver": "12.8",
        "nvml": "12.570.124.06",
        "kernel": "6.8.0-60-generic",
        "os": "Ubuntu 22.04.5 LTS",
        "python": "3.11.7",
        "vbios": ["96.00.A5.00.01"] * 8,
        "inforom_image": ["G520.0200.00.05"] * 8,
        "hca_fw": {f"mlx5_{i}": "28.42.1000" for i in range(8)},
        "hca_board_id": {f"mlx5_{i}": "MT_0000000838" for i in range(8)},
        "ofed": "MLNX_OFED_LINUX-24.10-1.1.4.0",
        "rdma_core": None,
        "nccl": "2.26.2",
        "nccl_libraries": {"/usr/lib/x86_64-linux-gnu/libnccl.so.2.26.2": "2.26.2"},
        "nccl_net_plugin": {"path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "sha256": PLUGIN_A},
        "torch": "2.7.0+cu128",
        "torch_cuda": "12.8",
        "not_read": {
            "rdma_core": "no rdma-core package in /var/lib/dpkg/status and no libibverbs.so.1.* in the loader's folders"
        },
    }
    return {**base, **changes}


def build(tmp_path: Path, by_host: dict[str, dict], run_id: str = "r1", **kw) -> dict:
    docs = {}
    for i, (host, ver) in enumerate(by_host.items()):
        docs[host] = dict(node_doc(host, i), versions=ver)
    report.build(write_run(tmp_path / "reports", run_id, docs, **kw))
    return json.loads((tmp_path / "reports" / run_id / "report.json").read_text())


def fleet_versions(rep: dict, host: str) -> dict | None:
    """The node's fleet.versions result; None where it differs in nothing."""
    found = [r for r in rep["nodes"][host]["results"] if r["group"] == "fleet" and r["check"] == "versions"]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_node_with_another_net_plugin_fails_naming_the_file_and_both_hashes(tmp_path):
    odd = {"path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "sha256": PLUGIN_B}
    rep = build(
        tmp_path,
        {"n0": versions_of(), "n1": versions_of(nccl_net_plugin=odd, kernel="6.8.0-59-generic"), "n2": versions_of()},
    )
    res = fleet_versions(rep, "n1")
    assert res["status"] == "fail" and res["class"] == "configuration", res
    assert res["reason"].startswith(
        f"NCCL net plugin: /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so (sha256 {PLUGIN_B}) here; "
    )
    assert f"(sha256 {PLUGIN_A}) on n0, n2 (the majority)" in res["reason"], res["reason"]
    assert res["threshold"]["source"] and res["detail"]["differences"][0]["component"] == "nccl_net_plugin"
    assert fleet_versions(rep, "n0") is None and fleet_versions(rep, "n2") is None
    # The table: the component with a difference first, the others after it.
    rows = rep["fleet"]["versions"]["rows"]
    assert rows[0]["component"] == "nccl_net_plugin" and [d["host"] for d in rows[0]["differs"]] == ["n1"]
    # NCCL's difference, which fails, before the kernel's, which warns; then the rows without one.
    assert rows[1]["component"] == "kernel" and rows[0]["majority_n"] == 2 and not any(r["differs"] for r in rows[2:])
    assert res["reason"].endswith("; kernel: 6.8.0-59-generic here; 6.8.0-60-generic on n0, n2 (the majority)"), res[
        "reason"
    ]
    md = (tmp_path / "reports/r1/report.md").read_text()
    section = md.split("## Software and firmware", 1)[1]
    first = section.split("| --- | --- | --- | --- |\n", 1)[1].splitlines()[0]
    assert (
        first.startswith("| **NCCL net plugin** |")
        and f"n1: /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so (sha256 {PLUGIN_B})" in first
    ), first
    assert "| NVIDIA driver | 570.124.06 (3 of 3) |" in section
    html = (tmp_path / "reports/r1/report.html").read_text()
    assert "<h2>Software and firmware</h2>" in html and '<tr class="s-warn"><td>NCCL net plugin</td>' in html
    assert html.index("<td>NCCL net plugin</td>") < html.index("<td>NVIDIA driver</td>")
    junit = (tmp_path / "reports/r1/junit.xml").read_text()
    assert 'name="version.nccl_net_plugin" value="{&quot;path&quot;: &quot;/opt/hpcx' in junit


def test_a_node_with_another_driver_or_no_ofed_warns_and_the_nccl_run_keeps_it(tmp_path):
    rep = build(tmp_path, {"n0": versions_of(), "n1": versions_of(), "n2": versions_of(driver="565.57.01", ofed=None)})
    res = fleet_versions(rep, "n2")
    assert res["status"] == "warn" and res["value"] == 2, res
    assert "NVIDIA driver: 565.57.01 here; 570.124.06 on n0, n1 (the majority)" in res["reason"]
    assert [r["component"] for r in rep["fleet"]["versions"]["rows"][:2]] in (["driver", "ofed"], ["ofed", "driver"])
    assert "OFED: not found here; MLNX_OFED_LINUX-24.10-1.1.4.0 on n0, n1 (the majority)" in res["reason"]
    # rdma-core read on no node: the same everywhere, no difference.
    (rdma,) = [r for r in rep["fleet"]["versions"]["rows"] if r["component"] == "rdma_core"]
    assert rdma["majority"] == "not found" and not rdma["differs"] and rdma["not_read"]["n0"].startswith("no rdma-core")
    assert (
        versions.nccl_left_out({h: versions_of() for h in ("n0", "n1")} | {"n2": versions_of(driver="565.57.01")}) == {}
    )


def test_two_nodes_that_disagree_are_both_named(tmp_path):
    by_host = {"n0": versions_of(nccl="2.26.2"), "n1": versions_of(nccl="2.21.5")}
    rep = build(tmp_path, by_host)
    for host, other in (("n0", "2.21.5 on n1"), ("n1", "2.26.2 on n0")):
        res = fleet_versions(rep, host)
        assert res["status"] == "fail" and "NCCL (torch's): " in res["reason"], res
        assert f"{other} (no majority: the nodes do not agree)" in res["reason"], res["reason"]
    assert set(versions.nccl_left_out(by_host)) == {"n0", "n1"}


def test_an_older_document_is_compared_on_what_it_carries(tmp_path):
    old = {"engine": "0.1.0", "driver": "570.124.06", "kernel": "6.8.0-60-generic"}
    rep = build(tmp_path, {"n0": versions_of(), "n1": versions_of(), "n2": old})
    assert fleet_versions(rep, "n2") is None, fleet_versions(rep, "n2")
    (plugin,) = [r for r in rep["fleet"]["versions"]["rows"] if r["component"] == "nccl_net_plugin"]
    assert plugin["n"] == 2 and "n2" not in plugin["values"]


def test_a_fleet_upgraded_since_the_baseline_warns_against_it(tmp_path):
    hosts = ("n0", "n1", "n2")
    build(tmp_path, {h: versions_of() for h in hosts}, run_id="base")
    rep = build(tmp_path, {h: versions_of(torch="2.8.0+cu128") for h in hosts}, run_id="r2", baseline="base")
    res = fleet_versions(rep, "n1")
    assert res["status"] == "warn", res
    assert res["reason"] == "torch: 2.8.0+cu128 here; 2.7.0+cu128 on 3 of 3 node(s) of baseline run base", res["reason"]
    (torch,) = [r for r in rep["fleet"]["versions"]["rows"] if r["component"] == "torch"]
    assert torch["baseline"]["value"] == "2.7.0+cu128"
    assert rep["fleet"]["versions"]["rows"][0]["component"] == "torch"  # the difference first
    assert "2.7.0+cu128 (3 of 3)" in (tmp_path / "reports/r2/report.md").read_text()


def test_a_baseline_indexed_before_the_store_kept_versions_is_read_from_its_documents(tmp_path):
    """A store of schema 2 (no versions column) is migrated: the baseline's rows then hold no versions, and the
    table takes them from the baseline's documents instead."""
    from gpufleet.fleet.store import Store

    hosts = ("n0", "n1", "n2")
    build(tmp_path, {h: versions_of() for h in hosts}, run_id="base")
    with Store(tmp_path / "reports" / "gpufleet.db") as store:
        assert json.loads(store.documents("base")[0]["versions"])["torch"] == "2.7.0+cu128"
        with store.write() as c:
            c.execute("UPDATE documents SET versions = NULL")
    rep = build(tmp_path, {h: versions_of(torch="2.8.0+cu128") for h in hosts}, run_id="r2", baseline="base")
    (torch,) = [r for r in rep["fleet"]["versions"]["rows"] if r["component"] == "torch"]
    assert torch["baseline"]["value"] == "2.7.0+cu128", torch


def test_one_node_without_a_baseline_has_nothing_to_compare_with(tmp_path):
    rep = build(tmp_path, {"n0": versions_of()})
    assert fleet_versions(rep, "n0") is None
    assert "no baseline (no baseline run set" in (tmp_path / "reports/r1/report.md").read_text()


def test_gpufleet_versions_names_the_nodes_the_nccl_run_leaves_out(tmp_path):
    odd = {"path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "sha256": PLUGIN_B}
    docs = {
        h: dict(node_doc(h, i), versions=versions_of(**({"nccl_net_plugin": odd} if h == "n2" else {})))
        for i, h in enumerate(("n0", "n1", "n2"))
    }
    run_dir = write_run(tmp_path, "r1", docs)
    (run_dir / "hosts" / "n3.json").write_text("{")
    out = run_versions(run_dir, ["n0", "n1", "n2", "n3"])
    assert set(out["left_out"]) == {"n2"} and out["left_out"]["n2"]["ready"] is False
    assert PLUGIN_A in out["left_out"]["n2"]["why"] and PLUGIN_B in out["left_out"]["n2"]["why"]
    assert set(out["unreadable"]) == {"n3"}
    # The command line the playbook runs, on the controller.
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "versions", str(run_dir), "--json", "--hosts", "n0,n1,n2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["left_out"]) == {"n2"}
    text = subprocess.run(
        [sys.executable, "-m", "gpufleet", "versions", str(run_dir), "--hosts", "n0,n1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert text.returncode == 0 and "NVIDIA driver: 570.124.06" in text.stdout and "left out" not in text.stdout, (
        text.stdout
    )
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet", "versions", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert bad.returncode != 0 and "nope/hosts does not exist" in bad.stderr, bad.stderr


def test_a_replaced_node_alone_in_its_run_is_held_against_its_peers_documents(tmp_path):
    """`gpufleet fleet accept NEW --peers P1 P2`: the run has one document, so the peers' latest ones in the store
    make the majority; a new node with another net plugin is left out of the NCCL run, the peers never are."""
    odd = {"path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "sha256": PLUGIN_B}
    build(tmp_path, {h: versions_of() for h in ("n0", "n1", "n2")}, run_id="base")
    run_dir = write_run(
        tmp_path / "reports", "accept", {"n2": dict(node_doc("n2", 2), versions=versions_of(nccl_net_plugin=odd))}
    )
    assert run_versions(run_dir, ["n2"])["left_out"] == {}  # alone, nothing to differ from
    out = run_versions(run_dir, ["n2"], ["n0", "n1", "n9"])
    assert set(out["left_out"]) == {"n2"}
    assert PLUGIN_A in out["left_out"]["n2"]["why"] and PLUGIN_B in out["left_out"]["n2"]["why"]
    assert out["peers"] == ["n0", "n1"] and "no readable node document" in out["unreadable"]["n9"]
    # The command line the playbook runs, with the peers it joins.
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "versions", str(run_dir), "--json", "--hosts", "n2", "--peers", "n0,n1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert proc.returncode == 0 and set(json.loads(proc.stdout)["left_out"]) == {"n2"}, proc.stderr
    # With the plugin of its peers it joins.
    same = write_run(tmp_path / "reports", "accept2", {"n2": dict(node_doc("n2", 2), versions=versions_of())})
    assert run_versions(same, ["n2"], ["n0", "n1"])["left_out"] == {}


# ---------------------------------------------------------------- the node's readings


def _write(path: Path, content: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    path.chmod(mode)
    return path


@pytest.fixture()
def tree(tmp_path) -> Path:
    """A node's root: two HCAs, MLNX_OFED's ofed_info, rdma-core in dpkg's status, a net plugin in a folder of
    ld.so.conf and another beside it under its own name."""
    root = tmp_path / "root"
    for i, fw in enumerate(("28.42.1000", "28.39.2048")):
        _write(root / f"sys/class/infiniband/mlx5_{i}/fw_ver", fw + "\n")
        _write(root / f"sys/class/infiniband/mlx5_{i}/board_id", "MT_0000000838\n")
    _write(
        root / "usr/bin/ofed_info",
        '#!/bin/sh\n[ "$1" = -s ] && echo MLNX_OFED_LINUX-24.10-1.1.4.0: && exit 0\nexit 1\n',
        0o755,
    )
    _write(
        root / "var/lib/dpkg/status",
        "Package: rdma-core\nStatus: install ok installed\nVersion: 2404mlnx51-1.2404066\n\n"
        "Package: libibverbs1\nStatus: deinstall ok config-files\nVersion: 1.0\n",
    )
    _write(root / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    _write(root / "etc/ld.so.conf.d/hpcx.conf", "# HPC-X\n/opt/hpcx/nccl_rdma_sharp_plugin/lib\n")
    _write(root / "opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", b"plugin one")
    _write(root / "opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net-ofi.so", b"plugin two")
    _write(root / "usr/lib/x86_64-linux-gnu/libnccl.so.2.26.2", b"not a real library")
    return root


def test_software_readings_of_a_fake_tree(tree):
    out = software.read(str(tree), {"PATH": "/usr/bin"})
    assert [(h["hca"], h["fw_ver"], h["board_id"]) for h in out["hcas"]["hcas"]] == [
        ("mlx5_0", "28.42.1000", "MT_0000000838"),
        ("mlx5_1", "28.39.2048", "MT_0000000838"),
    ]
    assert out["ofed"]["version"] == "MLNX_OFED_LINUX-24.10-1.1.4.0", out["ofed"]
    assert out["rdma_core"]["version"] == "2404mlnx51-1.2404066" and "rdma-core" in out["rdma_core"]["source"]
    plugin = out["nccl_net_plugin"]
    assert plugin["setting"] is None and plugin["candidates"] == ["libnccl-net.so"]
    assert plugin["loads"] == {
        "path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "sha256": hashlib.sha256(b"plugin one").hexdigest(),
        "size_bytes": 10,
        "reason": None,
    }
    assert {f["path"] for f in plugin["found"]} == {
        "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net-ofi.so",
    }
    # A library that cannot be asked gives the version its file name carries.
    libs = {lib["path"]: lib["version"] for lib in out["nccl"]["libraries"]}
    if "x86_64" in os.uname().machine:
        assert libs == {"/usr/lib/x86_64-linux-gnu/libnccl.so.2.26.2": "2.26.2"}, out["nccl"]
    ver = schema.versions(
        {"nvml": {"available": False, "error": "no NVIDIA driver", "gpus": []}, "host": {}, "software": out}
    )
    assert ver["hca_fw"] == {"mlx5_0": "28.42.1000", "mlx5_1": "28.39.2048"} and ver["ofed"].startswith("MLNX_OFED")
    assert ver["nccl_net_plugin"]["sha256"] == hashlib.sha256(b"plugin one").hexdigest()
    assert ver["vbios"] is None and ver["not_read"]["vbios"] == "no NVIDIA driver"
    assert versions.value_text("hca_fw", ver["hca_fw"])[1] == "mlx5_0 28.42.1000, mlx5_1 28.39.2048"


def test_the_net_plugin_setting_picks_the_file_nccl_would_load(tree):
    by_suffix = software.read(str(tree), {"PATH": "/usr/bin", "NCCL_NET_PLUGIN": "ofi"})["nccl_net_plugin"]
    assert by_suffix["candidates"] == ["ofi", "libnccl-net-ofi.so"]
    assert by_suffix["loads"]["path"].endswith("/libnccl-net-ofi.so") and by_suffix["setting_source"] == "environment"
    # In /etc/nccl.conf, a path, and the library folder from LD_LIBRARY_PATH first.
    _write(tree / "etc/nccl.conf", "NCCL_NET_PLUGIN=/srv/plugins/libnccl-net.so\n")
    _write(tree / "srv/plugins/libnccl-net.so", b"plugin three")
    by_path = software.read(str(tree), {"PATH": "/usr/bin"})["nccl_net_plugin"]
    assert by_path["setting_source"] == "/etc/nccl.conf" and by_path["loads"]["path"] == "/srv/plugins/libnccl-net.so"
    (tree / "etc/nccl.conf").unlink()
    first = software.read(str(tree), {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/srv/plugins"})["nccl_net_plugin"]
    assert first["loads"]["sha256"] == hashlib.sha256(b"plugin three").hexdigest()
    off = software.read(str(tree), {"PATH": "/usr/bin", "NCCL_NET_PLUGIN": "none"})["nccl_net_plugin"]
    assert off["loads"] is None and "NCCL_NET_PLUGIN=none (environment)" in off["reason"]


def test_a_node_without_infiniband_ofed_or_nccl_says_why(tmp_path):
    out = software.read(str(tmp_path), {"PATH": "/nowhere"})
    assert out["hcas"]["present"] is False and out["hcas"]["reason"].endswith("sys/class/infiniband: not present")
    assert out["ofed"]["version"] is None and "ofed_info not found" in out["ofed"]["reason"]
    assert out["rdma_core"]["version"] is None and out["rdma_core"]["reason"]
    assert (
        out["nccl_net_plugin"]["loads"] is None and "NCCL uses its internal network" in out["nccl_net_plugin"]["reason"]
    )
    ver = schema.versions({"nvml": {}, "host": {}, "software": out})
    assert {k for k in ver["not_read"]} >= {"hca_fw", "hca_board_id", "ofed", "rdma_core", "nccl_net_plugin"}
    assert all(ver[k] is None for k in ver["not_read"])


@pytest.mark.slow
def test_gpufleet_hw_shows_the_software_of_the_tree(tree):
    # NVML from the H100 VM's recording, so that hw reads a GPU (exit 0) whether or not this machine has one.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "hw",
            "--root",
            str(tree),
            "--readings",
            str(REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src"), PATH="/usr/bin:/bin"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "OFED       MLNX_OFED_LINUX-24.10-1.1.4.0; rdma-core 2404mlnx51-1.2404066" in proc.stdout, proc.stdout
    sha = hashlib.sha256(b"plugin one").hexdigest()
    assert f"net plugin /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so (sha256 {sha})" in proc.stdout, proc.stdout
    assert "mlx5_1" in proc.stdout and "board MT_0000000838" in proc.stdout
