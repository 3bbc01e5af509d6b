"""Limits from measurement, judged through the real judges: recorded calibration samples, healthy and disturbed,
replayed through checks.benchmarks, measure.watched and the fleet layer; the calibration table built by
tools/calibration_table.py from node-runs in the harness's format (tests/calibration_runs.py: the recorded H100
document with the figures issue 28 reports)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import calibration_runs as cr
import tool_modules
from gpufleet.base import calibration, judge, profiles, schema
from gpufleet import report
from gpufleet.benchmarks.memory import memory_judge
from gpufleet.benchmarks import replay
from gpufleet.node.measure import foreign_processes, watched
from gpufleet.fleet import compare
from test_fleet_synthetic import measured_twice

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = tool_modules.TOOLS / "calibration_table.py"


@pytest.fixture
def profile_dir(tmp_path) -> Path:
    """The shipped profiles, in a folder of the test's own, without any calibration."""
    d = tmp_path / "profiles"
    d.mkdir()
    for f in (ROOT / "files" / "profiles").glob("*.yml"):
        shutil.copy(f, d)
    return d


def small_calibration(profile_dir: Path) -> Path:
    path = profile_dir / "calibration" / "h100-sxm.yml"
    path.parent.mkdir()
    path.write_text(
        yaml.safe_dump(
            {
                "format": calibration.FORMAT,
                "profile": "h100-sxm",
                "gpu_models": [cr.MODEL],
                "table": "docs/results/calibration/table.md",
                "measures": {
                    "sample_drop_pct": {
                        "pcie_d2h_gbps": {"value": 14.4, "n": 40, "source": "runs.jsonl rounds r000..r007"},
                        "hbm_copy_gbps": {"value": 1.3, "n": 8, "source": "too few"},
                    },
                    "gpu_vs_node_pct": {
                        "matmul_bf16_tflops": {"value": 6.3, "n": 32, "source": "runs.jsonl rounds r000..r007"}
                    },
                    "node_vs_past_pct": {
                        "nccl_node_all_to_all_busbw_gbps_le_64MiB": {"value": 7.62, "n": 9, "source": "few, wide"},
                        "nccl_node_all_reduce_busbw_gbps_le_64MiB": {"value": 0.19, "n": 9, "source": "few, narrow"},
                    },
                },
            }
        )
    )
    return path


# ---------------------------------------------------------------- limits from a calibration file


def test_limits_come_from_a_calibration_file_and_their_source_names_it(profile_dir):
    path = small_calibration(profile_dir)
    prof = profiles.resolve(cr.MODEL, profile_dir=profile_dir)
    assert prof["calibration"]["calibrated"] is True and prof["calibration"]["path"] == str(path)
    drop = calibration.entry(prof["thresholds"], "sample_drop_pct_max", "pcie_d2h_gbps")
    # 14.4% measured, x1.5 + 1, rounded up to half a percent.
    assert drop["value"] == calibration.limit_from(14.4) == 23.0 and drop["calibrated"] is True
    assert "calibration h100-sxm: healthy sample_drop_pct up to 14.4% over 40 figure(s)" in drop["source"]
    assert "runs.jsonl rounds r000..r007" in drop["source"] and "docs/results/calibration/table.md" in drop["source"]
    # Too few figures that would narrow the generic limit set nothing: it stands, and says it is not calibrated.
    hbm = calibration.entry(prof["thresholds"], "sample_drop_pct_max", "hbm_copy_gbps")
    assert hbm["value"] == 20 and hbm["calibrated"] is False
    # Too few figures never narrow a generic limit, but where they show it too tight they widen it, and say so.
    wide = calibration.entry(
        prof["thresholds"], "fleet_below_baseline_warn_pct", "nccl_node_all_to_all_busbw_gbps_le_64MiB"
    )
    assert wide["value"] == calibration.limit_from(7.62) == 12.5 and wide["calibrated"] is True
    assert "over 9 figure(s)" in wide["source"] and "widens the generic 5%, never narrows it" in wide["source"]
    narrow = calibration.entry(
        prof["thresholds"], "fleet_below_baseline_warn_pct", "nccl_node_all_reduce_busbw_gbps_le_64MiB"
    )
    assert narrow["value"] == 5 and narrow["calibrated"] is False
    # The GPU's fail level is lifted to at least its calibrated warn level.
    assert calibration.entry(prof["thresholds"], "fleet_gpu_below_node_warn_pct", "matmul_bf16_tflops")["value"] == 10.5
    # An inventory override wins over the calibration, for every metric.
    forced = profiles.resolve(cr.MODEL, profile_dir=profile_dir, overrides={"sample_drop_pct_max": 30})
    assert calibration.entry(forced["thresholds"], "sample_drop_pct_max", "pcie_d2h_gbps") == {
        "key": "sample_drop_pct_max",
        "value": 30,
        "source": "inventory override (gpufleet_thresholds)",
        "calibrated": None,
        "metric": "pcie_d2h_gbps",
    }
    # A model with no calibration keeps the generic limits, and the profile says so.
    h200 = profiles.resolve("NVIDIA H200", profile_dir=profile_dir)
    assert (
        h200["calibration"]["calibrated"] is False
        and "no calibration for profile h200-sxm" in h200["calibration"]["note"]
    )
    assert h200["thresholds"]["fleet_gpu_below_node_warn_pct"]["calibrated"] is False


