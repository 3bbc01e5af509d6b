"""The fleet layer's judgement (gpufleet.fleet.compare) on synthetic fleets built from recorded GPUs.

Two runs through report.build() with a store: r1 (the baseline; node n4 fails on one GPU's ECC), then r2 with
a slow GPU, a slow node, a flapping counter, a disturbed GPU and n4's failed GPU moved into another node, each
node's figures measured twice on the node against the references the run handed it (measured_twice). The report
must name each of them, where they are, and nothing else; what only this run's fleet shows is inconclusive.
"""

from __future__ import annotations

import json

import pytest

from gpufleet import report
from gpufleet.report import formatting
from gpufleet.base.errors import InputError
from gpufleet.fleet import compare, counter_growth, short_uuid
from gpufleet.comparisons import metrics, peers, robust, thresholds
from gpufleet.fleet.store import Store
from gpufleet.base.judge import Limit

from test_fleet_synthetic import ecc_failure, gpus_of, h200_node, h200_two_nodes, measured_twice, node_doc, write_run

R1 = ("2026-11-20T10:00:00Z", "2026-11-20T10:15:00Z")
R2 = ("2026-11-21T10:00:00Z", "2026-11-21T10:15:00Z")


def _not_passing(rep: dict) -> set[tuple[str, str]]:
    return {
        (h, formatting.check_id(r))
        for h, n in rep["nodes"].items()
        for r in n["results"]
        if r["status"] in ("warn", "fail", "error")
    }


def _fleet(rep: dict, host: str, check: str) -> dict:
    return next(r for r in rep["nodes"][host]["results"] if r["group"] == "fleet" and r["check"] == check)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    n4_gpus = gpus_of(4)
    moved = n4_gpus[2]
    r1 = {f"n{i}": node_doc(f"n{i}", i, read_at=R1, started=R1[0]) for i in range(4)}
    r1["n3"] = node_doc("n3", 3, read_at=R1, started=R1[0], after={4: {"nvlink_crc_data": 300}})
    r1["n4"] = node_doc("n4", 4, gpus=n4_gpus, read_at=R1, started=R1[0], extra=[ecc_failure(moved)])
    report.build(write_run(reports, "r1", r1))
    with Store(reports / "gpufleet.db") as store:
        store.set_baseline("r1")

    n1_gpus = gpus_of(1)
    n1_gpus[6] = dict(moved, index=6, pci_bus_id=n1_gpus[6]["pci_bus_id"])  # n4's GPU 2, now in n1's slot 6
    r2 = {
        "n0": node_doc(
            "n0", 0, read_at=R2, started=R2[0], spreads={("hbm_copy_gbps", 2): 57.0}
        ),  # disturbed while measured
        "n1": node_doc("n1", 1, gpus=n1_gpus, read_at=R2, started=R2[0], factors={("matmul_bf16_tflops", 3): 0.91}),
        "n2": node_doc("n2", 2, read_at=R2, started=R2[0], factors={("hbm_copy_gbps", i): 0.92 for i in range(8)}),
        "n3": node_doc(
            "n3",
            3,
            read_at=R2,
            started=R2[0],
            before={5: {"nvlink_replay": 12}, 4: {"nvlink_crc_data": 10}},  # GPU 4's counter was reset since r1
            after={5: {"nvlink_replay": 12, "nvlink_crc_data": 5000}, 4: {"nvlink_crc_data": 10}},
        ),
        "n5": node_doc("n5", 5, read_at=R2, started=R2[0]),  # a new node, not in the baseline
    }
    r2_dir = write_run(reports, "r2", r2)
    measured_twice(r2_dir, r2)
    summary = report.build(r2_dir)
    rep = json.loads((reports / "r2" / "report.json").read_text())
    rep1 = json.loads((reports / "r1" / "report.json").read_text())
    return {"reports": reports, "r1": rep1, "r2": rep, "summary": summary, "moved": moved, "n1_gpus": n1_gpus}


