"""The last false alarms: host figures held to their own spread, comparisons that take the trust of their figures,
suspects named, and a confirmation that measures only what asked.

Each case replays recorded readings through the real judge: the host documents of the lent machines of
docs/results/2026-11-28-one-judge-host-steal (c2: a clean 2 x H200 run failed `node_vs_baseline` as hardware, its
data loader 32.5% and its memory triad 20.8% below the baseline run of 102 s before; c3: the memory step of a clean
run of another 2 x H200), judged again with today's profile (benchmarks.replay, the calibration of files/profiles) and
reported by report.build() against a real store; the memory step's figures through measure.watched and the node's
comparisons (comparisons.node.Held).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import tool_modules
import yaml

from gpufleet import report
from gpufleet.base import calibration, profiles
from gpufleet.base.numbers import significant
from gpufleet.bench import summarize
from gpufleet.bench.host_watch import HostWatch, Limits
from gpufleet.benchmarks.memory import memory_judge, memory_measure
from gpufleet.benchmarks import replay
from gpufleet.benchmarks.host import host_figures
from gpufleet.comparisons import metrics
from gpufleet.comparisons.node import Held
from gpufleet.comparisons.thresholds import BASE_WARN
from gpufleet.fleet.store import Store
from gpufleet.node.measure import NodeSteps, measured_again, watched

ROOT = Path(__file__).resolve().parent.parent
STEAL = ROOT / "docs/results/2026-11-28-one-judge-host-steal"
BASE, FELL = "after-085237-acc", "after-085414-acc"  # c2: the baseline run, and the clean run that failed
HOST_METRICS = ("host_memory_gbps", "loader_tokens_per_s_per_gpu")
VM = {"virtual": True, "why": "DMI product_name 'KVM'; CPU flag hypervisor"}  # as benchmarks.host records a VM


def recorded(call: str, run: str) -> tuple[dict, dict]:
    """(run.json, the node's host document) of one recorded run."""
    with tarfile.open(STEAL / f"{call}-runs.tar.gz") as tar:
        info = json.load(tar.extractfile(f"reports-after/{run}/run.json"))
        doc = json.load(tar.extractfile(f"reports-after/{run}/hosts/localhost.json"))
    return info, doc


def h200(profile_dir: Path | None = None) -> dict:
    return profiles.resolve("NVIDIA H200", gpus=2, overrides={"gpus_expected": 2}, profile_dir=profile_dir)


def replayed_run(reports: Path, run: str, profile: dict, *, as_run: str | None = None, virtual: bool = False) -> Path:
    """A recorded c2 run in the reports folder, judged on the node by today's judges and profile; `as_run`: the same
    readings as a later run of that id; `virtual`: its host figures read on a VM, as today's benchmarks.host says."""
    info, doc = recorded("c2", run)
    if as_run:
        info = {**info, "run_id": as_run, "started": "2026-11-28T09:10:00Z"}
        doc["started"] = info["started"]
    doc["profile"] = {"name": profile["name"], "thresholds": profile["thresholds"]}
    doc["results"] = replay.benchmark_results(doc["results"], profile)
    if virtual:
        for r in doc["results"]:
            if r["check"] in host_figures.HOST_CHECKS:
                r["detail"]["machine"] = VM
    run_dir = reports / info["run_id"]
    (run_dir / "hosts").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(info))
    (run_dir / "hosts" / "localhost.json").write_text(json.dumps(doc))
    return run_dir


def judged_runs(tmp_path: Path, profile: dict, runs: list[tuple], virtual: bool = False) -> list[dict]:
    """The recorded baseline run and then each (run, as_run) reported against it: each later run's report."""
    reports = tmp_path / "reports"
    report.build(replayed_run(reports, BASE, profile, virtual=virtual))
    with Store(reports / "gpufleet.db") as store:
        store.set_baseline(BASE)
    out = []
    for run, as_run in runs:
        run_dir = replayed_run(reports, run, profile, as_run=as_run, virtual=virtual)
        report.build(run_dir)
        out.append(json.loads((run_dir / "report.json").read_text())["nodes"]["localhost"])
    return out