def test_a_calibration_file_that_is_wrong_is_refused_by_name(profile_dir):
    path = small_calibration(profile_dir)
    path.write_text(
        yaml.safe_dump({"format": calibration.FORMAT, "measures": {"sample_drop_pct": {"pcie_d2h_gbps": {"n": 3}}}})
    )
    with pytest.raises(
        calibration.CalibrationError, match=r"h100-sxm.yml: measures.sample_drop_pct.pcie_d2h_gbps needs a 'value'"
    ):
        profiles.resolve(cr.MODEL, profile_dir=profile_dir)


# ---------------------------------------------------------------- recorded samples through the judges


def _node_results(doc: dict, profile: dict) -> list[dict]:
    """A recorded node document judged by today's judges: its benchmark figures again, then the fleet layer."""
    results = replay.benchmark_results(doc["results"], profile)
    fleet = compare.evaluate("replay", {"node": {"results": results, "profile": profile, "versions": doc["versions"]}})
    return results + fleet["results"]["node"]


@pytest.mark.slow
def test_a_healthy_node_with_one_low_pcie_sample_passes(profile_dir):
    """The issue's healthy 4 x H100: GPU 0's device-to-host copy once 43% below its median of 54.72 GB/s on a quiet
    GPU, and GPU 0's bf16 matmul steadily below its siblings. Judged again, its figures pass; the fleet layer's
    generic limits still name the sample spread and say they are not calibrated, the calibrated ones do not."""
    (clean,) = [r for r in cr.runs(clean=1, disturbed=0)]
    generic = profiles.resolve(cr.MODEL, profile_dir=profile_dir, overrides={"gpus_expected": 4})
    results = {f"{r['group']}.{r['check']}": r for r in _node_results(clean["document"], generic)}
    d2h = results["benchmark.pcie_d2h_bandwidth"]
    assert d2h["status"] == "pass" and "measure_again" not in d2h["detail"]
    assert (
        "GPU 0 device-to-host: 1 of 20 samples more than 20% below its median 54.72 GB/s (lowest 31.03, 43.29% below), "
        "nothing seen then: one low sample is not a disturbance"
    ) in d2h["reason"]
    assert [j["verdict"] for j in d2h["detail"]["samples_judged"]] == ["isolated", "steady", "steady", "steady"]
    spread = results["fleet.sample_spread"]
    # Only the controller compares spreads, on a figure the node measured once: inconclusive, not a warning.
    assert spread["status"] == "info" and spread["trust"] == "inconclusive"
    assert "generic: this model is not calibrated" in spread["reason"]
    # Calibrated from the healthy runs (the table's builder measures the same): nothing warns.
    table_dir = profile_dir / "calibration"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(cr.write(profile_dir.parent / "runs.jsonl", cr.runs(8, 0))),
            "--table",
            str(profile_dir.parent / "table.md"),
            "--profile-dir",
            str(profile_dir),
            "--limits",
            str(table_dir),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    calibrated = profiles.resolve(cr.MODEL, profile_dir=profile_dir, overrides={"gpus_expected": 4})
    judged = _node_results(clean["document"], calibrated)
    bad = [(r["group"], r["check"], r["status"]) for r in judged if r["status"] in ("warn", "fail", "error")]
    assert bad == [] and schema.verdict(judged) == "pass"
    spread = next(r for r in judged if r["check"] == "sample_spread")
    assert spread["threshold"]["calibrated"] is True and spread["threshold"]["by_metric"]["pcie_d2h_gbps"] > 44
    d2h = calibration.entry(calibrated["thresholds"], "sample_drop_pct_max", "pcie_d2h_gbps")
    assert d2h["calibrated"] is True and "calibration h100-sxm" in d2h["source"] and "runs.jsonl" in d2h["source"]


