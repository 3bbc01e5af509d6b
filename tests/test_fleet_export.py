"""gpufleet.fleet.export: the Prometheus textfile of each node, read back with prometheus_client's own parser,
and the Slurm drain lines."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet import report
from gpufleet.base.errors import InputError
from gpufleet.fleet import export

from test_fleet_synthetic import ecc_failure, gpus_of, measured_twice, node_doc, write_run

R = ("2026-11-21T10:00:00Z", "2026-11-21T10:15:00Z")


def _samples(path) -> dict:
    """{(name, frozenset(labels)): value} of a textfile, through prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _find(samples: dict, name: str, **labels) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, len(hits))
    return hits[0]


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    gpus = gpus_of(1)
    docs = {
        "n0": node_doc("n0", 0, read_at=R),
        "n1": node_doc(
            "n1",
            1,
            read_at=R,
            factors={("matmul_bf16_tflops", 3): 0.8},
            after={5: {"nvlink_crc_data": 40}},
            extra=[ecc_failure(gpus[2])],
        ),
        "n2": node_doc("n2", 2, read_at=R),
    }
    run = write_run(reports, "r1", docs)
    measured_twice(run, docs)  # n1's slow GPU 3 past its siblings twice on the node: it stands
    summary = report.build(run)
    return {"run": run, "summary": summary, "gpus": gpus}


def test_every_node_gets_a_textfile_that_parses(fleet_run):
    prom = fleet_run["run"] / "prometheus"
    assert sorted(p.name for p in prom.iterdir()) == ["n0.prom", "n1.prom", "n2.prom"]  # no temporary file left
    assert fleet_run["summary"]["prometheus"]["n1"] == str(prom / "n1.prom")
    n0, n1 = _samples(prom / "n0.prom"), _samples(prom / "n1.prom")
    assert _find(n0, "gpufleet_node_accepted", node="n0") == 1 and _find(n1, "gpufleet_node_accepted", node="n1") == 0
    assert _find(n1, "gpufleet_node_verdict", node="n1", verdict="fail") == 1
    assert _find(n1, "gpufleet_check_severity", node="n1", check="gpu_health.ecc") == 3
    assert _find(n1, "gpufleet_check_severity", node="n1", check="fleet.gpu_vs_node") == 3  # 20% under: fails
    assert _find(n1, "gpufleet_run_info", node="n1", run_id="r1") == 1


def test_metrics_and_outlier_scores_are_labelled_by_gpu_uuid_and_check(fleet_run):
    n1 = _samples(fleet_run["run"] / "prometheus" / "n1.prom")
    gpu3 = fleet_run["gpus"][3]
    bf16 = _find(n1, "gpufleet_matmul_flops", node="n1", gpu="3", uuid=gpu3["uuid"], dtype="bf16")
    assert 650e12 < bf16 < 680e12  # the recorded 825 TFLOPS, at 80%, in FLOP/s
    assert _find(n1, "gpufleet_hbm_copy_bytes_per_second", node="n1", gpu="0") > 2900e9
    assert _find(n1, "gpufleet_pcie_copy_bytes_per_second", node="n1", gpu="7", direction="d2h") > 50e9
    assert (
        _find(
            n1,
            "gpufleet_nccl_busbw_bytes_per_second",
            node="n1",
            scope="node",
            collective="all_reduce",
            band="gt_64MiB",
        )
        == 346.5e9
    )
    dev = _find(
        n1,
        "gpufleet_fleet_deviation_ratio",
        node="n1",
        gpu="3",
        uuid=gpu3["uuid"],
        check="fleet.gpu_vs_node",
        metric="matmul_bf16_tflops",
    )
    assert -0.21 < dev < -0.19
    assert (
        _find(n1, "gpufleet_fleet_robust_z", node="n1", gpu="3", check="fleet.gpu_vs_node", metric="matmul_bf16_tflops")
        < -3
    )
    assert _find(n1, "gpufleet_sample_spread_ratio", node="n1", gpu="0", metric="hbm_copy_gbps") == pytest.approx(0.02)
    assert _find(n1, "gpufleet_gpu_counter", node="n1", gpu="5", counter="nvlink_crc_data") == 40
    assert _find(
        n1, "gpufleet_gpu_counter_growth_per_second", node="n1", gpu="5", counter="nvlink_crc_data", window="run"
    ) == pytest.approx(160 / 3600)
    # Per-GPU figures carry no node-level duplicate (the slowest GPU is min() over them).
    assert not [k for k in n1 if k[0] == "gpufleet_matmul_flops" and ("gpu", "") in k[1]]