def fleet(node: dict, check: str) -> dict:
    return next(r for r in node["results"] if r["group"] == "fleet" and r["check"] == check)


def host_calibration(tmp_path: Path, figure: dict | None) -> Path:
    """The shipped profiles, the H200's host figures against their past calibrated as `figure` ({"value", "n"}) for
    the model and no topology, or not at all (None)."""
    profile_dir = tmp_path / "profiles"
    shutil.copytree(ROOT / "files/profiles", profile_dir)
    path = profile_dir / "calibration" / "h200-sxm.yml"
    doc = yaml.safe_load(path.read_text())
    for measures in [doc["measures"], *(t["measures"] for t in doc.get("topologies", {}).values())]:
        for metric in HOST_METRICS:
            (measures.get("node_vs_past_pct") or {}).pop(metric, None)
    if figure:
        past = doc["measures"]["node_vs_past_pct"]
        past.update({m: {"quantile": 1.0, **figure, "source": "the test's healthy figures"} for m in HOST_METRICS})
    path.write_text(yaml.safe_dump(doc))
    return profile_dir


def test_the_clean_vm_run_whose_host_figures_fell_is_not_failed_as_hardware(tmp_path):
    """c2's clean run failed `node_vs_baseline` and `_fleet`, class hardware, confirmed (the loader 32.5%, the triad
    20.8% below the baseline run; the GPUs' figures within their limits). Today the 2-GPU H200's host figures have
    limits of their own from the lent machines' clean runs (docs/results/calibration: 12 figures of each, the
    recorded runs of c1-c3 among them), and the same readings pass, measured again as they were."""
    profile = h200(ROOT / "files/profiles")  # the shipped calibration (the tests' default profiles have none)
    (node,) = judged_runs(tmp_path, profile, [(FELL, None)])
    assert node["verdict"] == "pass" and not {r.get("class") for r in node["results"]} - {None}
    for metric in HOST_METRICS:
        limit = calibration.entry(profile["thresholds"], BASE_WARN, metric)
        assert limit["calibrated"] and profile["thresholds"][BASE_WARN]["by_metric"][metric]["n"] >= calibration.MIN_N
    for check in ("node_vs_baseline", "node_vs_baseline_fleet"):
        res = fleet(node, check)
        rows = {c["metric"]: c for c in res["detail"]["comparisons"] if c["metric"] in HOST_METRICS}
        assert res["status"] == "pass", res["reason"]
        assert (rows["host_memory_gbps"]["value"], rows["host_memory_gbps"]["reference"]) == (93.48, 118.0)
        assert rows["loader_tokens_per_s_per_gpu"]["deviation_pct"] == pytest.approx(-32.55, abs=0.01)
        assert "data loader 36.04%, then 32.55% below" in res["reason"]  # measured again on the node, as it was


def test_until_a_models_host_figures_are_calibrated_their_drop_is_information_with_the_numbers(tmp_path):
    """The same readings with no calibration of the host figures (a model the lent machines never ran, or before
    these runs): the drops are information with the numbers, the generic limits named, not a warning."""
    profile = h200(host_calibration(tmp_path, None))
    assert not calibration.entry(profile["thresholds"], BASE_WARN, "host_memory_gbps")["calibrated"]
    (node,) = judged_runs(tmp_path, profile, [(FELL, None)])
    assert node["verdict"] == "pass"
    res = fleet(node, "node_vs_baseline")
    assert res["status"] == "info" and res["class"] is None, res["reason"]
    assert res["reason"].startswith(
        "information, not a warning: node localhost data loader 135,300,000 tokens/s/GPU is 32.5% below baseline run "
        f"{BASE}'s figure for this node 200,600,000 (fail threshold 15%, generic: this model is not calibrated)"
    )
    assert "host memory triad, slowest NUMA node 93.48 GB/s is 20.8% below" in res["reason"]
    assert "whose run-to-run spread no calibration of this model has measured yet" in res["reason"]
    rows = [c for c in res["detail"]["comparisons"] if c["metric"] in HOST_METRICS]
    assert {(c["status"], c["would_be"]) for c in rows} == {("info", "fail")}
    # The node did not measure them again for it: information asks for no confirmation.
    again = node_result(node, "measured_again", "host")
    assert again is None or "host" not in again


