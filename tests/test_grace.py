"""Grace Hopper nodes: a 4 x GH200 node built from the seed's topology and NVIDIA's published figures (no GH200 was
read: tests/data/readings/gh200-4gpu-built.json says so, value by value) replayed through every check group, the
benchmark judges and the PCIe links check, with the GH200 profile; one GPU's C2C or HBM figure halved fails naming
it. The node's platform (architecture, host link, CPU NUMA nodes) is read once and carried in the host document."""

from __future__ import annotations

import pytest
from grace_node import CPU_NODES, GPUS, built, gh200, node_readings, outputs

from gpufleet.base import profiles, schema
from gpufleet.benchmarks.host import host_judge, host_memory
from gpufleet.benchmarks.matmul import matmul_judge
from gpufleet.benchmarks.memory import memory_judge
from gpufleet.bench.link_watch import LinkWatch
from gpufleet.checks import pcie_links
from gpufleet.node import host_documents

# What the seed's site sets in its inventory: 4 superchips a node, each GPU's 18 NVLinks to the other three (NV6).
SITE = {"gpus_expected": 4, "nvlink_links_per_gpu": 18}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The node's host, built once: the tests change only their own copy of its readings."""
    return gh200(tmp_path_factory.mktemp("gh200"))


def judged(readings: dict, outs: dict, tree) -> list[dict]:
    """Every check group's results, the benchmark judges' on the outputs, and the PCIe links as the node's watch
    reads them from the tree."""
    doc = host_documents.check_host(readings, host="gh200-n0", overrides=SITE)
    profile = host_documents.node_profile(readings, None, SITE, None)
    watch = LinkWatch(root=str(tree.root))
    watch.sample()
    return [
        *doc["results"],
        *matmul_judge.matmul(outs["matmul"], profile),
        *memory_judge.memory(outs["memory"], profile),
        *host_judge.host(outs["host"], profile),
        pcie_links.pcie_links([watch.summary()], True, host_documents.c2c_gpus(readings)),
    ]


def test_the_built_readings_say_they_are_built():
    data = built()
    assert data["provenance"].startswith("BUILT, NOT RECORDED") and data["stand_ins"]
    assert all(f["source"] for f in data["figures"].values())


def test_a_gh200_node_replayed_through_every_check_is_clean(tree):
    readings = node_readings(tree)
    results = judged(readings, outputs(readings), tree)
    assert schema.verdict(results) == "pass", [(r["check"], r["status"], r["reason"]) for r in results]
    by = {r["check"]: r for r in results}
    assert {"gpu_count", "pcie_link", "numa_affinity", "hbm_bandwidth", "pcie_h2d_bandwidth", "pcie_links"} <= set(by)
    assert by["profile"]["reason"].startswith("profile gh200-96gb is uncalibrated")
    assert by["pcie_link"]["reason"] == (
        "NVLink-C2C to the CPU on 4 GPU(s): 10 links up at 45 GB/s each (no PCIe link to train down)"
    )
    assert by["pcie_h2d_bandwidth"]["reason"] == "slowest GPU host-to-device over NVLink-C2C 405 GB/s (minimum 315)"
    assert "C2C" in by["pcie_h2d_bandwidth"]["threshold"]["source"]
    # The GPUs' PCIe links are not judged (they have none to train down); the NICs' are.
    links = by["pcie_links"]
    assert links["status"] == "pass" and links["detail"]["on_c2c"] == list(GPUS)
    assert "4 NIC(s)" in links["reason"] and "4 GPU(s) reach their CPU over NVLink-C2C" in links["reason"]
    # 36 NUMA nodes, 4 with CPUs: each GPU on its CPU's node, its memory a node of its own.
    numa = by["numa_affinity"]
    assert numa["detail"]["numa_nodes"] == [0, 1, 2, 3] and len(numa["detail"]["memory_only_numa_nodes"]) == 32
    assert [(g["cpu_node"], g["memory_node"]) for g in numa["detail"]["gpus_by_node"]] == [
        (0, 4),
        (1, 12),
        (2, 20),
        (3, 28),
    ]
    assert "(of 4 with CPUs, 32 more of memory alone (GPU memory, no CPU))" in numa["reason"]


def test_a_c2c_gpus_pcie_attributes_are_not_judged(tree):
    """The tree's GPUs show a PCIe link below its maximum (what a C2C GPU's attributes say is not known here): judged
    as PCIe it would fail; as the C2C GPUs they are, it is left out, said, and the NICs are judged."""
    watch = LinkWatch(root=str(tree.root))
    watch.sample()
    as_pcie = pcie_links.pcie_links([watch.summary()], True)
    assert as_pcie["status"] == "fail" and as_pcie["value"] == 4 and "GPU 0009:01:00.0" in as_pcie["reason"]
    readings = node_readings(tree)
    as_c2c = pcie_links.pcie_links([watch.summary()], True, host_documents.c2c_gpus(readings))
    assert as_c2c["status"] == "pass" and "4 NIC(s), 0 GPU(s)" in as_c2c["reason"]


def test_the_host_document_carries_the_platform(tree):
    readings = node_readings(tree)
    doc = host_documents.check_host(readings, host="gh200-n0", overrides=SITE)
    assert doc["profile"]["name"] == "gh200-96gb"
    platform = doc["platform"]
    assert (platform["architecture"], platform["host_link"], platform["cpu_numa_nodes"]) == (
        "aarch64",
        "nvlink_c2c",
        [0, 1, 2, 3],
    )
    assert platform["gpus"][3] == {"index": 3, "host_link": "nvlink_c2c", "cpu_node": 3, "memory_node": 28}