# Units Prometheus' naming guide replaces by base units (bytes, seconds, ratios), and prefixes of scaled units.
_NOT_BASE = re.compile(
    r"_(k|m|g|t)?bps\b|_(g|t|p)flops|_pct|_percent|_per_(hour|minute|day)|_(milli|micro|kilo|mega|giga|tera)"
    r"|_(kib|mib|gib|kb|mb|gb|ms|us|ns|hours?|minutes?)(_|$)"
)
# Words that must end a name when they are its unit.
_UNIT_ENDINGS = {
    "bytes": ("_bytes", "_bytes_per_second"),
    "seconds": ("_seconds",),
    "second": ("_per_second", "_per_second_per_gpu"),
    "flops": ("_flops",),
    "ratio": ("_ratio",),
}


def _families(run) -> dict:
    out = {}
    for path in sorted((run / "prometheus").iterdir()):
        for family in text_string_to_metric_families(path.read_text()):
            out[family.name] = family
    return out


def test_every_name_follows_the_naming_convention(fleet_run):
    families = _families(fleet_run["run"])
    assert len(families) >= 15
    for name, family in families.items():
        assert re.fullmatch(r"gpufleet_[a-z][a-z0-9_]*[a-z0-9]", name) and "__" not in name, name
        assert not _NOT_BASE.search(name), f"{name}: not in base units"
        for word, endings in _UNIT_ENDINGS.items():
            if re.search(rf"(^|_){word}(_|$)", name):
                assert name.endswith(endings), f"{name}: the unit {word} must end the name ({endings})"
        assert not name.endswith(("_total", "_count", "_sum", "_bucket", "_created")), (
            name
        )  # counter/histogram suffixes
        assert family.type == "gauge" and family.documentation.strip(), name
        if name.endswith("_info"):
            assert {s.value for s in family.samples} == {1}
        assert ("fraction" in family.documentation) == name.endswith("_ratio"), f"{name}: {family.documentation}"


def test_the_reports_guide_lists_every_series(fleet_run):
    readme = (Path(__file__).resolve().parents[1] / "docs" / "reports.md").read_text()
    table = set(re.findall(r"^\| `(gpufleet_[a-z0-9_]+)\{", readme, re.M))
    documented = set(re.findall(r"\b(gpufleet_[a-z0-9_]+)\{", export.__doc__))
    assert table == documented
    assert set(_families(fleet_run["run"])) <= table
    promql = re.findall(r"```promql\n(.*?)```", readme, re.S)
    assert promql and set(re.findall(r"\bgpufleet_[a-z0-9_]+", "".join(promql))) <= table


def test_the_docs_table_names_every_label_of_each_series(fleet_run):
    page = (Path(__file__).resolve().parents[1] / "docs" / "reports.md").read_text()
    table = {
        name: set(labels.split(","))
        for name, labels in re.findall(r"^\| `(gpufleet_[a-z0-9_]+)\{([a-z_,]+)\}`", page, re.M)
    }
    documented = {
        name: set(labels.split(","))
        for name, labels in re.findall(r"\b(gpufleet_[a-z0-9_]+)\{([a-z_,]+)\}", export.__doc__)
    }
    written: dict[str, set] = {}
    for family in _families(fleet_run["run"]).values():
        for sample in family.samples:
            written.setdefault(family.name, set()).update(sample.labels)
    assert table == documented
    for name, labels in written.items():
        assert table[name] == labels, name