def node_result(node: dict, check: str, step: str) -> str | None:
    res = next((r for r in node["results"] if r["group"] == "benchmark" and r["check"] == check), None)
    return res["reason"] if res else None


def test_on_a_virtual_machine_a_host_figures_drop_is_environment_unless_it_repeats_over_runs(tmp_path):
    """Limits narrow enough for c2's drop to pass them (the host figures calibrated at 1% over 12 figures: 2.5%), its
    host figures read on a VM: the drop is class environment, with what to do about it; the same drop in the next
    run as well repeats over runs, and is the node's (hardware)."""
    profile = h200(host_calibration(tmp_path, {"value": 1.0, "n": 12}))
    first, again = judged_runs(tmp_path, profile, [(FELL, None), (FELL, "after-091000-acc")], virtual=True)
    res = fleet(first, "node_vs_baseline")
    assert res["status"] == "fail" and res["class"] == "environment" and res["trust"] == "confirmed", res["reason"]
    assert "on a virtual machine (DMI product_name 'KVM'; CPU flag hypervisor)" in res["reason"]
    assert f"in run {BASE} it read 118.0 GB/s" in res["reason"] and "validate again later" in res["remedy"]
    assert first["verdict"] == "fail" and "hardware" not in {r.get("class") for r in first["results"]}
    res = fleet(again, "node_vs_baseline")
    assert res["status"] == "fail" and res["class"] == "hardware", res["reason"]
    assert f"93.48 GB/s in run {FELL} too, 20.8% below the same reference: it repeats over runs" in res["reason"]


# --- the memory step: c3's recorded figures, GPU 1's host-to-device samples falling as the issue's did ------------


def c3_memory() -> tuple[dict, list[dict]]:
    """(the recorded memory output of c3's last clean run, that run's other results)."""
    _, doc = recorded("c3", "after-090946-acc")
    h2d = next(r for r in doc["results"] if r["check"] == "pcie_h2d_bandwidth")
    rest = [r for r in doc["results"] if r["check"] not in replay.MEMORY_CHECKS and r["group"] != "fleet"]
    return replay.memory_output(copy.deepcopy(h2d["detail"])), rest


def with_h2d(out: dict, medians: dict[str, float], low: dict[str, list] | None = None, shift_s: float = 0.0) -> dict:
    """The output with each GPU's host-to-device samples those of GPU 0, scaled to its median; `low` {gpu: samples
    fallen to this value...} replaces the middle ones (the issue's fall: 45.6 GB/s); shift_s moves the measurement
    on the clock, as a later one is."""
    out = copy.deepcopy(out)
    ref = out["per_device"]["pcie"]["0"]["samples_h2d_gbps"]
    for dev, median in medians.items():
        values = [v * median / ref["median"] for v in ref["values"]]
        for i, v in enumerate((low or {}).get(dev, [])):
            values[8 + i] = v
        fig = out["per_device"]["pcie"][dev]
        fig["samples_h2d_gbps"] = {**summarize(values), "ends_s": [e + shift_s for e in ref["ends_s"]]}
        fig["h2d_gbps"] = significant(fig["samples_h2d_gbps"]["median"])
    out["summary"]["h2d_gbps_min"] = min(v["h2d_gbps"] for v in out["per_device"]["pcie"].values())
    out["monitor"] = {**out["monitor"], "started_monotonic": out["monitor"]["started_monotonic"] + shift_s}
    return out


ISSUE_FALL = {"0": 55.01, "1": 51.05}, {"1": [45.6] * 5}  # 51.05 against 55.01, 5 of 20 samples 10.7% low