def test_a_node_whose_samples_fall_while_a_process_is_seen_does_not_pass():
    """GPU 1's HBM samples fall a third while the sampler sees pid 2002 on it: the figure is not the node's,
    the step is measured again once quiet, and the node is not accepted, the process named."""
    profile = profiles.resolve(cr.MODEL, overrides={"gpus_expected": 4})
    fall = {1: {i: 2000.0 + 20 * i for i in range(5, 12)}}
    out = cr.memory_output(cr.monitor([cr.DISTURB]), hbm_low=fall)
    hbm = next(r for r in memory_judge.memory(out, profile) if r["check"] == "hbm_bandwidth")
    assert hbm["status"] == "warn" and hbm["class"] == "environment"
    assert (
        "GPU 1 HBM copy: 7 of 20 samples" in hbm["reason"]
        and "the sampler saw then: pid 2002 (gpu_disturb)" in hbm["reason"]
    )
    assert [j["verdict"] for j in hbm["detail"]["samples_judged"]] == ["steady", "disturbed", "steady", "steady"]
    # Through the watched step: still disturbed when measured again, an error naming the process; the node fails.
    log: list = []
    results = watched(
        "memory",
        lambda: out,
        memory_judge.memory,
        profile,
        log=log,
        wait=lambda s: {"quiet": True, "waited_s": 3.0, "processes": [], "error": None},
    )
    node = foreign_processes("memory", log)
    assert {r["status"] for r in results} == {"error"} and node["status"] == "fail"
    assert "pid 2002 (gpu_disturb, 1002 MiB) on GPU 1" in node["reason"]
    assert schema.verdict(results + [node]) == "fail"


def test_the_judge_is_one_function_for_minimums_relative_limits_and_samples():
    assert judge.judge(699.9, judge.Limit("matmul_bf16_tflops_min", 700, kind=judge.MIN)).status == "fail"
    assert judge.judge(700.0, judge.Limit("matmul_bf16_tflops_min", 700, kind=judge.MIN)).status == "pass"
    two = judge.Limit("fleet_gpu_below_node_warn_pct", 5, fail=15)
    assert [judge.judge(x, two).status for x in (5.0, 5.01, 15.0, 15.01)] == ["pass", "warn", "warn", "fail"]
    assert judge.judge(702.0, judge.Limit("m", 700, kind=judge.MIN), interval=(695.0, 705.0)).near is True
    assert judge.judge(760.0, judge.Limit("m", 700, kind=judge.MIN), interval=(750.0, 770.0)).near is False
    assert judge.median_interval(list(range(20))) == (4, 15) and judge.median_interval([1, 2, 3]) is None
    quiet = judge.samples([100.0] * 19 + [50.0], 20)
    assert quiet["verdict"] == "isolated" and quiet["deepest_pct"] == 50.0
    seen = judge.samples(
        [100.0] * 19 + [50.0],
        20,
        causes=[{"what": "pid 9 (x)", "t_s": [1.85, 2.0]}],
        ends_s=[0.1 * (i + 1) for i in range(20)],
    )
    assert seen["verdict"] == "disturbed"
    elsewhere = judge.samples(
        [100.0] * 19 + [50.0],
        20,
        causes=[{"what": "pid 9 (x)", "t_s": [0.2, 0.4]}],
        ends_s=[0.1 * (i + 1) for i in range(20)],
    )
    assert elsewhere["verdict"] == "isolated"  # the process came and went while other samples ran
    assert judge.samples([100.0] * 17 + [70.0] * 3, 20)["verdict"] == "fell"


# ---------------------------------------------------------------- the table