@pytest.mark.parametrize(
    "halved, check, words",
    [
        ({"h2d_gbps": 2}, "pcie_h2d_bandwidth", "host-to-device over NVLink-C2C 202.5 GB/s is under the minimum 315"),
        ({"d2h_gbps": 1}, "pcie_d2h_bandwidth", "device-to-host over NVLink-C2C 202.5 GB/s is under the minimum 315"),
        ({"hbm_copy_gbps": 3}, "hbm_bandwidth", "HBM copy (read+write) 1800.0 GB/s is under the minimum 3300"),
    ],
)
def test_one_gpu_figure_halved_fails_naming_it(tree, halved, check, words):
    readings = node_readings(tree)
    (gpu,) = halved.values()
    results = {r["check"]: r for r in judged(readings, outputs(readings, halve=halved), tree)}
    res = results[check]
    assert res["status"] == "fail" and words in res["reason"], res["reason"]
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [gpu]
    assert res["detail"]["flagged_gpus"][0]["uuid"] == readings["nvml"]["gpus"][gpu]["uuid"]
    assert [r["check"] for r in results.values() if r["status"] in ("fail", "error", "warn")] == [check]


def test_one_gpu_c2c_links_at_half_speed_fail_naming_it(tree):
    readings = node_readings(tree, c2c_halved=1)
    results = {r["check"]: r for r in judged(readings, outputs(readings), tree)}
    res = results["pcie_link"]
    assert res["status"] == "fail"
    assert res["reason"] == "GPU 1: NVLink-C2C links at 22.5 GB/s, the node's others at 45 GB/s"
    assert [g["index"] for g in res["detail"]["flagged_gpus"]] == [1] and "nvidia-smi c2c -s" in res["remedy"]
    assert [r["check"] for r in results.values() if r["status"] in ("fail", "error", "warn")] == ["pcie_link"]


def test_a_c2c_link_down_fails_naming_gpu_and_link(tree):
    readings = node_readings(tree)
    readings["nvml"]["gpus"][2]["c2c"]["links"][7]["up"] = False
    res = {r["check"]: r for r in judged(readings, outputs(readings), tree)}["pcie_link"]
    assert res["status"] == "fail" and res["reason"] == "GPU 2: NVLink-C2C link(s) 7 down (9 of 10 up)"


@pytest.mark.parametrize(
    "name, profile",
    [
        ("NVIDIA GH200 120GB", "gh200-96gb"),
        ("NVIDIA GH200 480GB", "gh200-96gb"),
        ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", None),
    ],
)
def test_each_gh200_memory_variant_has_its_profile(name, profile):
    assert profiles.match(profiles.load_all(), name) == profile


def test_gh200_profiles_hold_nvidia_figures_and_say_uncalibrated():
    every = profiles.load_all()
    for name, hbm_min, peak in (("gh200-96gb", 3300, "4 TB/s"), ("gh200-144gb", 4050, "4.9 TB/s")):
        doc = every[name]
        assert "uncalibrated" in doc and doc["thresholds"]["hbm_copy_gbps_min"]["value"] == hbm_min
        assert peak in doc["thresholds"]["hbm_copy_gbps_min"]["source"]
        for key in ("pcie_h2d_gbps_min", "pcie_d2h_gbps_min"):
            assert (
                "NVLink-C2C" in doc["thresholds"][key]["source"]
                and "450 GB/s each way" in (doc["thresholds"]["pcie_h2d_gbps_min"]["source"])
            )
            assert doc["thresholds"][key]["value"] > 64  # held against C2C, far above what PCIe Gen5 x16 carries


def test_the_host_memory_triad_runs_on_cpu_nodes_only(tree):
    """benchmarks.host.host_memory reads the same tree: the 32 nodes of GPU memory have no CPU, so no thread is put there."""
    nodes = host_memory.numa_nodes(str(tree.root))
    assert nodes and set(nodes) <= set(range(CPU_NODES))


def test_a_slurm_allocation_is_said_beside_the_host_figures(tmp_path):
    """The seed's job given 72 of 288 CPUs (--cpus-per-task 72): the triad and the loader say so."""
    tree = gh200(tmp_path, slurm_cpus=72)
    readings = node_readings(tree)
    alloc = readings["host"]["cpu_allocation"]
    assert (alloc["online"], alloc["allowed"], alloc["share_pct"], alloc["cgroup"]["cpus"]) == (288, 72, 25.0, "0-71")
    profile = host_documents.node_profile(readings, None, SITE, None)
    res = {r["check"]: r for r in host_judge.host(outputs(readings)["host"], profile)}
    for check in ("host_memory_bandwidth", "data_loader"):
        assert res[check]["reason"].endswith(
            "; on 72 of 288 CPUs (Slurm job 53925, --cpus-per-task 72; cgroup cpuset 0-71)"
        )
        assert res[check]["detail"]["cpu_allocation"]["slurm"]["SLURM_CPUS_PER_TASK"] == "72"


def test_the_iommu_remedy_names_the_architectures_boot_option(tree):
    """iommu=pt is an x86 boot option; a Grace node's kernel takes iommu.passthrough=1."""
    readings = node_readings(tree)
    readings["host"]["iommu"].update(
        groups_present=True, gpu_groups=[{"bdf": GPUS[0], "group": 7, "type": "DMA", "mode": "translated"}]
    )
    res = {r["check"]: r for r in host_documents.check_host(readings, ["host_hygiene"], overrides=SITE)["results"]}
    assert res["iommu"]["status"] == "warn" and res["iommu"]["remedy"].startswith("boot with iommu.passthrough=1 ")
