"""The controller's work grows linearly with the fleet: counted, never timed (tools/controller_cost.py times it).

A report of 4 nodes and one of 12, each against a baseline run of the same nodes in a real store, count how many
figures the fleet medians go through and how often the SDC votes of a computation are gathered. Work that is
done once per node for every node (a fleet median per node, every baseline row per node, every node's SDC hashes
per node) makes the first count grow 9-fold from 4 to 12 nodes instead of 3-fold. And each host document is read,
parsed and its metrics extracted once per report build: the store's indexing takes them from the report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import report
from gpufleet.base import paths, schema
from gpufleet.fleet import sdc_voters
from gpufleet.comparisons import metrics, peers

from test_fleet_synthetic import gpus_of, node_doc, write_run
from sdc_runs import node_result

BASE, RUN = "2026-11-20T10:00:00Z", "2026-11-21T10:00:00Z"


def docs(n: int, started: str) -> dict:
    out = {}
    for i in range(n):
        gpus = gpus_of(i)
        out[f"node-{i:02d}"] = node_doc(
            f"node-{i:02d}", i, gpus=gpus, started=started, read_at=(started, started), extra=[node_result(gpus)]
        )
    return out


def count_work(tmp_path, n: int, monkeypatch) -> dict:
    """Build the baseline run's report and the run's, counting the work of the run's."""
    reports = tmp_path / f"fleet-{n}"
    report.build(write_run(reports, "base", docs(n, BASE)))
    run_dir = write_run(reports, "run", docs(n, RUN), baseline="base")
    counts = {"median_values": 0, "sdc_votes": 0}
    robust, votes = peers.robust, sdc_voters._votes

    def counting_robust(values):
        counts["median_values"] += len(values)
        return robust(values)

    def counting_votes(*args):
        counts["sdc_votes"] += 1
        return votes(*args)

    monkeypatch.setattr(peers, "robust", counting_robust)  # where the fleet layer takes its medians
    monkeypatch.setattr(sdc_voters, "_votes", counting_votes)
    summary = report.build(run_dir)
    monkeypatch.undo()
    assert summary["baseline"] == "base"
    return counts


@pytest.mark.parametrize("small, large", [(4, 12)])
def test_the_fleet_judgement_goes_through_each_figure_a_bounded_number_of_times(tmp_path, monkeypatch, small, large):
    few, many = count_work(tmp_path, small, monkeypatch), count_work(tmp_path, large, monkeypatch)
    # Linear: 3 times the nodes, about 3 times the figures (a little more: medians over more nodes).
    assert many["median_values"] <= 3.5 * few["median_values"], (few, many)
    # The votes of each SDC computation are gathered once for the run, whatever the number of nodes.
    assert few["sdc_votes"] == many["sdc_votes"] > 0, (few, many)


def test_each_host_document_is_read_parsed_and_extracted_once_per_report(tmp_path, monkeypatch):
    """The run's documents once each, and the baseline run's not at all: the software and firmware table compares
    with the baseline's versions as the store kept them."""
    n = 5
    reports = tmp_path / "fleet"
    report.build(write_run(reports, "base", docs(n, BASE)))
    run_dir = write_run(reports, "run", docs(n, RUN), baseline="base")
    reads, counts = [], {"parsed": 0, "extracted": 0}
    read_bytes, parse, extract = paths.read_bytes, schema.parse_host_doc, metrics.extract

    def counting_read(path, **how):  # the one reader of a reports folder's files
        path = Path(path)
        if path.parent.name == "hosts":
            reads.append(f"{path.parent.parent.name}/{path.name}")
        return read_bytes(path, **how)

    def counting_parse(raw):
        counts["parsed"] += 1
        return parse(raw)

    def counting_extract(results):
        counts["extracted"] += 1
        return extract(results)

    monkeypatch.setattr(paths, "read_bytes", counting_read)
    monkeypatch.setattr(schema, "parse_host_doc", counting_parse)
    monkeypatch.setattr(metrics, "extract", counting_extract)
    summary = report.build(run_dir)
    monkeypatch.undo()
    assert summary["baseline"] == "base" and len(summary["nodes"]) == n
    assert sorted(reads) == [f"run/node-{i:02d}.json" for i in range(n)], reads
    assert counts == {"parsed": n, "extracted": n}, counts