@pytest.mark.slow
def test_the_calibration_table_counts_false_alarms_and_detections_recorded_and_today(profile_dir, tmp_path):
    # Two calls of the harness, one file each (one of them gzipped): the folder is read whole.
    folder = tmp_path / "calibration"
    folder.mkdir()
    rows = cr.runs(8, 2)
    cr.write(folder / "a.jsonl", rows[:5])
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(cr.write(tmp_path / "b.jsonl", rows[5:]).read_bytes()))
    data = folder
    table, limits = tmp_path / "table.md", profile_dir / "calibration"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(data),
            "--table",
            str(table),
            "--profile-dir",
            str(profile_dir),
            "--limits",
            str(limits),
            "--json",
            str(tmp_path / "table.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "10 node-runs of 1 GPU model(s)" in done.stdout
    cal = yaml.safe_load((limits / "h100-sxm.yml").read_text())
    assert cal["format"] == calibration.FORMAT and cal["gpu_models"] == [cr.MODEL] and cal["runs"]["clean_rounds"] == 8
    drop = cal["measures"]["sample_drop_pct"]["pcie_d2h_gbps"]
    # The lowest healthy sample, 43.29% below, counts at a third (one low sample may go that deep): 14.43.
    assert drop["n"] == 32 and drop["value"] == pytest.approx(43.29 / 3, abs=0.01) and "r000" in drop["source"]
    assert cal["runs"]["files"] == [str(folder / "a.jsonl"), str(folder / "b.jsonl.gz")]
    gpu = cal["measures"]["gpu_vs_node_pct"]["matmul_bf16_tflops"]
    assert gpu["n"] == 32 and 5.5 < gpu["value"] < 6.5  # the quick tier's GPU 0, 732.7 against about 780
    assert cal["measures"]["node_vs_past_pct"]["matmul_bf16_tflops"]["n"] > 0
    md = table.read_text()
    assert "## NVIDIA H100 80GB HBM3" in md and "Profile `h100-sxm`; 10 node-runs (8 clean, 2 disturbed" in md
    assert "node stage median 113.0 s clean, 113.0 s disturbed" in md
    rows = {
        line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
        for line in md.splitlines()
        if line.startswith("| `")
    }
    # columns: clean runs, false alarms recorded, today, disturbed runs, detections recorded, today, beside runs, ...
    assert rows["node verdict"] == ["8", "4", "0", "2", "2", "2", "0", "0", "0"]
    assert rows["node not accepted, process named"][3:6] == ["2", "2", "2"]
    assert rows["fleet.node_vs_baseline"][2] == "-"  # the replay has no store to hold a node against
    assert rows["benchmark.pcie_d2h_bandwidth"][:3] == ["8", "4", "0"]
    assert rows["fleet.sample_spread"][:3] == ["8", "4", "0"]
    assert rows["benchmark.memory_processes"][3:6] == ["2", "2", "2"]
    assert "| sample_drop_pct | pcie_d2h_gbps | 32 |" in md and "`sample_drop_pct_max`" in md
    # The fabric counters' healthy rates beside their limits, from the clean runs' snapshots (8 runs of 4 GPUs):
    # no PCIe replay grew.
    assert (
        "| pcie_replay | node stage | 32 | 0 | 0 | 0 | a minute | 16 (`fleet_counter_pcie_replay_per_min_warn`) |" in md
    )
    assert json.loads((tmp_path / "table.json").read_text())[cr.MODEL]["profile"] == "h100-sxm"


def test_each_machine_is_judged_on_the_limits_the_others_give(profile_dir, tmp_path):
    # Machine A: the healthy 4 x H100 of the issue. Machine B: other GPUs, two of its runs under another name (the
    # same GPUs, so the same machine), and in one run two PCIe samples of GPU 2 far below the rest, deeper than any
    # of A's: on A's limits (A's deepest, 43.29% at a third, 14.43 x 1.5 + 1 -> 23) that one figure lies above.
    a = cr.runs(8, 0)
    b = [cr.row(cr.document("node", cr.TORCH_BF16), f"b{k:03d}-node-clean") for k in range(2)]
    b.append(cr.row(cr.document("node", cr.TORCH_BF16, d2h_low={2: {4: 20.0, 9: 21.0}}), "b002-node-clean"))
    for k, r in enumerate(b):
        r["machine"]["host"] = "vm" if k else "named-b"
    text = "".join(json.dumps(r) + "\n" for r in a) + "".join(
        json.dumps(r).replace("GPU-c6fd56ed-d066-0df8-36f9-70bb02825b3", "GPU-00000000-0000-0000-0000-0000000000b")
        + "\n"
        for r in b
    )
    (tmp_path / "runs.jsonl").write_text(text)
    table, out = tmp_path / "table.md", tmp_path / "table.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(tmp_path / "runs.jsonl"),
            "--table",
            str(table),
            "--profile-dir",
            str(profile_dir),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())[cr.MODEL]
    assert got["machines"] == 2  # A, and B under two names
    held = {(h["measure"], h["metric"]): h for h in got["held_out"]["figures"]}
    drop = held[("sample_drop_pct", "pcie_d2h_gbps")]
    assert drop["machines"] == 2 and drop["figures"] == 4 * 11 and drop["above"] == 1
    assert drop["worst"][0] > 55 and drop["worst"][1] == 23.0
    assert "b002-node-clean" in got["held_out"]["rounds_above"] and got["held_out"]["rounds"] == 11
    md = table.read_text()
    assert "on 2 machine(s)" in md and "Each machine against the limits the other machines give" in md
    assert "| sample_drop_pct | pcie_d2h_gbps | 2 | 44 | 1 |" in md