def test_textfiles_where_node_exporter_reads_them_replaced_whole_and_none_left_stale(tmp_path):
    collector = tmp_path / "textfile_collector"
    collector.mkdir()
    (collector / "other_exporter.prom").write_text("other_metric 1\n")
    (collector / "gpufleet_gone.prom").write_text('gpufleet_node_accepted{node="gone"} 1\n')  # a node since removed
    (collector / "gpufleet_n9.prom").write_text('gpufleet_node_accepted{node="n9"} 1\n')  # in the inventory, not run
    docs = {"n0": node_doc("n0", 0, read_at=R), "n1": node_doc("n1", 1, read_at=R, extra=[ecc_failure(gpus_of(1)[2])])}
    run = write_run(tmp_path / "reports", "t1", docs)
    report.build(run, textfile_dir=collector, fleet_hosts=["n0", "n1", "n9"])
    assert sorted(p.name for p in collector.iterdir()) == [
        "gpufleet_n0.prom",
        "gpufleet_n1.prom",
        "gpufleet_n9.prom",
        "other_exporter.prom",
    ]
    n1 = collector / "gpufleet_n1.prom"
    assert n1.read_text() == (run / "prometheus" / "n1.prom").read_text() and oct(n1.stat().st_mode & 0o777) == "0o644"
    assert (
        _find(_samples(n1), "gpufleet_check_severity", node="n1", check="gpu_health.ecc", **{"class": "hardware"}) == 3
    )
    first = n1.stat().st_ino
    # The next run of n1 alone (--limit), without the ECC result: that series is gone from its file, replaced
    # through a rename (a new inode; node_exporter never reads half a file); n0's file stays.
    run2 = write_run(tmp_path / "reports", "t2", {"n1": node_doc("n1", 1, read_at=R)})
    report.build(run2, textfile_dir=collector, fleet_hosts=["n0", "n1", "n9"])
    assert n1.stat().st_ino != first and (collector / "gpufleet_n0.prom").exists()
    assert not [k for k in _samples(n1) if ("check", "gpu_health.ecc") in k[1]]
    assert _find(_samples(n1), "gpufleet_run_info", node="n1", run_id="t2") == 1
    assert not [p for p in collector.iterdir() if p.name.startswith(".")]
    with pytest.raises(InputError, match="gpufleet_prometheus_textfile_dir .* is not a folder"):
        report.build(run2, textfile_dir=tmp_path / "nowhere")


def test_drain_lines_for_the_nodes_not_accepted(fleet_run):
    drain = (fleet_run["run"] / "drain.txt").read_text().splitlines()
    assert drain[0] == "# gpufleet r1: 1 node(s) not accepted; run these lines to drain them in Slurm"
    # GPU 3 at 80% is also the node's slowest GPU, 20% under the fleet's too: that only this run's fleet shows, and
    # it is inconclusive (information), not a reason to drain.
    assert drain[1:] == ['scontrol update NodeName=n1 State=DRAIN Reason="gpufleet hw ecc, gpu_vs_node; run r1"']
    md = (fleet_run["run"] / "report.md").read_text()
    assert "```sh\n" + drain[1] + "\n```" in md
    assert json.loads((fleet_run["run"] / "report.json").read_text())["fleet"]["drain"] == drain[1:]


def test_drain_line_quoting():
    line = export.drain_line("run-7", "gpu[01-02]", ["a.b", "c.d", "e.f", "g.h", "i.j", "k.l"])
    assert line == "scontrol update 'NodeName=gpu[01-02]' State=DRAIN Reason=\"gpufleet b, d, f, h +2 more; run run-7\""
    words = shlex.split(line)  # what a shell hands scontrol
    assert words[2] == "NodeName=gpu[01-02]" and words[4] == "Reason=gpufleet b, d, f, h +2 more; run run-7"
    assert "$" not in export.drain_line("r", "n0", ["x.$(reboot)`id`"])
    with pytest.raises(InputError, match="the Slurm node name of n0 is 'n0; reboot'"):
        export.slurm_name("n0", {"n0": "n0; reboot"})


def test_the_text_is_what_prometheus_client_writes_for_the_same_series():
    """export writes the text format itself (prometheus_client's per-series formatting cost most of a fleet's
    report): the same series through prometheus_client's own GaugeMetricFamily and generate_latest give the same
    bytes, awkward label values and values included."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    odd = ["", 'say "hi"', "back\\slash", "two\nlines", "{braces}", "ünïcode", "a,b=c"]
    # Values again after their first time (formatted once, then reused), zero after minus zero, NaN twice.
    values = [
        0,
        1,
        -2.5,
        1e-9,
        123456789.0,
        3.0e21,
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.0,
        0.0,
        -0.0,
        1,
        -2.5,
        123456789.0,
        float("nan"),
        float("inf"),
    ]
    gauges = [export._Gauge("gpufleet_test_plain", "no labels", ())]
    gauges[0].put((), 7)
    g = export._Gauge("gpufleet_test_odd", 'help with \\ and\nnewline "quoted"', ("node", "check", "class", "gpu"))
    for i, v in enumerate(values):
        g.put((odd[i % len(odd)], odd[(i + 3) % len(odd)], f"c{i}", str(i)), v)
    g.put((odd[0], odd[3], "c0", "0"), 42)  # set again: the last value wins, in its first place
    gauges += [g, export._Gauge("gpufleet_test_empty", "no series", ("node",))]

    class Collector:
        def collect(self):
            for gauge in gauges:
                family = GaugeMetricFamily(gauge.name, gauge.doc, labels=gauge.labelnames)
                for label_values, value in gauge.series.items():
                    family.add_metric(label_values, value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    assert export.exposition(gauges) == generate_latest(registry).decode("utf-8")
