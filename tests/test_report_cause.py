"""What a person reads in 30 seconds: each node's cause in one sentence (the figure, how far from what, which GPU and
serial or which process), its recommended action, the component a drain names, every figure past a limit whatever its
kind, skipped checks folded, and a look for every status. Over the recorded runs of tests/report_runs.py (a confirmed
hardware failure, an environment failure, four GPUs, a disturbed soak) and a fleet of 60 synthetic nodes whose
figures the node's own judge judged; the browser's side (first screen, widths) is tests/test_report_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import report_runs as runs
import test_fleet_synthetic as synth
from gpufleet import report
from gpufleet.base import calibration, schema
from gpufleet.fleet import component, remediation
from gpufleet.report import cause, formatting, html_style, svg


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def hardware(reports) -> Path:
    return runs.hardware_failure(reports / "hardware")


@pytest.fixture(scope="module")
def environment(reports) -> Path:
    return runs.environment_failure(reports / "environment")


@pytest.fixture(scope="module")
def fleet(reports) -> Path:
    return runs.fleet(reports / "fleet", 60)


def node(run: Path, host: str = "localhost") -> dict:
    return runs.report_json(run)["nodes"][host]


def top_of(run: Path) -> str:
    """report.html before its first section: the node table, the fleet, the software."""
    html = (run / "report.html").read_text()
    return html[: html.index("<h2>Fleet</h2>")]


def serial_of(n: dict, index: int) -> str:
    gpus = next(r for r in n["results"] if r["check"] == "gpu_count")["detail"]["inventory"]["gpus"]
    return next(g["serial"] for g in gpus if g["index"] == index)


def test_a_confirmed_hardware_failure_says_its_host_figures_first(hardware):
    """c2's node failed on the data loader and the host memory triad, its GPUs within their limits: the top table
    says so, with how far, against what, the limit, the trust and what to do."""
    n = node(hardware)
    said = cause.cause(n)
    assert said["text"].startswith(
        "host data loader 135,300,000 tokens/s/GPU, 32.5% below the baseline run's 200,600,000 (limit 15%)"
    )
    assert (said["class"], said["trust"], said["action"]) == ("hardware", "confirmed (measured twice)", "reboot")
    lines = [cause.figure_line(f) for f in cause.failing_figures(n)]
    assert lines == [
        "host data loader 135,300,000 tokens/s/GPU, 32.5% below the baseline run's 200,600,000 (limit 15%)",
        "host memory triad, slowest NUMA node 93.48 GB/s, 20.8% below the baseline run's 118.0 (limit 15%)",
    ]
    top = top_of(hardware)
    assert all(line.replace("'", "&#x27;") in top for line in lines)  # both, in the node table
    assert 'class="badge a-reboot"' in top
    assert component.component_of(n) == "host data loader"
    review = runs.report_json(hardware)["fleet"]["drain_review"][0]
    assert review["components"] == ["host data loader", "host data loader"]
    md = (hardware / "report.md").read_text()
    assert re.search(r"\| localhost \| \*\*FAIL\*\* \|.*\| host data loader 135,300,000 .*; action: reboot", md)


def test_an_environment_failure_names_the_processes_and_asks_for_a_re_test(environment):
    n = node(environment)
    said = cause.cause(n)
    assert said["text"].startswith("10 processes cpu_disturb of user gpufleet-neighbour (pids 5369, 5370, ")
    assert said["text"].endswith("on the host from 05:27:04Z to 05:27:12Z (attempt 1), while matmul measured")
    assert (said["class"], said["action"]) == ("environment", remediation.RETEST)
    assert component.component_of(n) == "host 10 processes cpu_disturb of user gpufleet-neighbour"


def test_the_demo_names_each_gpu_by_its_serial_and_each_action(fleet):
    slow, ecc, once = node(fleet, runs.SLOW_GPU), node(fleet, runs.ECC), node(fleet, runs.UNCONFIRMED)
    said = cause.cause(slow)
    assert said["text"].startswith(f"GPU 3 SN {serial_of(slow, 3)}: bf16 matmul 659.3 TFLOPS, under its minimum 700")
    assert said["action"] == remediation.RESET and said["trust"] == "confirmed (measured twice)"
    assert any(
        f"GPU 3 SN {serial_of(slow, 3)}: bf16 matmul 659.3 TFLOPS, 19.7% below its siblings'" in cause.figure_line(f)
        for f in cause.failing_figures(slow)
    )
    assert cause.cause(ecc)["text"] == f"GPU 2 SN {serial_of(ecc, 2)}: 2 volatile uncorrectable ECC errors"
    assert component.component_of(ecc) == f"GPU 2 SN {serial_of(ecc, 2)}"
    assert cause.cause(once)["action"] == remediation.RETEST  # a figure measured once is not acted on
    assert component.component_of(node(fleet, runs.SLOW_HBM)) == "8 GPUs (0, 1, 2, 3, 4, 5, 6, 7)"


def _res(status: str, check: str = "x", group: str = "gpu_health", **fields) -> dict:
    return dict(schema.result(check, status, "r", **fields), group=group)


def test_one_recommended_action_per_finding():
    """none, re-test, reset, reboot or RMA: by status, confirmation, class and the profile's ladder."""
    act = lambda res, profile=None: remediation.recommended(res, profile)["action"]  # noqa: E731
    gpu = {"flagged_gpus": [{"index": 3, "uuid": "GPU-x", "serial": "1"}]}
    assert act(_res("pass")) == act(_res("skip")) == act(_res("warn")) == act(_res("info")) == remediation.NONE
    assert act(_res("info", trust=schema.INCONCLUSIVE, value=1.0)) == remediation.RETEST
    assert act(_res("fail", group="benchmark", trust=schema.CLEAN, value=1.0, detail=gpu)) == remediation.RETEST
    assert act(_res("fail", failure_class="environment")) == remediation.RETEST
    assert act(_res("fail", failure_class="configuration")) == remediation.RETEST
    assert act(_res("fail", "ecc", detail=gpu), "h100-sxm") == remediation.RESET  # a GPU named: reset it
    assert act(_res("fail", "ecc"), "h100-sxm") == remediation.REBOOT  # no GPU to reset
    assert act(_res("fail", "gpu_count", group="gpu_inventory", detail=gpu)) == remediation.REBOOT  # its own ladder
    assert act(_res("fail", group="benchmark", trust=schema.CONFIRMED, value=1.0, failure_class="hardware")) == (
        remediation.REBOOT
    )
    assert set(remediation.THEIRS) == set(remediation.ACTIONS)