def test_the_table_refuses_what_it_cannot_read(tmp_path):
    bad = tmp_path / "runs.jsonl"
    bad.write_text('{"format": "other"}\nnot json\n')
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(bad), "--table", str(tmp_path / "t.md")], capture_output=True, text=True
    )
    assert done.returncode == 0 and "2 line(s) not read" in done.stdout
    assert "runs.jsonl:2: not JSON" in (tmp_path / "t.md").read_text()
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "none.jsonl"), "--table", str(tmp_path / "t.md")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "no such data file or folder" in missing.stderr


# ---------------------------------------------------------------- a GPU's own character, a node's stable facts


def _run(reports: Path, run_id: str, docs: dict, started: str, twice: bool = False, **build) -> dict:
    """A run reported; twice: each node measured its figures twice against the references the run handed it."""
    hosts = reports / run_id / "hosts"
    hosts.mkdir(parents=True)
    docs = {host: dict(doc, host=host, started=started) for host, doc in docs.items()}
    for host, doc in docs.items():
        (hosts / f"{host}.json").write_text(json.dumps(doc))
    if twice:
        measured_twice(reports / run_id, docs)
    report.build(reports / run_id, **build)
    return json.loads((reports / run_id / "report.json").read_text())["nodes"]


def test_a_gpu_steadily_below_its_siblings_is_held_against_its_own_past(tmp_path):
    """GPU 0 of the issue's 4 x H100 is about 2.5% below its siblings in every run: listed, never named. GPU 2,
    usually 2.2% above them, comes 3.6% below: inside the generic 5% limit, but 5.9% off its own past: it warns."""
    reports = tmp_path / "reports"
    for k in range(3):
        nodes = _run(reports, f"r{k}", {"node": cr.document("node", cr.TORCH_BF16)}, f"2026-11-2{k}T10:00:00Z")
        assert nodes["node"]["verdict"] == "pass"
    gpu = {f"{r['group']}.{r['check']}": r for r in nodes["node"]["results"]}["fleet.gpu_vs_node"]
    assert gpu["status"] == "pass" and "held against their own past, not named again: GPU" in gpu["reason"]
    assert (
        "GPU 0 steadily 2.3% below its siblings (bf16 matmul, over its last 2 runs, now 2.3%; and 3 more figure(s))"
        in gpu["reason"]
    )
    slipped = list(cr.TORCH_BF16)
    slipped[2] = 720.0  # usually 775.8, the best of the four
    # Measured once (no record from the node's stage): inconclusive, nothing to act on yet.
    shutil.copytree(reports, tmp_path / "once")
    nodes = _run(tmp_path / "once", "r3", {"node": cr.document("node", slipped)}, "2026-11-23T10:00:00Z")
    gpu = {f"{r['group']}.{r['check']}": r for r in nodes["node"]["results"]}["fleet.gpu_vs_node"]
    assert gpu["status"] == "info" and gpu["trust"] == "inconclusive" and "inconclusive: GPU 2" in gpu["reason"]
    # The node's stage measured it twice against its own past, handed to it: the change stands.
    nodes = _run(reports, "r3", {"node": cr.document("node", slipped)}, "2026-11-23T10:00:00Z", twice=True)
    gpu = {f"{r['group']}.{r['check']}": r for r in nodes["node"]["results"]}["fleet.gpu_vs_node"]
    assert (
        gpu["status"] == "warn"
        and gpu["trust"] == "confirmed"
        and gpu["remedy"]
        and "gpufleet history" in gpu["remedy"]
    )
    assert (
        "bf16 matmul 720.0 TFLOPS is 3.6% below the node median 747.1; over its last 3 runs it was 2.2% above it: 5.9% "
        "lower, a change against its own past (threshold 5%)"
    ) in gpu["reason"]
    row = next(c for c in gpu["detail"]["comparisons"] if c["metric"] == "matmul_bf16_tflops" and c["status"] == "warn")
    assert row["uuid"] == cr.UUIDS[2] and row["own_past"]["runs"] == 3 and row["own_past"]["changed"] is True