def test_the_report_names_each_injected_fault_and_nothing_else(two_runs):
    assert _not_passing(two_runs["r2"]) == {
        ("n1", "fleet.gpu_vs_node"),
        ("n1", "fleet.node_vs_baseline"),
        ("n1", "fleet.node_vs_baseline_fleet"),
        ("n1", "fleet.returning_gpu"),
        ("n2", "fleet.node_vs_baseline"),
        ("n2", "fleet.node_vs_baseline_fleet"),
        ("n3", "fleet.counters_since_previous_run"),
    }
    # What only this run's fleet shows was measured once by each node: inconclusive, information, no verdict.
    inconclusive = {
        (h, formatting.check_id(r))
        for h, n in two_runs["r2"]["nodes"].items()
        for r in n["results"]
        if r.get("trust") == "inconclusive"
    }
    assert inconclusive == {("n0", "fleet.sample_spread"), ("n1", "fleet.node_vs_fleet"), ("n2", "fleet.node_vs_fleet")}
    assert {h: n["verdict"] for h, n in two_runs["r2"]["nodes"].items()} == {
        "n0": "pass",
        "n1": "warn",
        "n2": "warn",
        "n3": "warn",
        "n5": "pass",
    }


def test_slow_gpu_named_with_its_numbers_side_by_side(two_runs):
    res = _fleet(two_runs["r2"], "n1", "gpu_vs_node")
    gpu3 = two_runs["n1_gpus"][3]
    assert res["status"] == "warn"
    assert res["reason"].startswith(f"GPU 3 ({short_uuid(gpu3['uuid'])}, serial {gpu3['serial']}) bf16 matmul ")
    assert (
        "below the node median" in res["reason"]
        and "(threshold 5%, generic: this model is not calibrated)" in res["reason"]
        and "robust z" in res["reason"]
    )
    assert ";" not in res["reason"]  # one finding: only GPU 3, only bf16
    assert res["detail"]["flagged_gpus"] == [{"index": 3, "uuid": gpu3["uuid"], "serial": gpu3["serial"]}]
    bad = [c for c in res["detail"]["comparisons"] if c["status"] != "pass"]
    assert len(bad) == 1 and 7.5 < -bad[0]["deviation_pct"] < 10 and bad[0]["robust_z"] < -3
    base = _fleet(two_runs["r2"], "n1", "node_vs_baseline")
    assert (
        f"GPU 3 ({short_uuid(gpu3['uuid'])}" in base["reason"]
        and "baseline run r1's figure for this GPU" in base["reason"]
    )


def test_slow_node_named_against_fleet_and_baseline(two_runs):
    res = _fleet(two_runs["r2"], "n2", "node_vs_fleet")
    # Only this run's fleet shows it, which the node did not see while it measured: inconclusive, information.
    assert res["status"] == "info" and res["trust"] == "inconclusive" and res["remedy"]
    assert (
        res["reason"].startswith("inconclusive: node n2 HBM copy ")
        and "below the fleet median of 5 nodes" in res["reason"]
    )
    assert "only this run's other nodes show it" in res["reason"]
    assert "matmul" not in res["reason"]
    assert _fleet(two_runs["r2"], "n2", "gpu_vs_node")["status"] == "pass"  # every GPU of it equally slow
    fleet_base = _fleet(two_runs["r2"], "n2", "node_vs_baseline_fleet")
    # Over every node of the baseline run that has the figure: n4 failed on ECC, its HBM figure is a figure all the same.
    assert "baseline run r1's fleet median of 5 node(s)" in fleet_base["reason"]


def test_counters_during_the_run_as_rates_and_replays_since_the_previous(two_runs):
    # GPU 5's NVLink CRC data errors grew to 5,000 in the 15 min run, 5.56 a second: under DCGM's 100 a second, so
    # information with the rate, changing no verdict.
    during = _fleet(two_runs["r2"], "n3", "counters_during_run")
    gpu5 = gpus_of(3)[5]
    assert during["status"] == "info" and during["class"] is None and during["remedy"] is None
    assert "NVLink CRC data errors grew in 15 min: GPU 5 5.56 a second" in during["reason"]
    assert (
        "limit 100 a second a GPU, its links together (DCGM, fleet_counter_nvlink_crc_per_s_fail)" in during["reason"]
    )
    crc = during["detail"]["per_gpu"][5]["counters"]["nvlink_crc_data"]
    assert crc["rated"]["rate"] == pytest.approx(crc["growth"] / 900, rel=1e-3) and crc["status"] == "info"
    assert "flagged_gpus" not in during["detail"] or during["detail"]["flagged_gpus"] == []
    # Its 12 NVLink replays since r1 happened outside a run gpufleet watched: they warn (during a run they fail).
    since = _fleet(two_runs["r2"], "n3", "counters_since_previous_run")
    assert since["status"] == "warn" and since["class"] == "hardware"
    assert "since run r1 (node n3" in since["reason"] and "NVLink replays grew by 12" in since["reason"]
    assert "nvidia-smi nvlink -e" in since["remedy"]
    # GPU 4's counter was reset since r1 (300, now 10): counted from the reset, a rate as information, no warning.
    assert "GPU 4 0.000117 a second" in since["reason"] and "GPU 4 (" not in since["reason"]
    gpu4 = next(g for g in since["detail"]["per_gpu"] if g["index"] == 4)
    assert "went down from 300 to 10" in " ".join(gpu4["counters"]["nvlink_crc_data"]["notes"])
    assert since["detail"]["flagged_gpus"] == [{"index": 5, "uuid": gpu5["uuid"], "serial": gpu5["serial"]}]