def issue_limits(tmp_path: Path) -> dict:
    """The H200's profile with the limits the issue's run had for host-to-device: a sample 5.5% below its median
    falls (sample_drop_pct_max), a GPU 4% below its sibling warns (fleet_gpu_below_node_warn_pct)."""
    profile_dir = tmp_path / "issue-profiles"
    shutil.copytree(ROOT / "files/profiles", profile_dir, ignore=shutil.ignore_patterns("calibration"))
    (profile_dir / "calibration").mkdir()
    fig = {"quantile": 1.0, "n": 20, "source": "the issue's run"}
    measures = {
        "sample_drop_pct": {"pcie_h2d_gbps": {**fig, "value": 3.0}},  # x1.5 + 1: 5.5%
        "gpu_vs_node_pct": {"pcie_h2d_gbps": {**fig, "value": 2.0}},  # 4%
    }
    doc = {"format": calibration.FORMAT, "profile": "h200-sxm", "measures": measures}
    (profile_dir / "calibration" / "h200-sxm.yml").write_text(yaml.safe_dump(doc))
    profile = h200(profile_dir)
    assert calibration.entry(profile["thresholds"], "sample_drop_pct_max", "pcie_h2d_gbps")["value"] == 5.5
    assert calibration.entry(profile["thresholds"], "fleet_gpu_below_node_warn_pct", "pcie_h2d_gbps")["value"] == 4
    return profile


def test_a_figure_judged_unstable_makes_no_finding_against_its_sibling(tmp_path):
    """The issue's case 2: GPU 1's host-to-device measured three times, its samples falling each time ("not yet the
    node's", class environment), and `gpu_vs_node` then held it against GPU 0 and warned hardware (51.05 against
    55.01, 7.2%, limit 4%). A figure the judge did not trust is compared with nothing, and the report says why."""
    profile = issue_limits(tmp_path)
    out, rest = c3_memory()
    fell = with_h2d(out, *ISSUE_FALL)
    gpus = metrics.inventory(rest)
    log: list = []
    results = watched(
        "memory", iter([fell] * 4).__next__, memory_judge.memory, profile, log=log, hold=Held(None, profile, gpus, "vm")
    )
    h2d = next(r for r in results if r["check"] == "pcie_h2d_bandwidth")
    assert h2d["status"] == "warn" and h2d["class"] == "environment" and "not yet the node's" in h2d["reason"]
    assert len(h2d["detail"]["attempts"]) >= 2  # measured again, as the issue's was
    run_dir = tmp_path / "reports" / "r1"
    (run_dir / "hosts").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"schema_version": 1, "run_id": "r1", "hosts": ["localhost"]}))
    _, doc = recorded("c3", "after-090946-acc")
    doc["profile"] = {"name": profile["name"], "thresholds": profile["thresholds"]}
    doc["results"] = rest + [r.replace(group="benchmark") for r in [*results, measured_again(log)]]
    (run_dir / "hosts" / "localhost.json").write_text(json.dumps(doc))
    report.build(run_dir)
    node = json.loads((run_dir / "report.json").read_text())["nodes"]["localhost"]
    res = fleet(node, "gpu_vs_node")
    assert res["status"] == "pass" and res["class"] is None, res["reason"]
    rows = [c for c in res["detail"]["comparisons"] if c["metric"] == "pcie_h2d_gbps"]
    assert {(c["index"], c["status"]) for c in rows} == {(0, "not_compared"), (1, "not_compared")}
    assert {c["index"]: c["would_be"] for c in rows}[1] in ("warn", "fail")  # what made the hardware finding
    assert (
        "PCIe host-to-device of GPU 1 50.85 GB/s: its samples fell with nothing seen on the GPU (5 of 20 more than "
        "5.5% below their median): not yet the node's (benchmark.pcie_h2d_bandwidth)"
    ) in res["reason"].split("; not compared: ")[1]
    assert "the figure it is held against is not the node's" in res["reason"]  # GPU 0's only sibling
    assert "hardware" not in {r.get("class") for r in node["results"]}