def test_skipped_checks_are_folded_and_counted_and_inconclusive_has_its_look(fleet):
    html = (fleet / "report.html").read_text()
    section = re.split(rf'<section id="node-\d+-{runs.SLOW_GPU}">', html)[1].split("</section>")[0]
    n = node(fleet, runs.SLOW_GPU)
    assert f"<details><summary>{n['counts']['skip']} skipped: not applicable on this node</summary>" in section
    findings = section.split('<table class="results">')[1].split("</tbody></table>")[0]
    assert "b-skip" not in findings  # none of them before the findings
    unsure = [r for r in n["results"] if cause.shown_status(r) == cause.INCONCLUSIVE]
    assert unsure and all(f"<code>{formatting.check_id(r)}</code>" in findings for r in unsure)
    assert (
        '<tr class="s-inconclusive"><td class="check"><span class="badge b-inconclusive">INCONCLUSIVE</span>'
        in findings
    )
    for status in (*schema.STATUSES, cause.INCONCLUSIVE):  # every status a look of its own, everywhere
        for rule in (f".b-{status}{{", f"tr.s-{status}>td{{", f"svg .bar.s-{status}{{", f"td.fv.s-{status}{{"):
            assert rule in html_style.CSS, rule
    assert len({c for c, _ in html_style.STATUS_COLOURS.values()}) == len(html_style.STATUS_COLOURS)