def test_counters_that_did_not_move_pass_naming_the_run(two_runs):
    res = _fleet(two_runs["r2"], "n0", "counters_since_previous_run")
    assert res["status"] == "pass" and res["reason"].startswith("no counter moved on 8 GPU(s) since run r1 (node n0")
    assert "accepted" in res["reason"]


def test_gpu_moved_from_a_failed_node_is_recognised(two_runs):
    moved = two_runs["moved"]
    res = _fleet(two_runs["r2"], "n1", "returning_gpu")
    assert res["status"] == "warn"
    assert (
        f"run r1 ({R1[0]}) in node n4 as GPU 2, gpu_health.ecc fail (hardware); now in node n1 as GPU 6"
        in res["reason"]
    )
    assert res["detail"]["flagged_gpus"] == [{"index": 6, "uuid": moved["uuid"], "serial": moved["serial"]}]
    assert all(_fleet(two_runs["r2"], h, "returning_gpu")["status"] == "pass" for h in ("n0", "n2", "n3", "n5"))


def test_disturbed_gpu_flagged_by_its_sample_spread(two_runs):
    res = _fleet(two_runs["r2"], "n0", "sample_spread")
    assert (
        res["status"] == "info"
        and res["trust"] == "inconclusive"
        and res["reason"].startswith("GPU 2 (")
        and "HBM copy samples spread 57.0%" in res["reason"]
    )
    assert "times its siblings' median spread 2.0%" in res["reason"] and res["reason"].count("GPU ") == 1


def test_baseline_comparisons_and_a_new_node(two_runs):
    assert _fleet(two_runs["r2"], "n5", "node_vs_baseline")["status"] == "skip"
    assert "not in baseline run r1" in _fleet(two_runs["r2"], "n5", "node_vs_baseline")["reason"]
    assert _fleet(two_runs["r2"], "n5", "node_vs_baseline_fleet")["status"] == "pass"
    assert two_runs["summary"]["baseline"] == "r1"
    # The baseline itself is compared with nothing; a fleet of 5 nodes is.
    assert _fleet(two_runs["r1"], "n0", "node_vs_baseline")["status"] == "skip"
    assert _fleet(two_runs["r1"], "n0", "node_vs_fleet")["status"] == "pass"


def test_first_run_has_nothing_to_compare_counters_with(two_runs):
    res = _fleet(two_runs["r1"], "n0", "counters_since_previous_run")
    assert res["status"] == "skip" and "first run with counter snapshots" in res["reason"]
    assert two_runs["r1"]["nodes"]["n4"]["verdict"] == "fail"
    assert two_runs["r1"]["fleet"]["drain"] == [
        'scontrol update NodeName=n4 State=DRAIN Reason="gpufleet hw ecc; run r1"'
    ]


def test_fleet_view_shows_each_node_against_fleet_and_baseline(two_runs):
    view = {r["host"]: r["columns"] for r in two_runs["r2"]["fleet"]["view"]}
    assert view["n2"]["hbm"]["status"] == "warn" and view["n2"]["hbm"]["vs_baseline_pct"] == pytest.approx(-8, abs=0.1)
    assert view["n1"]["matmul"]["status"] == "warn" and view["n1"]["matmul"]["gpu_outliers"][0]["index"] == 3
    assert view["n0"]["hbm"]["status"] == "pass" and view["n5"]["matmul"]["baseline"] is None
    md = (two_runs["reports"] / "r2" / "report.md").read_text()
    assert "## Fleet" in md and "| n2 | " in md and "**WARN** " in md and "Every node accepted: none to drain." in md
    html = (two_runs["reports"] / "r2" / "report.html").read_text()
    assert "<h2>Fleet</h2>" in html and 'class="bar s-warn"' in html and "<script" not in html