def test_an_unstable_figure_names_the_processes_the_watches_saw_as_suspects(tmp_path):
    """The issue's case 3: beside three memory-copying processes of another user, 9.4% of a 32-CPU VM's CPUs (under
    the 10% limit), GPU 1's host-to-device samples fell; the judge measured again and warned environment, but named
    nobody. The host watch reads a recorded /proc in which three `memcpy` processes use a core each."""
    from test_host_watch import ME, TICKS_S, fake_proc

    tree = {100: ("python3", 1, 0), **{pid: ("memcpy", 1, 0) for pid in (201, 202, 203)}}
    fake_proc(tmp_path, tree)
    watch = HostWatch(limits=Limits.of(h200()), root_pid=100, proc_root=str(tmp_path))
    watch.cpus = 32  # the lent VM's
    watch.read_from(time.monotonic())
    fake_proc(tmp_path, {**tree, **{pid: ("memcpy", 1, TICKS_S) for pid in (201, 202, 203)}})
    assert watch.sample(t_s=1.0)["disturbed"] is False and not watch.foreign()  # under the limit
    out, _ = c3_memory()
    fell = with_h2d(out, *ISSUE_FALL)
    fell["monitor"]["host"] = watch.summary()
    profile = issue_limits(tmp_path)
    h2d = next(r for r in memory_judge.memory(fell, profile) if r["check"] == "pcie_h2d_bandwidth")
    seen = (
        f"3 processes memcpy of user {ME} (pids 201, 202, 203) (3 cores, 9.38% of the host's 32 CPUs; the host's "
        "other processes 9.38% together at most, under the limit 10%)"
    )
    assert h2d["status"] == "warn" and h2d["class"] == "environment"
    assert f"suspects seen while it was measured, under the limits: {seen}" in h2d["reason"], h2d["reason"]
    (judged,) = [j for j in h2d["detail"]["samples_judged"] if j["verdict"] == "fell"]
    assert [s["over_limit"] for s in judged["suspects"]] == [False]
    # A step disturbed by a process on its GPU names them too, beside the process that disturbed it.
    gpu_neighbour = {"pid": 4242, "name": "gpu_disturb", "used_memory_mib": 1002, "index": 1, "first_s": 1.0}
    fell["monitor"]["foreign"] = [{**gpu_neighbour, "last_s": 3.0, "own": False}]
    results = watched(
        "memory", iter([fell, fell]).__next__, memory_judge.memory, profile, log=[], wait=lambda s: {"quiet": True}
    )
    assert {r["status"] for r in results} == {"error"}
    assert f"not the node's; suspects seen while it was measured, under the limits: {seen}" in results[0]["reason"]


def test_a_confirmation_measures_again_only_the_figures_that_asked(monkeypatch, tmp_path):
    """The issue's case 4: the memory step measured HBM and PCIe again on every GPU for one GPU's host-to-device
    figure. GPU 1's figure 10% below its sibling (a comparison past its limit), then its samples fallen (the result
    itself asks): each time the node measures GPU 1's host-to-device alone, completes the measurement with it and
    says so."""
    profile = issue_limits(tmp_path)
    out, rest = c3_memory()
    gpus = metrics.inventory(rest)
    asked: list = []

    for first, why in (
        (with_h2d(out, {"0": 55.01, "1": 49.5}), "gpu_vs_node|pcie_h2d_gbps|tier=quick|"),
        (with_h2d(out, *ISSUE_FALL), "pcie_h2d_bandwidth"),
    ):
        healthy = with_h2d(out, {"1": 54.9}, shift_s=30.0)
        part = {**healthy, "per_device": {"hbm": {}, "pcie": {"1": healthy["per_device"]["pcie"]["1"]}}}

        def measured(depth: str, only: dict | None = None, first=first, part=part) -> dict:
            asked.append(only)
            return first if only is None else {**part, "method": {**part["method"], "only": only}}

        monkeypatch.setattr(memory_measure, "run", measured)
        steps = NodeSteps(["memory"], "quick", 2, profile, hold=Held(None, profile, gpus, "vm"))
        results = {r["check"]: r for r in steps.measure("memory")}
        h2d = results["pcie_h2d_bandwidth"]
        assert asked[-2:] == [None, {"pcie_h2d_gbps": ["1"]}]
        tries = h2d["detail"]["attempts"]
        assert [(a["purpose"], a.get("measured")) for a in tries] == [
            ("first", None),
            ("confirm", "GPU 1 host-to-device"),
        ]
        assert any(c.startswith(why) for c in tries[0]["confirm"]), tries[0]["confirm"]
        assert h2d["status"] == "pass" and h2d["trust"] == "confirmed", h2d["reason"]
        assert "GPU 1 host-to-device measured again alone" in h2d["reason"]
        per = h2d["detail"]["per_gpu"]
        assert per["pcie"]["1"]["h2d_gbps"] == part["per_device"]["pcie"]["1"]["h2d_gbps"]
        for dev in ("0", "1"):  # the figures that did not ask are the first measurement's
            assert per["hbm"][dev] == first["per_device"]["hbm"][dev]
            assert per["pcie"][dev]["samples_d2h_gbps"] == first["per_device"]["pcie"][dev]["samples_d2h_gbps"]
        assert per["pcie"]["0"]["samples_h2d_gbps"] == first["per_device"]["pcie"]["0"]["samples_h2d_gbps"]
        spent = next(r for r in steps.processes() if r["check"] == "measured_again")
        assert "(to confirm a figure: GPU 1 host-to-device alone)" in spent["reason"]