def test_a_figure_under_its_floor_is_never_drawn_or_listed_as_a_pass(fleet):
    panel = {
        "metric": "matmul_bf16_tflops",
        "label": "bf16 matmul",
        "unit": "TFLOPS",
        "sibling_limit": None,
        "sibling_limit_pct": None,
        "floor": 700.0,
        "floor_key": "matmul_bf16_tflops_min",
        "gpus": [
            {"gpu": f"GPU {i}", "index": i, "uuid": None, "value": v, "status": "pass", "reference": None,
             "deviation_pct": None, "usual": None, "baseline": None}
            for i, v in enumerate((820.0, 659.3))
        ],
    }  # fmt: skip
    drawn = svg.bars_svg(panel)
    assert drawn.count('class="bar s-fail under-floor"') == 1 and drawn.count('class="bar s-pass"') == 1
    # A document whose result passed a figure under its own floor (as the demo's did before its figures were
    # judged): the report says so beside the figure, in both renderings.
    docs = {f"u{i}": synth.node_doc(f"u{i}", i, factors={("matmul_bf16_tflops", 3): 0.8} if i == 1 else None)
            for i in range(3)}  # fmt: skip
    run = synth.write_run(fleet.parent / "unjudged", "unjudged", docs)
    report.build(run, use_store=False)
    row = (run / "report.html").read_text().split('<td class="check"><code>benchmark.matmul_bf16</code></td>')[2]
    assert row.split("</tr>")[0].count('<div class="past">under its minimum 700</div>') == 1
    assert "(under its minimum 700)" in (run / "report.md").read_text()
    for host, n in runs.report_json(fleet)["nodes"].items():
        for res in n["results"]:
            floor = (res.get("threshold") or {}).get("min") if isinstance(res.get("threshold"), dict) else None
            if res["status"] == schema.PASS and isinstance(floor, (int, float)) and isinstance(res.get("value"), float):
                assert res["value"] >= floor, (host, res["check"])


def test_a_gpu_inventory_table_for_the_rma_desk(hardware):
    n = node(hardware)
    gpus = next(r for r in n["results"] if r["check"] == "gpu_count")["detail"]["inventory"]["gpus"]
    html = (hardware / "report.html").read_text()
    table = html.split('<table class="gpus">')[1].split("</table>")[0]
    ecc = {g["index"]: g for g in next(r for r in n["results"] if r["check"] == "ecc")["detail"]["per_gpu"]}
    rows = {
        g["index"]: g["remapped_rows"]
        for g in next(r for r in n["results"] if r["check"] == "row_remapping")["detail"]["per_gpu"]
    }
    for g, rom in zip(gpus, n["versions"]["inforom_image"]):
        row = table.split(f'<tr data-gpu="{g["index"]}">')[1].split("</tr>")[0]
        e, remapped = ecc[g["index"]], rows[g["index"]]
        counts = (
            f"{e['ecc_volatile_corrected']} / {e['ecc_volatile_uncorrected']}; "
            f"{e['ecc_aggregate_corrected']} / {e['ecc_aggregate_uncorrected']}"
        )
        for text in (f"SN {g['serial']}", g["pci_bus_id"], g["uuid"], g["vbios"], rom, counts):
            assert text in row, (text, row)
        assert f"{remapped['correctable']} / {remapped['uncorrectable']}; none pending or failed" in row
    # c2's GPU 0 had corrected four ECC errors and remapped one row in its life: the desk sees it here
    assert "0 / 0; 4 / 0" in table and "1 / 0; none pending or failed" in table
    md = (hardware / "report.md").read_text()
    assert "### GPUs" in md and all(
        f"| {g['index']} | {g['uuid']} | {g['serial']} | {g['pci_bus_id']} |" in md for g in gpus
    )


def test_words_that_do_not_contradict(reports, fleet):
    """The 4-GPU run: the limit that decided says calibrated, and its reason no longer calls the model uncalibrated;
    the fleet's note says its `no store` once."""
    four = runs.four_gpus(reports / "four")
    res = next(r for r in node(four)["results"] if r["check"] == "node_vs_baseline")
    assert formatting.decided_limit(res)["calibrated"] is True
    assert calibration.UNCALIBRATED not in res["reason"]
    assert re.search(
        r"within 2% to 18\.5% \(per metric; calibrated for \d+ of \d+ metrics, the generic limit", res["reason"]
    )
    note = formatting.fleet_note(runs.report_json(fleet))
    assert note.count("no store") == 1 and "against this run's fleet median and no baseline;" in note