# ---------------------------------------------------------------- thresholds at their edges


@pytest.mark.parametrize(
    "value,status", [(95.0, "pass"), (94.99, "warn"), (85.0, "warn"), (84.99, "fail"), (120.0, "pass")]
)
def test_judge_edges(value, status):
    assert robust.judge(value, 100.0, Limit("fleet_gpu_below_node_warn_pct", 5, fail=15))[0] == status


@pytest.mark.parametrize("factor,status", [(0.95, "pass"), (0.9499, "warn")])
def test_gpu_exactly_at_five_percent_passes(factor, status):
    doc = node_doc("n0", 0, gpus=gpus_of(0, 3))
    per = next(r for r in doc["results"] if r["check"] == "matmul_bf16")["detail"]["per_gpu"]
    for cuda, fig in per.items():
        fig["bf16"] = 804.2
    per["1"]["bf16"] = 804.2 * factor
    found = metrics.extract(doc)
    res = peers.gpu_vs_node("n0", found, thresholds.Thresholds(thresholds.thresholds_for(doc["profile"])))
    assert res["status"] == status
    if status == "warn":
        assert "is 5.01% below the node median 804.2" in res["reason"] or "is 5.0" in res["reason"]


def test_two_gpus_are_held_against_each_other_the_slower_named():
    """The recorded 2 x H200 node: GPU 1's bf16 is 5.2% under GPU 0's, GPU 0's fp16 6.1% under GPU 1's."""
    found = metrics.extract(h200_node()["results"])
    res = peers.gpu_vs_node("localhost", found, thresholds.Thresholds(thresholds.thresholds_for("h200-sxm")))
    assert res["status"] == "warn"
    assert (
        "GPU 1 (GPU-755c8ad9…, serial 1653724049352) bf16 matmul 791.6 TFLOPS is 5.2% below its only sibling GPU 0 at 834.6"
        in res["reason"]
    )
    assert "GPU 0 (GPU-df63b106…, serial 1653724058331) fp16 matmul 738.1 TFLOPS is 6.1% below" in res["reason"]
    assert "HBM" not in res["reason"] and "PCIe" not in res["reason"]


def test_fleet_median_needs_three_nodes():
    nodes = {h: {"results": n["results"], "profile": "h200-sxm"} for h, n in h200_two_nodes().items()}
    out = compare.evaluate("two", nodes)
    res = next(r for r in out["results"]["node0"] if r["check"] == "node_vs_fleet")
    assert res["status"] == "skip" and "with two, the median cannot tell which one is off" in res["reason"]
    base = next(r for r in out["results"]["node0"] if r["check"] == "node_vs_baseline")
    assert base["status"] == "skip" and "no store" in base["reason"]


@pytest.mark.parametrize(
    "growth,minutes,status", [(10, 15, "pass"), (11, 15, "warn"), (20, 120, "pass"), (21, 120, "warn")]
)
def test_per_hour_counter_edges(growth, minutes, status):
    """Corrected ECC errors: 10 an hour (DCGM's SBE rate); a window under the 1-hour minimum by count."""
    gpus = gpus_of(0, 2)
    after_at = f"2026-11-21T{10 + minutes // 60:02d}:{minutes % 60:02d}:00Z"
    doc = node_doc(
        "n0",
        0,
        gpus=gpus,
        read_at=("2026-11-21T10:00:00Z", after_at),
        before={0: {"ecc_corrected_volatile": 100}},
        after={0: {"ecc_corrected_volatile": 100 + growth}},
    )
    found = metrics.extract(doc)
    res = counter_growth.counters_during_run(
        "n0", found, thresholds.Thresholds(thresholds.thresholds_for(doc["profile"]))
    )
    assert res["status"] == status
    entry = res["detail"]["per_gpu"][0]["counters"]["ecc_corrected"]
    assert entry["judged_by"].startswith("count" if minutes < 60 else "rate")


