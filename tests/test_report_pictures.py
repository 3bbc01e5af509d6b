"""The report's pictures and limits, read back as data from reports of recorded run folders (tests/report_runs.py):
each SVG parsed with xml.etree and its elements checked against the host documents they were drawn from; the
limit that decided each result; report.md's text form of each picture. The fleet of many nodes and the browser:
tests/test_report_browser.py."""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import report_runs as runs
from gpufleet.benchmarks.soak import soak_judge as checks_soak
from gpufleet.benchmarks.soak import soak_remeasure as remeasure
from gpufleet.report import formatting, soak_data, svg_soak


def svgs(run: Path, kind: str) -> list[ET.Element]:
    """Every picture of one kind in report.html, parsed as XML (a picture that is not well-formed fails here)."""
    html = (run / "report.html").read_text()
    parsed = [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", html, re.S)]
    return [s for s in parsed if kind in s.get("class", "").split()]


def host_doc(run: Path) -> dict:
    return json.loads((run / "hosts" / "localhost.json").read_text())


def node(run: Path) -> dict:
    return runs.report_json(run)["nodes"]["localhost"]


def result(results: list[dict], group: str, check: str) -> dict:
    return next(r for r in results if r.get("group") == group and r["check"] == check)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def four(reports) -> Path:
    return runs.four_gpus(reports / "four")


@pytest.fixture(scope="module")
def soak(reports) -> Path:
    return runs.disturbed_soak(reports / "soak")


@pytest.fixture(scope="module")
def one(reports) -> Path:
    return runs.one_gpu(reports / "one")


@pytest.fixture(scope="module")
def soak_one(reports) -> Path:
    return runs.one_gpu_soak(reports / "soak-one")


# ---------------------------------------------------------------- the limit that decided


def test_one_limit_decides_as_itself(one):
    res = result(node(one)["results"], "benchmark", "matmul_bf16")
    assert formatting.decided_limit(res) == {
        "key": "matmul_bf16_tflops_min",
        "value": res["threshold"]["value"],
        "source": res["threshold"]["source"],
        "calibrated": False,
        "metric": None,
    }


def test_a_pair_decides_by_the_status_and_its_worst_comparison(four):
    res = result(node(four)["results"], "fleet", "node_vs_baseline")
    worst = min(res["detail"]["comparisons"], key=lambda c: c["deviation_pct"])
    assert res["status"] == "pass" and worst["metric"] == "matmul_fp16_tflops"  # GPU 2, 8% under after-1-1
    limit = formatting.decided_limit(res)
    assert limit["key"] == "fleet_below_baseline_warn_pct" and limit["metric"] == "matmul_fp16_tflops"
    assert limit["value"] == res["threshold"]["by_metric"]["matmul_fp16_tflops"] == 11.0
    assert limit["calibrated"] is True and "calibration" in limit["source"]
    # A failure on one figure (all_to_all at 1 MiB) is decided by the fail level; the H200 has no calibrated fail
    # limit of its own for it, so the generic one stands and says so.
    failed = copy.deepcopy(res)
    failed["status"] = "fail"
    failed["detail"]["comparisons"].append(
        {"metric": "nccl_node_all_to_all_busbw_gbps_le_1MiB", "value": 40.0, "reference": 60.0, "deviation_pct": -33.3,
         "status": "fail"}
    )  # fmt: skip
    assert formatting.decided_limit(failed) == {
        "key": "fleet_below_baseline_fail_pct",
        "value": res["threshold"]["fail"]["value"],
        "source": res["threshold"]["fail"]["source"],
        "calibrated": False,
        "metric": "nccl_node_all_to_all_busbw_gbps_le_1MiB",
    }


def test_a_row_past_its_limit_once_decides_below_the_rows_that_stand():
    threshold = {"key": "w", "value": 5, "source": "s", "fail": {"key": "f", "value": 15, "source": "t"}}
    once = {"metric": "hbm_copy_gbps", "deviation_pct": -20.0, "status": "inconclusive", "would_be": "fail"}
    stands = {"metric": "matmul_bf16_tflops", "deviation_pct": -6.0, "status": "warn"}
    res = {"status": "warn", "threshold": threshold, "detail": {"comparisons": [once, stands]}}
    assert (
        formatting.decided_limit(res)["key"] == "w" and formatting.decided_limit(res)["metric"] == "matmul_bf16_tflops"
    )
    res = {"status": "info", "threshold": threshold, "detail": {"comparisons": [once]}}
    assert formatting.decided_limit(res)["key"] == "f" and formatting.decided_limit(res)["metric"] == "hbm_copy_gbps"


def test_the_judges_own_word_stands():
    decided = {"key": "k_fail", "value": 9, "source": "s", "calibrated": True, "metric": "m"}
    res = {"status": "warn", "threshold": {"key": "k_warn", "value": 1, "fail": {"key": "k_fail"}, "decided": decided}}
    assert formatting.decided_limit(res) is decided
    assert formatting.decided_limit({"status": "pass"}) is None


def test_each_result_shows_the_limit_that_decided_it_and_folds_the_rest(four):
    results = node(four)["results"]
    html = (four / "report.html").read_text()
    decided = [r for r in results if formatting.decided_limit(r)]
    assert len(decided) > 20
    assert html.count('<div class="lim">') == len(decided)
    for res in decided:
        shown, _ = formatting.decided_text(formatting.decided_limit(res))
        assert shown.replace("'", "&#x27;") in html, res["check"]
    row = html[html.index("fleet.node_vs_baseline</code>") :]
    row = row[: row.index("<code>fleet.node_vs_baseline_fleet</code>")]
    assert "fleet_below_baseline_warn_pct = 11 for matmul_fp16_tflops, calibrated" in row
    assert "<summary>whole threshold</summary>" in row and "fleet_below_baseline_fail_pct" in row  # the rest, folded
    md = (four / "report.md").read_text()
    assert (
        "| `fleet.node_vs_baseline` | 8.02 % below |  | fleet_below_baseline_warn_pct = 11 for matmul_fp16_tflops" in md
    )


# ---------------------------------------------------------------- the soak


def lanes(svg: ET.Element) -> list[ET.Element]:
    return svg.findall("g[@class='lane']")


def box(lane: ET.Element) -> tuple[float, float]:
    """(top, bottom) of a lane, from its background."""
    bg = lane.find("rect[@class='lane-bg']")
    return float(bg.get("y")), float(bg.get("y")) + float(bg.get("height"))


def test_a_disturbed_soak_marks_its_window_and_the_foreign_process(soak):
    detail = result(host_doc(soak)["results"], "benchmark", "soak_slowdown")["detail"]
    first, again = svgs(soak, "soak")
    assert first.get("data-windows") == "1" and again.get("data-windows") == "2"
    gpus = {g["nvml_index"] for g in detail["per_gpu"].values()}
    assert {(lane.get("data-gpu"), lane.get("data-metric")) for lane in lanes(first)} == {
        (str(i), m) for i in gpus for m in ("matmul_tflops", "hbm_gbps")
    }
    for lane in lanes(first):
        assert lane.get("data-windows") == "0" and lane.get("data-disturbed") == "0"
        assert [r.get("data-window") for r in lane.findall("rect[@class='disturbed']")] == ["0"]
        # the figure measured beside the other process, left out of the judgement, is shown hollow
        assert [c.get("data-window") for c in lane.findall("circle[@class='dv']")] == ["0"]
    # pid 7240 (gpu_disturb) sat on GPU 0 from 15 to 29 s: a span over GPU 0's lanes, and over no other GPU's
    spans = first.findall("rect[@class='foreign']")
    assert {(r.get("data-pid"), r.get("data-gpu"), r.get("data-kind")) for r in spans} == {("7240", "0", "gpu")}
    gpu0 = [box(g) for g in lanes(first) if g.get("data-gpu") == "0"]
    others = [box(g) for g in lanes(first) if g.get("data-gpu") != "0"]
    for r in spans:
        top, bottom = float(r.get("y")), float(r.get("y")) + float(r.get("height"))
        assert not any(top < b and a < bottom for a, b in others)
    assert all(
        any(float(r.get("y")) <= a and b <= float(r.get("y")) + float(r.get("height")) for r in spans) for a, b in gpu0
    )
    # The windows measured again: every GPU's two windows and NCCL's, none disturbed, each under its limit line.
    measured = {(lane.get("data-gpu"), lane.get("data-metric")): lane for lane in lanes(again)}
    assert set(measured) == {(str(i), m) for i in gpus for m in ("matmul_tflops", "hbm_gbps")} | {("all", "busbw_gbps")}
    for lane in measured.values():
        assert lane.get("data-windows") == "0 1" and lane.get("data-disturbed") == ""
        assert lane.find("line[@class='limit']") is not None
        assert len(lane.find("polyline[@class='figure']").get("points").split()) == 2
    limit = float(measured[("0", "matmul_tflops")].find("line[@class='limit']").get("data-value"))
    best = max(w["matmul_tflops"] for w in detail["remeasured"]["per_gpu"]["0"]["windows"])  # 2 windows: the best one
    assert limit == pytest.approx(best * 0.9, rel=1e-3)  # soak_slowdown_pct_max 10


def _bench_output(detail: dict, foreign: dict | None = None) -> dict:
    """A soak's output (benchmarks.soak.soak_measure.run) again from a recorded soak_slowdown detail: each window's figures as
    measured (a disturbed one's too), and what the sampler saw."""

    def measured(w: dict) -> dict:
        return {
            **{k: v for k, v in w.items() if k not in ("disturbed", "disturbed_figures")},
            **(w.get("disturbed_figures") or {}),
        }

    gpus = {rank: {**g, "windows": [measured(w) for w in g["windows"]]} for rank, g in detail["per_gpu"].items()}
    nccl = {**detail["nccl"], "windows": [measured(w) for w in detail["nccl"]["windows"]]}
    keep = ("window_s", "n_windows", "ran_s", "duration_s", "started", "method", "versions", "world_size")
    out = {"device": "cuda", "gpus": gpus, "nccl": nccl, "stopped_early": False, "after_effects": []}
    out.update({k: detail[k] for k in keep})
    if foreign:
        out["sampler"] = {"per_gpu": {"0": {"windows": [{"index": 0, "foreign_processes": [foreign]}]}}}
    return out


def test_a_disturbed_soak_as_the_judge_joins_it_is_one_timeline(soak):
    """The recorded soak judged again by benchmarks.soak.soak_judge: the windows measured again join the soak's (after a warm-up
    window), one timeline whose disturbed window is marked and whose windows measured again are too."""
    doc = host_doc(soak)
    detail = result(doc["results"], "benchmark", "soak_slowdown")["detail"]
    joined = remeasure.combined(
        _bench_output(detail, {"pid": 7240, "name": "gpu_disturb"}), _bench_output(detail["remeasured"])
    )
    res = next(r for r in checks_soak.soak(joined, doc["profile"]) if r["check"] == "soak_slowdown")
    (timeline,) = soak_data.soak_timelines([dict(res, group="benchmark")])
    matmul = next(lane for lane in timeline["lanes"] if (lane["index"], lane["metric"]) == (0, "matmul_tflops"))
    assert [(w["index"], w["disturbed"], w["remeasured"]) for w in matmul["windows"]] == [
        (0, True, False),
        (1, False, True),
    ]
    assert matmul["windows"][1]["value"] == detail["remeasured"]["per_gpu"]["0"]["windows"][1]["matmul_tflops"]
    drawn = ET.fromstring(svg_soak.soak_svg(timeline))
    lane = next(g for g in lanes(drawn) if (g.get("data-gpu"), g.get("data-metric")) == ("0", "matmul_tflops"))
    assert (lane.get("data-windows"), lane.get("data-disturbed"), lane.get("data-remeasured")) == ("0 1", "0", "1")
    assert [r.get("data-window") for r in lane.findall("rect[@class='again']")] == ["1"]


def test_a_long_soak_on_one_gpu_shows_every_window(soak_one):
    detail = result(host_doc(soak_one)["results"], "benchmark", "soak_slowdown")["detail"]
    (timeline,) = svgs(soak_one, "soak")
    windows = detail["per_gpu"]["0"]["windows"]
    assert len(windows) == 21
    for lane in lanes(timeline):
        assert lane.get("data-windows") == " ".join(str(w["index"]) for w in windows)
        assert lane.get("data-disturbed") == "" and lane.findall("rect[@class='disturbed']") == []
        assert len(lane.find("polyline[@class='figure']").get("points").split()) == 21


def test_report_md_writes_the_soak_as_a_table(soak):
    md = (soak / "report.md").read_text()
    assert "| GPU 0 | bf16 matmul (TFLOPS) | 1 |  |  |  | none | 0 | none |" in md  # disturbed: no figure judged
    assert "| pid 7240 (gpu_disturb, 1002 MiB) | GPU 0 | 15 s | 29 s | 1002 MiB |" in md
    assert re.search(r"\| all GPUs \| NCCL all_reduce \(GB/s\) \| 2 \| [\d.]+ \| 292\.7 \(window 0, at 0 s\) \|", md)


# ---------------------------------------------------------------- each GPU beside its siblings and its past


def per_gpu(doc: dict) -> dict:
    """{(metric, uuid): figure} of a host document's matmul and HBM results."""
    mm = result(doc["results"], "benchmark", "matmul_bf16")["detail"]["per_gpu"]
    hbm = result(doc["results"], "benchmark", "hbm_bandwidth")["detail"]["per_gpu"]["hbm"]
    out = {("matmul_bf16_tflops", g["uuid"]): g["bf16"] for g in mm.values()}
    out.update({("hbm_copy_gbps", g["uuid"]): g["hbm_copy_gbps"] for g in hbm.values()})
    return out


def test_each_gpu_beside_its_siblings_its_past_and_the_limits(four):
    now = per_gpu(host_doc(four))
    then = per_gpu(host_doc(four.parent / runs.FOUR_GPU_RUNS[0]))
    uuids = {u for _, u in now}
    by_index = {g["index"]: g["uuid"] for g in node(four)["results"][1]["detail"]["inventory"]["gpus"]}
    panels = {s.get("data-metric"): s for s in svgs(four, "bars")}
    assert set(panels) == {"matmul_bf16_tflops", "hbm_copy_gbps"}
    for metric, panel in panels.items():
        gpus = panel.findall("g[@class='gpu']")
        assert sorted(int(g.get("data-gpu")) for g in gpus) == [0, 1, 2, 3] and set(by_index.values()) == uuids
        for g in gpus:
            uuid = by_index[int(g.get("data-gpu"))]
            assert float(g.get("data-value")) == now[(metric, uuid)]
            assert float(g.find("path[@class='past']").get("data-value")) == then[(metric, uuid)]  # the baseline's
            assert g.find("line[@class='ref']") is not None and g.find("circle[@class='usual']") is not None
        floor = {"matmul_bf16_tflops": 700, "hbm_copy_gbps": 4000}[metric]
        assert float(panel.find("line[@class='floor']").get("data-value")) == floor
        assert panel.find("line[@class='sibling-limit']") is not None
    md = (four / "report.md").read_text()
    assert "### bf16 matmul per GPU (TFLOPS)" in md and "### HBM copy per GPU (GB/s)" in md
    gpu3 = by_index[3]
    row = f"| GPU 3 | {now[('matmul_bf16_tflops', gpu3)]:,.1f} | pass |"
    assert row in md and f"| {then[('matmul_bf16_tflops', gpu3)]:,.1f} |" in md.split(row, 1)[1].splitlines()[0]


def test_one_gpu_has_its_bar_and_its_floor_and_no_sibling(one):
    (matmul, hbm) = svgs(one, "bars")
    for panel in (matmul, hbm):
        (gpu,) = panel.findall("g[@class='gpu']")
        assert gpu.get("data-gpu") == "0" and gpu.find("line[@class='ref']") is None
        assert panel.find("line[@class='floor']") is not None and panel.find("line[@class='sibling-limit']") is None
    assert svgs(one, "busbw") == []  # NCCL on one GPU: skipped, nothing to draw


# ---------------------------------------------------------------- NCCL beside the baseline


def busbw(doc: dict) -> dict:
    """{collective: {size: busbw}} of a host document's NCCL results inside the node."""
    return {
        r["check"][len("nccl_") :]: {row["size_bytes"]: row["busbw_gbps"] for row in r["detail"]["rows"]}
        for r in doc["results"]
        if r.get("group") == "benchmark" and r["check"].startswith("nccl_") and (r.get("detail") or {}).get("rows")
    }


def test_nccl_beside_the_baselines_curve(four):
    now, then = busbw(host_doc(four)), busbw(host_doc(four.parent / runs.FOUR_GPU_RUNS[0]))
    (chart,) = svgs(four, "busbw")
    assert chart.get("data-baseline-run") == runs.FOUR_GPU_RUNS[0] and chart.get("data-world-size") == "4"
    drawn = {g.get("data-line"): g for g in chart.findall("g[@class='line']")}
    assert set(drawn) == set(now)
    for coll, g in drawn.items():
        assert {int(c.get("data-size")): float(c.get("data-gbps")) for c in g.findall("circle")} == now[coll]
    for base in chart.findall("g[@class='baseline']"):
        points = {int(r.get("data-size")): float(r.get("data-gbps")) for r in base.findall("rect")}
        bands = {}  # the largest size of each band: 1 MiB, 64 MiB, the largest
        for size in now[base.get("data-line")]:
            band = 0 if size <= 1 << 20 else 1 if size <= 64 << 20 else 2
            bands[band] = max(bands.get(band, 0), size)
        assert points == {s: then[base.get("data-line")][s] for s in bands.values()}
    assert len(chart.findall("g[@class='baseline']")) == len(now)
    md = (four / "report.md").read_text()
    big = max(now["all_reduce"])
    assert f"| all_reduce | 4 GiB | {now['all_reduce'][big]:g} | {then['all_reduce'][big]:g} |" in md


# ---------------------------------------------------------------- honest axes


def test_the_bars_axis_is_broken_where_it_does_not_start_at_zero_and_no_bar_passes_its_top(four, one):
    for run in (four, one):
        for panel in svgs(run, "bars"):
            start = float(panel.get("data-axis-from"))
            grid = [float(line.get("y1")) for line in panel.findall("line[@class='grid']")]
            bars = [g.find("rect") for g in panel.findall("g[@class='gpu']")]
            assert all(float(b.get("y")) >= min(grid) for b in bars)  # every bar under the top gridline
            if start > 0:  # the break on the axis and on every bar, and where the scale starts, written
                assert panel.find("polyline[@class='axis-break']") is not None
                assert len(panel.findall("g[@class='gpu']/polyline[@class='bar-break']")) == len(bars)
                (said,) = panel.findall("text[@class='break']")
                assert (
                    f"the scale starts at {formatting.fmt_scalar(start)} " in said.text and "not at zero" in said.text
                )


# ---------------------------------------------------------------- the soak: everything it recorded


@pytest.fixture(scope="module")
def host_soak(reports) -> Path:
    return runs.host_soak(reports / "host-soak")


def test_a_soak_shows_every_window_every_foreign_process_and_what_the_sampler_saw(host_soak):
    """A soak beside a matmul on GPU 1 whose process also took the host's CPUs as it started, its windows measured
    again and joined: every window of every GPU in its figure lanes and in its temperature, power, SM clock and
    clock-event lanes; every foreign process the soak's steps recorded (on the GPU and on the host) as a span; the
    stretch no window measured as a gap the lines do not cross; a legend of swatches for what is drawn."""
    doc = host_doc(host_soak)
    slow = result(doc["results"], "benchmark", "soak_slowdown")["detail"]
    sampled = result(doc["results"], "benchmark", "soak_throttle")["detail"]["per_gpu"]
    procs = result(doc["results"], "benchmark", "soak_processes")["detail"]["attempts"]
    power = {
        g["index"]: g["power_limit_w"] for g in result(doc["results"], "gpu_health", "power_limit")["detail"]["per_gpu"]
    }
    (drawn,) = svgs(host_soak, "soak")
    for rank, g in slow["per_gpu"].items():
        want = " ".join(str(w["index"]) for w in g["windows"])
        for metric in ("matmul_tflops", "hbm_gbps"):
            (lane,) = [
                x for x in lanes(drawn) if (x.get("data-gpu"), x.get("data-metric")) == (str(g["nvml_index"]), metric)
            ]
            assert lane.get("data-windows") == want
    for index, g in sampled.items():
        tel = {x.get("data-metric"): x for x in drawn.findall("g[@class='telemetry']") if x.get("data-gpu") == index}
        assert set(tel) == {"temperature_max_c", "power_median_w", "sm_clock_median_mhz"}
        for field, lane in tel.items():
            values = {
                int(r.get("data-window")): float(r.get("data-value")) for r in lane.findall("rect[@class='tel-hit']")
            }
            assert values == {w["index"]: w[field] for w in g["windows"]}, field
        assert float(tel["power_median_w"].find("line[@class='limit']").get("data-value")) == power[int(index)]
        (reasons,) = [x for x in drawn.findall("g[@class='reasons']") if x.get("data-gpu") == index]
        marked = {int(r.get("data-window")): r.get("data-reasons") for r in reasons.findall("rect")}
        assert marked == {w["index"]: " ".join(w["reasons"]) for w in g["windows"]}
    # Every foreign process of every attempt, with its kind: the GPU's over GPU 1's lanes, the host's over all.
    seen = {(str(p["pid"]), "host_cpu" if p.get("kind") == "host_cpu" else "gpu") for a in procs for p in a["foreign"]}
    spans = drawn.findall("rect[@class='foreign']") + drawn.findall("rect[@class='foreign-host']")
    assert {(r.get("data-pid"), r.get("data-kind")) for r in spans} == seen == {("3741", "gpu"), ("3741", "host_cpu")}
    (host,) = drawn.findall("rect[@class='foreign-host']")
    tops = [box(x) for x in lanes(drawn)]
    assert float(host.get("y")) <= min(a for a, _ in tops) and float(host.get("y")) + float(host.get("height")) >= max(
        b for _, b in tops
    )
    # Nothing measured from the soak's end to the first window measured again: a gap, and no line across it.
    (gap,) = drawn.findall("rect[@class='gap']")
    assert float(gap.get("data-from")) == pytest.approx(90.0, abs=0.5) and float(gap.get("data-to")) == pytest.approx(
        126.7
    )
    for lane in lanes(drawn):
        assert all(len(p.get("points").split()) <= 2 for p in lane.findall("polyline[@class='figure']"))
    legend = {g.get("data-legend") for g in drawn.findall("g[@class='legend']/g")}
    assert {"figure", "disturbed", "again", "foreign", "foreign-host", "gap", "reason", "limit"} <= legend
    md = (host_soak / "report.md").read_text()
    for index, g in sampled.items():  # report.md: every window of every GPU, with what the sampler saw
        for w in g["windows"]:
            row = rf"\| {w['index']} \| {w['start_s']:g} s \| GPU {index} \| .*\| {w['temperature_max_c']} \| "
            assert re.search(row, md), w
    assert "| pid 3741 (gpu_disturb, 1002 MiB) | GPU 1 |" in md and "| host CPUs |" in md
    assert "sw_power_cap 82 s of 90.4 s" in md


def test_a_power_capped_soak_shows_its_clock_event_reason_in_every_window(soak_one):
    """The 21-window soak whose clocks the power cap held all along: sw_power_cap in every window, and its seconds."""
    (drawn,) = svgs(soak_one, "soak")
    (reasons,) = drawn.findall("g[@class='reasons']")
    assert [r.get("data-reasons") for r in reasons.findall("rect")] == ["sw_power_cap"] * 21
    md = (soak_one / "report.md").read_text()
    assert len(re.findall(r"^\| \d+ \| [\d.]+ s \| GPU 0 \| [\d.]+ \| [\d,.]+ \|  \| \d+ \|", md, re.M)) == 21
    throttle = result(host_doc(soak_one)["results"], "benchmark", "soak_throttle")["detail"]
    seconds = throttle["per_gpu"]["0"]["throttle"]["sw_power_cap"]["seconds"]
    assert f"GPU 0: sw_power_cap {seconds:g} s of {throttle['ran_s']:g} s." in md
