"""Benchmark results in the reports: value against threshold, and NCCL busbw as an inline SVG chart.

The host documents are shaped like the benchmark module's: figures of the
size a GPU node gives (1 MiB .. 4 GiB), built here so the tests do not need a GPU.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpufleet import report
from gpufleet.base import schema
from gpufleet.report import formatting, svg

MiB, GiB = 1 << 20, 1 << 30
SOURCE = "about 795 TFLOPS is the best bf16 matmul reached on H100 SXM"


def _stamp(res: dict, group: str = "benchmark") -> dict:
    return dict(res, group=group, started="2026-11-21T21:00:00Z", seconds=1.0)


def nccl_result(name: str, busbw: dict, world: int, nnodes: int, status=schema.PASS, **detail) -> dict:
    rows = [{"size_bytes": s, "iters": 20, "busbw_gbps": b, "algbw_gbps": b, "correct": True} for s, b in busbw.items()]
    top = rows[-1]["busbw_gbps"]
    return schema.result(
        f"nccl_{name}",
        status,
        f"{name} busbw {top} GB/s",
        value=top,
        unit="GB/s",
        detail={"rows": rows, "world_size": world, "nnodes": nnodes, "backend": "nccl", **detail},
    )


SIZES = [MiB << i for i in range(0, 13, 2)]  # 1 MiB .. 4 GiB
# An all-reduce-like curve: latency-bound at small sizes, near 370 GB/s at the largest.
CURVE = {s: round(40 + 330 * (1 - 1 / (1 + s / (64 * MiB))), 1) for s in SIZES}


def gpu_node_results() -> list[dict]:
    curve = CURVE
    results = [
        _stamp(
            schema.result(
                "matmul_bf16",
                schema.PASS,
                "slowest GPU bf16 matmul 779.2 TFLOPS (minimum 700)",
                value=779.2,
                unit="TFLOPS",
                threshold={"key": "matmul_bf16_tflops_min", "value": 700, "source": SOURCE, "min": 700},
            )
        ),
        _stamp(
            schema.result(
                "hbm_bandwidth",
                schema.FAIL,
                "slowest GPU HBM copy 2100 GB/s is under the minimum 2600 GB/s",
                value=2100.0,
                unit="GB/s",
                remedy="compare GPUs in detail",
                threshold={"key": "hbm_copy_gbps_min", "value": 2600, "source": "H100 SXM HBM3", "min": 2600},
            )
        ),
    ]
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        results.append(_stamp(nccl_result(name, curve, 8, 1)))
    # A row that failed has no busbw: it is left out of the curve, not drawn at zero.
    results[-1]["detail"]["rows"].append({"size_bytes": 8 * GiB, "error": "out of memory", "correct": False})
    across = {s: round(b / 8, 1) for s, b in curve.items()}
    results.append(_stamp(nccl_result("all_reduce", across, 16, 2), group="benchmark_multinode"))
    results.append(
        _stamp(
            schema.result("nccl_transport", schema.PASS, "InfiniBand with GPUDirect RDMA", value="ib_gdr"),
            group="benchmark_multinode",
        )
    )
    return results


@pytest.fixture
def built(tmp_path) -> Path:
    run = tmp_path / "run-bench"
    (run / "hosts").mkdir(parents=True)
    doc = {
        "schema_version": 1,
        "host": "node1<b>",
        "engine_version": "0.1.0",
        "profile": {"name": "h100-sxm"},
        "versions": {},
        "started": "2026-11-21T21:00:00Z",
        "seconds": 60.0,
        "results": gpu_node_results(),
    }
    (run / "hosts" / "node1.json").write_text(json.dumps(doc))
    report.build(run)
    return run


def test_busbw_series_one_chart_per_run_and_only_measured_rows():
    charts = formatting.busbw_series(gpu_node_results())
    assert [(c["group"], c["world_size"], c["nnodes"]) for c in charts] == [
        ("benchmark", 8, 1),
        ("benchmark_multinode", 16, 2),
    ]
    inside, across = charts
    assert [line["label"] for line in inside["lines"]] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    assert [p[0] for p in inside["lines"][-1]["points"]] == SIZES  # no 8 GiB point
    assert "8 ranks in one node" in inside["title"] and "16 ranks over 2 nodes" in across["title"]
    assert (
        formatting.busbw_series([_stamp(schema.result("nccl", schema.FAIL, "timed out", detail={"log_tail": "x"}))])
        == []
    )


@pytest.mark.parametrize(
    "size, text", [(4096, "4 KiB"), (MiB, "1 MiB"), (256 * MiB, "256 MiB"), (4 * GiB, "4 GiB"), (512, "512 B")]
)
def test_sizes_are_written_in_binary_units(size, text):
    assert schema.size_text(size) == text


def test_html_draws_busbw_against_log2_size(built):
    page = (built / "report.html").read_text()
    svgs = re.findall(r'<svg class="chart busbw".*?</svg>', page, re.S)
    assert len(svgs) == 2
    inside = svgs[0]
    assert inside.count("<polyline") == 4
    # x labels every 4x (7 sizes over 12 doublings, at most about 8 labels), MiB and GiB
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', inside)
    assert labels[:7] == ["1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB", "1 GiB", "4 GiB"]
    assert "busbw (GB/s)" in inside and "message size (log2 scale)" in inside
    # log2 x: equal steps in size ratio are equal steps on screen
    first = re.search(r'<polyline[^>]*points="([^"]+)"', inside).group(1).split()
    xs = [float(p.split(",")[0]) for p in first]
    steps = [b - a for a, b in zip(xs, xs[1:])]
    assert max(steps) - min(steps) < 0.2, steps
    # busbw up: the larger the message, the higher the point (smaller y on screen)
    ys = [float(p.split(",")[1]) for p in first]
    assert ys == sorted(ys, reverse=True)
    assert "<title>all_reduce, 4 GiB: " in inside  # tooltip per point, no script
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|https?:", page, re.I)


def test_benchmark_values_read_against_their_thresholds(built):
    page = (built / "report.html").read_text()
    row = page.split("<code>benchmark.hbm_bandwidth</code></div>")[-1].split("</tr>")[0]  # the findings table
    assert "2,100 GB/s" in row and "hbm_copy_gbps_min = 2600, not calibrated" in row and "source: H100 SXM HBM3" in row
    passed = page.split('<td class="check"><code>benchmark.matmul_bf16</code></td>')[-1].split("</tr>")[
        0
    ]  # the passes table
    assert (
        "779.2 TFLOPS" in passed
        and "matmul_bf16_tflops_min = 700, not calibrated" in passed
        and f"source: {SOURCE}" in passed
    )

    md = (built / "report.md").read_text()
    hbm = md.split("FAIL `benchmark.hbm_bandwidth`")[1].split("####")[0]
    assert "- value: 2,100 GB/s" in hbm
    assert "- limit: hbm_copy_gbps_min = 2600, not calibrated (source: H100 SXM HBM3)" in hbm
    assert (
        "| `benchmark.matmul_bf16` | 779.2 TFLOPS | not recorded | matmul_bf16_tflops_min = 700, not calibrated | slowest GPU bf16 matmul"
        in md
    )


def test_md_tabulates_busbw_per_size_and_collective(built):
    md = (built / "report.md").read_text()
    table = md.split("### NCCL bus bandwidth (GB/s)")[1]
    assert "| size | all_reduce | all_gather | reduce_scatter | all_to_all |" in table
    top = f"{CURVE[4 * GiB]:g}"
    assert f"| 4 GiB | {top} | {top} | {top} | {top} |" in table, table
    assert f"| 1 MiB | {CURVE[MiB]:g} |" in table
    assert "benchmark_multinode: bus bandwidth, 16 ranks over 2 nodes (nccl):" in table


def test_chart_labels_are_escaped():
    res = _stamp(nccl_result("x<script>", {MiB: 1.0, 4 * MiB: 2.0}, 2, 1))
    chart = svg.busbw_svg(formatting.busbw_series([res])[0])
    assert "<script" not in chart and "x&lt;script&gt;" in chart


def test_no_chart_without_rows(tmp_path):
    run = tmp_path / "run"
    (run / "hosts").mkdir(parents=True)
    doc = {"schema_version": 1, "host": "n", "results": [_stamp(schema.result("gpu_count", schema.PASS, "8 GPUs"))]}
    (run / "hosts" / "n.json").write_text(json.dumps(doc))
    report.build(run)
    assert "<svg" not in (run / "report.html").read_text()
    assert "NCCL bus bandwidth" not in (run / "report.md").read_text()


def test_a_second_threshold_inside_the_first_reads_as_key_and_value():
    shown, source = formatting.threshold_text(
        {
            "key": "ib_ports_min",
            "value": 8,
            "source": "site fact",
            "ib_rate_min_gbps": {"key": "ib_rate_min_gbps", "value": 400, "source": "NDR"},
        }
    )
    assert shown == "ib_ports_min = 8; ib_rate_min_gbps = 400" and source == "site fact; NDR"


def _build_one(tmp_path, results: list[dict]) -> Path:
    run = tmp_path / "run"
    (run / "hosts").mkdir(parents=True)
    doc = {"schema_version": 1, "host": "node1", "profile": {"name": "h100-sxm"}, "results": results}
    (run / "hosts" / "node1.json").write_text(json.dumps(doc))
    report.build(run, use_store=False)
    return run


def trusted_results() -> list[dict]:
    """Benchmark figures as the watched steps leave them: each with its trust, each not passing with its class."""
    thr = {"key": "matmul_bf16_tflops_min", "value": 700, "source": SOURCE, "min": 700}
    figures = (
        schema.result(
            "matmul_bf16",
            schema.PASS,
            "slowest GPU 779.2 TFLOPS",
            value=779.2,
            unit="TFLOPS",
            threshold=thr,
            trust=schema.CONFIRMED,
        ),
        schema.result(
            "hbm_bandwidth",
            schema.FAIL,
            "slowest GPU HBM copy 2100 GB/s",
            value=2100.0,
            unit="GB/s",
            trust=schema.CLEAN,
        ),
        schema.result(
            "pcie_h2d_bandwidth",
            schema.WARN,
            "samples dropped twice",
            value=20.5,
            unit="GB/s",
            trust=schema.INCONCLUSIVE,
            remedy="run the node's benchmarks again on an idle node",
        ),
        schema.result(
            "soak",
            schema.ERROR,
            "disturbed by pid 4242 (python, 9000 MiB)",
            trust=schema.DISTURBED,
            failure_class="environment",
        ),
    )
    count = schema.result("gpu_count", schema.PASS, "8 GPUs found", value=8, unit="GPUs")
    return [_stamp(count, "gpu_inventory")] + [_stamp(r) for r in figures]


def test_trust_beside_each_figure_and_class_beside_each_failing_check(tmp_path):
    run = _build_one(tmp_path, trusted_results())
    md = (run / "report.md").read_text()
    assert "| `benchmark.matmul_bf16` | 779.2 TFLOPS | confirmed | matmul_bf16_tflops_min" in md
    assert "| `gpu_inventory.gpu_count` | 8 GPUs |  |" in md  # no performance figure: no trust
    hbm = md.split("FAIL `benchmark.hbm_bandwidth`")[1].split("####")[0]
    assert "- class: hardware" in hbm and "- value: 2,100 GB/s (trust: clean)" in hbm
    h2d = md.split("WARN `benchmark.pcie_h2d_bandwidth`")[1].split("####")[0]
    assert "- class: hardware" in h2d and "- value: 20.5 GB/s (trust: inconclusive)" in h2d
    soak = md.split("ERROR `benchmark.soak`")[1].split("####")[0]
    assert "- class: environment" in soak and "- trust: disturbed" in soak and "- value" not in soak

    page = (run / "report.html").read_text()
    trusted = '<div class="src">trust: {}</div>'.format
    assert f"hardware<div><code>benchmark.hbm_bandwidth</code></div></td><td>2,100 GB/s{trusted('clean')}" in page
    assert f"environment<div><code>benchmark.soak</code></div></td><td>{trusted('disturbed')}</td>" in page
    assert (
        f'<td class="check"><code>benchmark.matmul_bf16</code></td><td>779.2 TFLOPS{trusted("confirmed")}</td>' in page
    )

    node = json.loads((run / "report.json").read_text())["nodes"]["node1"]
    assert {f["check"]: f["trust"] for f in node["figures"]} == {
        "benchmark.matmul_bf16": "confirmed",
        "benchmark.hbm_bandwidth": "clean",
        "benchmark.pcie_h2d_bandwidth": "inconclusive",
        "benchmark.soak": "disturbed",
    }
    assert {f["check"]: f["class"] for f in node["not_passing"]} == {
        "benchmark.hbm_bandwidth": "hardware",
        "benchmark.pcie_h2d_bandwidth": "hardware",
        "benchmark.soak": "environment",
    }

    root = ET.parse(run / "junit.xml").getroot()
    failure = root.find(".//testcase[@name='benchmark.hbm_bandwidth']/failure")
    assert failure.get("type") == "hardware" and "value: 2,100 GB/s (trust: clean)" in failure.text
    error = root.find(".//testcase[@name='benchmark.soak']/error")
    assert error.get("type") == "environment" and "trust: disturbed" in error.text


def test_an_older_document_gets_its_class_from_the_check_and_trust_not_recorded(tmp_path):
    """A document made before results carried `class` and `trust`: the class is the check's default
    (failure_class.of), a benchmark figure's trust reads "not recorded"."""
    older = [{k: v for k, v in r.items() if k not in ("class", "trust")} for r in trusted_results()]
    run = _build_one(tmp_path, older)
    md = (run / "report.md").read_text()
    assert "| `benchmark.matmul_bf16` | 779.2 TFLOPS | not recorded |" in md
    hbm = md.split("FAIL `benchmark.hbm_bandwidth`")[1].split("####")[0]
    assert "- class: hardware" in hbm and "- value: 2,100 GB/s (trust: not recorded)" in hbm
    soak = md.split("ERROR `benchmark.soak`")[1].split("####")[0]
    assert "- class: software" in soak and "- trust" not in soak  # an error of soak is software by default; no figure
    page = (run / "report.html").read_text()
    unknown = '<div class="src">trust: not recorded</div>'
    assert f"hardware<div><code>benchmark.hbm_bandwidth</code></div></td><td>2,100 GB/s{unknown}</td>" in page
    assert f'<td class="check"><code>benchmark.matmul_bf16</code></td><td>779.2 TFLOPS{unknown}</td>' in page
    assert json.loads((run / "hosts" / "node1.json").read_text())["results"] == older  # the document stays as it was