def test_uncorrected_ecc_growth_fails_and_a_reboot_is_said():
    gpus = gpus_of(0, 2)
    doc = node_doc(
        "n0",
        0,
        gpus=gpus,
        read_at=("2026-11-21T10:00:00Z", "2026-11-21T10:20:00Z"),
        before={1: {"ecc_uncorrected_aggregate": 3, "nvlink_crc_data": 500}},
        after={1: {"ecc_uncorrected_aggregate": 4, "nvlink_crc_data": 20}},
    )
    doc["results"][-1]["detail"]["boot_id"] = "boot-2"  # the after snapshot: another boot
    found = metrics.extract(doc)
    res = counter_growth.counters_during_run(
        "n0", found, thresholds.Thresholds(thresholds.thresholds_for(doc["profile"]))
    )
    assert (
        res["status"] == "fail" and "GPU 1 (" in res["reason"] and "uncorrected ECC errors grew by 1" in res["reason"]
    )
    assert "rebooted between the snapshots" in res["reason"]
    assert res["detail"]["per_gpu"][1]["counters"]["nvlink_crc_data"]["growth"] == 20  # counted since the reboot


def test_no_snapshot_skips_saying_why():
    found = metrics.extract(node_doc("n0", 0))
    thr = thresholds.Thresholds(thresholds.thresholds_for("h100-sxm"))
    res = counter_growth.counters_during_run("n0", found, thr)
    assert res["status"] == "skip" and "no counter snapshots" in res["reason"]
    res = counter_growth.counters_since_previous_run("n0", "r", found, None, "no store: test", thr)
    assert res["status"] == "skip"


@pytest.mark.parametrize("spread,status", [(10.0, "pass"), (10.5, "warn")])
def test_spread_floor_edge(spread, status):
    # Siblings at 2%: 10% is 5 times theirs but not over the 10% floor; 10.5% is over both.
    doc = node_doc(
        "n0",
        0,
        gpus=gpus_of(0, 4),
        spreads={("hbm_copy_gbps", i): 2.0 for i in range(4)} | {("hbm_copy_gbps", 1): spread},
    )
    for res in doc["results"]:  # exact spread_pct, as the node writes it
        if res["check"] == "hbm_bandwidth":
            res["detail"]["per_gpu"]["hbm"]["1"]["samples_gbps"]["spread_pct"] = spread
    found = metrics.extract(doc)
    assert (
        peers.sample_spread("n0", found, thresholds.Thresholds(thresholds.thresholds_for("h100-sxm")))["status"]
        == status
    )


def test_cpu_run_compares_but_claims_nothing():
    docs = {
        f"n{i}": node_doc(
            f"n{i}", i, cpu=True, factors={("hbm_copy_gbps", g): 0.9 for g in range(8)} if i == 2 else None
        )
        for i in range(3)
    }
    out = compare.evaluate("cpu", {h: {"results": d["results"], "profile": d["profile"]} for h, d in docs.items()})
    res = next(r for r in out["results"]["n2"] if r["check"] == "node_vs_fleet")
    assert res["status"] == "skip" and res["reason"].startswith(
        "CPU run: logic check only, not a performance figure: node n2 HBM copy"
    )
    assert res["detail"]["would_be"] == "warn"
    assert all(r["status"] != "warn" for rs in out["results"].values() for r in rs)


# ---------------------------------------------------------------- which GPU a CUDA device is


def test_cuda_index_maps_by_uuid_else_position():
    found = metrics.extract(h200_node()["results"])  # recorded before benchmarks named their GPUs
    gpu1 = [m for m in found["metrics"] if m["scope"] == "gpu" and m["cuda_index"] == "1"]
    assert {m["mapped_by"] for m in gpu1} == {"position"} and {m["uuid"] for m in gpu1} == {
        "GPU-755c8ad9-4858-d710-94b4-5641916ac523"
    }
    found = metrics.extract(node_doc("n0", 0))
    assert {m["mapped_by"] for m in found["metrics"] if m["scope"] == "gpu"} == {"uuid"}


def test_position_follows_the_visible_gpus():
    """Half a machine as a node (CUDA_VISIBLE_DEVICES=1): CUDA device 0 is NVML GPU 1."""
    gpus = gpus_of(0, 2)
    doc = node_doc("n0", 0, gpus=gpus, with_uuid=False, read_at=("2026-11-21T10:00:00Z", "2026-11-21T10:10:00Z"))
    for res in doc["results"]:
        if res["group"] == "counters":
            for g in res["detail"]["gpus"]:
                g["visible"] = g["index"] == 1
        if res["check"] == "matmul_bf16":
            res["detail"]["per_gpu"] = {"0": res["detail"]["per_gpu"]["0"]}
    found = metrics.extract(doc)
    mm = [m for m in found["metrics"] if m["key"] == "matmul_bf16_tflops" and m["scope"] == "gpu"]
    assert [(m["cuda_index"], m["index"], m["uuid"]) for m in mm] == [("0", 1, gpus[1]["uuid"])]