def test_a_stable_fact_the_baseline_accepted_is_listed_not_warned_again(tmp_path):
    """A GPU with 2 uncorrectable ECC errors over its lifetime warns when first seen; once a baseline run accepted
    the node with them, they are information; a third error is a change, and warns again saying what it was."""
    from gpufleet import collect
    from gpufleet.node import host_documents

    readings = collect.load_recording(ROOT / "tests/data/readings/recorded-h100-x1-vm.json")

    def doc(lifetime: int) -> dict:  # the ECC check of the recorded GPU (the VM's other findings left out)
        readings["nvml"]["gpus"][0]["ecc_aggregate_uncorrected"] = lifetime
        made = host_documents.check_host(readings, ["gpu_health"], host="node", overrides={"gpus_expected": 1})
        return {**made, "results": [r for r in made["results"] if r["check"] == "ecc"]}

    reports = tmp_path / "reports"
    first = {r["check"]: r for r in _run(reports, "b", {"node": doc(2)}, "2026-11-20T10:00:00Z")["node"]["results"]}
    assert first["ecc"]["status"] == "warn" and first["ecc"]["detail"]["facts"] == {
        f"ecc_aggregate_uncorrected:{readings['nvml']['gpus'][0]['uuid']}": 2
    }
    again = {
        r["check"]: r
        for r in _run(reports, "r1", {"node": doc(2)}, "2026-11-21T10:00:00Z", baseline="b")["node"]["results"]
    }
    assert again["ecc"]["status"] == "info" and again["ecc"]["class"] is None
    assert "(as in baseline run b, which accepted it: listed, not warned again)" in again["ecc"]["reason"]
    more = {
        r["check"]: r
        for r in _run(reports, "r2", {"node": doc(3)}, "2026-11-22T10:00:00Z", baseline="b")["node"]["results"]
    }
    assert (
        more["ecc"]["status"] == "warn"
        and "changed since baseline run b: ecc_aggregate_uncorrected:GPU-" in more["ecc"]["reason"]
    )
    assert "was 2, now 3" in more["ecc"]["reason"]


def test_run_folders_become_calibration_lines_only_where_no_foreign_process_was_seen(tmp_path):
    # A node-run counts as clean by what it saw, never by its verdict: the warned clean one stays, the one with a
    # foreign process on its GPU is left out and named.
    clean, disturbed = cr.runs(1, 1)
    run_dir = tmp_path / "reports" / "r1"
    (run_dir / "hosts").mkdir(parents=True)
    (run_dir / "hosts" / "quiet.json").write_text(json.dumps(dict(clean["document"], host="quiet")))
    (run_dir / "hosts" / "busy.json").write_text(json.dumps(dict(disturbed["document"], host="busy")))
    out = tmp_path / "calibration" / "runs.jsonl.gz"
    out.parent.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(tool_modules.TOOLS / "calibration_from_runs.py"),
            str(run_dir),
            "--machine",
            "lab-a",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "left out: " in done.stdout and "/busy: not clean (benchmark.memory_processes" in done.stdout
    [row] = [json.loads(line) for line in gzip.decompress(out.read_bytes()).decode().splitlines()]
    assert row["node"] == "quiet" and row["condition"] == "clean" and row["machine"]["host"] == "lab-a"
    assert row["machine"]["gpu_model"] == cr.MODEL and row["machine"]["gpus_on_machine"] == 4
    table = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out.parent), "--table", str(table)], capture_output=True, text=True
    )
    assert done.returncode == 0 and "1 node-runs of 1 GPU model(s)" in done.stdout, done.stdout + done.stderr
    assert "Profile `h100-sxm`; 1 node-runs (1 clean, 0 disturbed" in table.read_text()