@pytest.mark.slow
def test_the_calibration_table_and_the_readme_rows_say_the_host_figures_spread_and_false_alarms(tmp_path):
    """One command makes the table's host figures and README.md's rows of them: the recorded runs of c1-c3 alone
    (6 figures of each host figure against its past, short of the 10 that calibrate) give each figure's range, its
    run-to-run spread, today's limit (not calibrated: information) and its false alarms: c2's, recorded, none today."""
    profile_dir = tmp_path / "profiles"
    shutil.copytree(ROOT / "files/profiles", profile_dir, ignore=shutil.ignore_patterns("calibration"))
    readme = tmp_path / "README.md"
    sys.path.insert(0, str(tool_modules.TOOLS))  # the calibration tools import each other by name
    BEGIN, END = tool_modules.load("calibration_host").BEGIN, tool_modules.load("calibration_host").END
    readme.write_text(f"# gpufleet\n\nbefore\n\n{BEGIN}\nold rows\n{END}\n\nafter\n")
    files = [ROOT / f"docs/results/calibration/2026-11-28-h200-x2-host-steal-{c}.jsonl.gz" for c in ("c1", "c2", "c3")]
    table = tmp_path / "table.md"
    command = [
        *(str(f) for f in files),
        "--table",
        str(table),
        "--profile-dir",
        str(profile_dir),
        "--limits",
        str(profile_dir / "calibration"),
        "--readme",
        str(readme),
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools/calibration_table.py"), *command], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    text = readme.read_text()
    assert text.startswith("# gpufleet\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old rows" not in text
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| NVIDIA H200, 2 GPU(s) |")}
    # c2's 20.78% below its past is the largest of 6 figures: they widen the generic 5% to 32.5%, calibrating nothing
    assert rows["host memory triad, slowest NUMA node"] == (
        "| NVIDIA H200, 2 GPU(s) | host memory triad, slowest NUMA node | 2, 8 | 93.48-123.1 GB/s | 6: 7.31, 20.78, "
        "20.78 | 32.5%, not calibrated: a drop is information | 1 / 0 |"
    )
    assert "| data loader | 2, 8 | 135.3-247.4 M tokens/s a GPU | 6: " in rows["data loader"]
    assert rows["data loader"].endswith("| 50%, not calibrated: a drop is information | 1 / 0 |")
    md = table.read_text()
    assert "| 2gpu | host memory triad, slowest NUMA node | 2 | 8 | 93.48-123.1 GB/s |" in md
    # A README without the rows' lines is refused, naming them.
    readme.write_text("# gpufleet\n")
    refused = subprocess.run(
        [sys.executable, str(ROOT / "tools/calibration_table.py"), *command], capture_output=True, text=True
    )
    assert refused.returncode != 0 and BEGIN in refused.stderr