def test_nccl_bands_and_shared_multinode_figures():
    found = metrics.extract(h200_two_nodes()["node0"]["results"])
    keys = {m["key"]: m for m in found["metrics"]}
    assert keys["nccl_multinode_all_reduce_busbw_gbps_gt_64MiB"]["value"] == 343.9
    assert keys["nccl_multinode_all_reduce_busbw_gbps_le_1MiB"]["size_bytes"] == 1 << 20
    assert keys["nccl_multinode_all_reduce_busbw_gbps_le_64MiB"]["size_bytes"] == 64 << 20
    assert keys["nccl_multinode_all_reduce_busbw_gbps_gt_64MiB"]["shared"] is True
    assert (
        keys["train_gpt2_node_tokens_per_s_per_gpu"]["value"] == 526504
        and not keys["train_gpt2_node_tokens_per_s_per_gpu"]["shared"]
    )


def test_explicit_baseline_must_be_in_the_store(tmp_path):
    run = write_run(tmp_path, "r9", {"n0": node_doc("n0", 0)})
    with pytest.raises(InputError, match="--baseline 'nope': no such run in the store"):
        report.build(run, baseline="nope")
    summary = report.build(run, use_store=False)
    assert summary["store"] is None and "no store" in summary["store_note"]
    fleet_checks = json.loads((run / "fleet.json").read_text())["nodes"]["n0"]["fleet_checks"]
    assert fleet_checks and set(fleet_checks.values()) <= {"pass", "skip"}


def test_a_node_profile_from_its_own_profile_dir_is_the_one_the_controller_judges_by(tmp_path, monkeypatch):
    """The node ran with --profile-dir: its own generic.yml (2% between the GPUs of a node, not 5%) and a profile
    the controller does not have. The controller judges by the profile the node's document carries, without
    reading profile files of its own (here it has none)."""
    import yaml

    from gpufleet.node import host_documents
    from gpufleet.base import profiles
    from test_fleet_synthetic import h100_readings

    node_dir = tmp_path / "node-profiles"
    node_dir.mkdir()
    generic = yaml.safe_load((profiles.default_profile_dir() / "generic.yml").read_text())
    generic["thresholds"][thresholds.GPU_WARN].update(value=2, source="site: GPUs of a node within 2%")
    (node_dir / "generic.yml").write_text(yaml.safe_dump(generic))
    (node_dir / "site-gpu.yml").write_text(yaml.safe_dump({"name": "site-gpu", "match": [], "thresholds": {}}))
    carried = host_documents.check_host(
        h100_readings(), ["gpu_inventory"], host="n0", profile_name="site-gpu", profile_dir=node_dir
    )["profile"]
    assert carried["name"] == "site-gpu" and carried["path"] == str(node_dir / "site-gpu.yml")

    doc = node_doc("n0", 0, gpus=gpus_of(0, 3))
    doc["profile"] = carried
    per = next(r for r in doc["results"] if r["check"] == "matmul_bf16")["detail"]["per_gpu"]
    for fig in per.values():
        fig["bf16"] = 800.0
    per["1"]["bf16"] = 800.0 * 0.97  # 3% below its siblings: within 5%, not within 2%
    monkeypatch.setenv("GPUFLEET_PROFILE_DIR", str(tmp_path / "no-profiles-here"))
    thresholds._profile_thresholds.cache_clear()
    try:
        res = peers.gpu_vs_node(
            "n0", metrics.extract(doc), thresholds.Thresholds(thresholds.thresholds_for(doc["profile"]))
        )
    finally:
        thresholds._profile_thresholds.cache_clear()
    assert res["status"] == "warn", res
    assert res["threshold"]["value"] == 2 and res["threshold"]["source"] == "site: GPUs of a node within 2%"


def test_a_document_from_before_a_key_gets_generic_defaults_which_no_model_profile_changes():
    from gpufleet.base import profiles

    table = thresholds.thresholds_for({"name": "h100-sxm", "thresholds": {}})
    generic = profiles.resolve(None, profile_name=profiles.GENERIC)["thresholds"]
    assert {k: table[k] for k in compare.KEYS_READ} == {k: generic[k] for k in compare.KEYS_READ}
    for name, prof in profiles.load_all().items():
        if name != profiles.GENERIC:
            assert not set(compare.KEYS_READ) & set(prof["thresholds"]), name
