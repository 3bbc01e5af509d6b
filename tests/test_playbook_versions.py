"""A real validate.yml run over three test hosts of our own (tests/testhosts.py: sshd's in network namespaces,
routed to each other) where node-b's NCCL net plugin is another file than node-a's and node-c's: node-b is left
out of the NCCL run across nodes before it starts, saying why (the file and both hashes), node-a and node-c run
it together, and the report's software and firmware table names node-b's plugin first.

Each host's plugin is /opt/nccl-net/libnccl-net.so in its own root, found through LD_LIBRARY_PATH
(gpufleet_node_env), as NVIDIA's HPC-X plugins are. The benchmarks run on the CPU (gloo), which loads no plugin:
every node fails acceptance (no GPU), a logic check.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest

from testhosts import TestFleet, skip_reason
from test_fleet_playbook import REPO, doc, playbook

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

NODES = ["node-a", "node-b", "node-c"]
PLUGIN = "/opt/nccl-net/libnccl-net.so"
CONTENT = {"node-a": b"net plugin build 1\n", "node-b": b"net plugin build 2\n", "node-c": b"net plugin build 1\n"}


@pytest.fixture(scope="module")
def fleet():
    why = skip_reason()
    if why:
        pytest.skip(why)
    with TestFleet(NODES, net=241, tag="gfq") as hosts:
        yield hosts


def test_a_node_with_another_net_plugin_is_left_out_of_the_nccl_run_and_named(fleet, tmp_path):
    for name, content in CONTENT.items():
        path = fleet.root(name) / PLUGIN.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    good, odd = (hashlib.sha256(CONTENT[n]).hexdigest() for n in ("node-a", "node-b"))
    nodes = {
        n: {
            "gpufleet_node_env": dict(
                fleet.host_vars(n)["gpufleet_node_env"], PYTHONPATH=str(REPO / "src"), LD_LIBRARY_PATH="/opt/nccl-net"
            )
        }
        for n in NODES
    }
    inventory = fleet.inventory(
        tmp_path / "hosts.yml",
        host_vars=nodes,
        gpufleet_benchmarks=[],
        gpufleet_tier="acceptance",
        gpufleet_nccl_timeout_s=90,
    )
    reports, run_id = tmp_path / "reports", f"plugin-{uuid.uuid4().hex[:8]}"
    rc, out = playbook(fleet, inventory, reports, run_id)
    assert rc != 0 and "Fail when a node was not accepted" in out, out[-6000:]
    run = reports / run_id

    # Each node's document carries the plugin NCCL would load there.
    for name in NODES:
        plugin = doc(run / "hosts" / f"{name}.json")["versions"]["nccl_net_plugin"]
        assert plugin == {"path": PLUGIN, "sha256": odd if name == "node-b" else good}, (name, plugin)

    # node-b: left out before the run across nodes, naming the file and both hashes.
    (left,) = [r for r in doc(run / "hosts" / "node-b.json")["results"] if r["group"] == "benchmark_multinode"]
    assert left["check"] == "nccl" and left["status"] == "skip", left
    assert left["reason"].startswith(
        "left out of the NCCL run across nodes: its NCCL differs from the other nodes': "
        f"NCCL net plugin: {PLUGIN} (sha256 {odd}) here; {PLUGIN} (sha256 {good}) on node-a, "
        "node-c (the majority)"
    ), left["reason"]
    assert "the run covered node-a, node-c" in left["reason"], left["reason"]
    # node-a and node-c ran it together.
    for name in ("node-a", "node-c"):
        ran = [
            r
            for r in doc(run / "hosts" / f"{name}.json")["results"]
            if r["group"] == "benchmark_multinode" and r["check"] == "nccl_all_reduce"
        ]
        assert ran and ran[0]["detail"]["multinode"]["members"] == ["node-a", "node-c"], (name, ran)
        assert ran[0]["detail"]["multinode"]["left_out"]["node-b"].startswith("its NCCL differs"), ran[0]["detail"]

    # The report: node-b's fleet.versions fails with the same evidence; the table names its plugin first.
    rep = doc(run / "report.json")
    (res,) = [r for r in rep["nodes"]["node-b"]["results"] if r["group"] == "fleet" and r["check"] == "versions"]
    assert res["status"] == "fail" and odd in res["reason"] and good in res["reason"] and PLUGIN in res["reason"], res
    for name in ("node-a", "node-c"):
        assert not [r for r in rep["nodes"][name]["results"] if r["group"] == "fleet" and r["check"] == "versions"]
    first = rep["fleet"]["versions"]["rows"][0]
    assert first["component"] == "nccl_net_plugin" and [d["host"] for d in first["differs"]] == ["node-b"], first
    md = (run / "report.md").read_text()
    assert f"| **NCCL net plugin** | {PLUGIN} (sha256 {good}) (2 of 3) | node-b: {PLUGIN} (sha256 {odd}) |" in md
