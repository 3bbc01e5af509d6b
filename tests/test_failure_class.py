"""Failure classes: every result that is not pass or skip says hardware, environment, configuration or software,
and only hardware follows a GPU from run to run (store, fleet.returning_gpu, drain line, Prometheus label)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gpufleet.base import failure_class, schema
from gpufleet import report
from gpufleet.fleet import store_tables
from gpufleet.fleet.store import SCHEMA_VERSION, Store

from test_fleet_synthetic import _stamp, ecc_failure, gpus_of, node_doc, write_run

R1, R2 = "2026-11-20T10:00:00Z", "2026-11-21T10:00:00Z"


def processes_failure(gpu: dict) -> dict:
    """gpu_health.processes failing: another process held the GPU's memory, named in flagged_gpus."""
    return _stamp(
        schema.result(
            "processes",
            schema.FAIL,
            f"GPU {gpu['index']}: pid 4242 (python3, 70000 MiB)",
            value=1,
            detail={"flagged_gpus": [{"index": gpu["index"], "uuid": gpu["uuid"], "serial": gpu["serial"]}]},
        ),
        "gpu_health",
    )


def test_defaults_per_check_and_overrides_where_the_cause_is_known():
    assert schema.result("processes", schema.FAIL, "pid 1")["class"] == "environment"
    assert schema.result("ecc", schema.FAIL, "2 errors")["class"] == "hardware"
    assert schema.result("power_limit", schema.WARN, "low", remedy="raise it")["class"] == "configuration"
    assert schema.result("power_limit", schema.WARN, "low")["class"] is None  # no action: info, no class
    # Could not run: software, unless what stopped it is beside the node (the lock).
    assert schema.result("ecc", schema.ERROR, "unreadable")["class"] == "software"
    assert schema.result("node_lock", schema.ERROR, "held by run r0")["class"] == "environment"
    assert schema.result("ecc", schema.PASS, "none")["class"] is None
    assert schema.result("sdc", schema.SKIP, "cpu", failure_class="hardware")["class"] is None
    assert (
        schema.result("memory_bandwidth", schema.ERROR, "wrong data", failure_class="hardware")["class"] == "hardware"
    )
    assert schema.result("something_new", schema.FAIL, "x")["class"] == "software"
    with pytest.raises(ValueError, match="class 'board' is not one of"):
        schema.result("ecc", schema.FAIL, "x", failure_class="board")
    # A result is a value: its class cannot go stale. A changed result is a new one, classed again.
    res = schema.result("matmul_bf16", schema.PASS, "fine")
    with pytest.raises(TypeError, match="cannot be changed"):
        res["status"] = schema.FAIL
    with pytest.raises(TypeError, match="cannot be changed"):
        res.update(status=schema.FAIL)
    assert res.replace(status=schema.FAIL)["class"] == "hardware"
    assert res.replace(status=schema.FAIL).replace(status=schema.PASS)["class"] is None
    assert (
        schema.timed("benchmark", "matmul_bf16", lambda: res.replace(status=schema.WARN, remedy="look"))["class"]
        == "hardware"
    )
    # A known cause stays with the result through its changes, until it passes.
    known = schema.result("memory_bandwidth", schema.ERROR, "wrong data", failure_class="hardware")
    assert known.replace(reason="wrong data on GPU 1")["class"] == "hardware"
    assert known.replace(status=schema.PASS)["class"] is None
    # The same keys, in the same order, as results always had: the host document's schema is unchanged.
    assert list(schema.timed("gpu_health", "ecc", lambda: schema.result("ecc", schema.FAIL, "2"))) == [
        *schema.RESULT_KEYS,
        "started",
        "seconds",
    ]
    assert json.loads(json.dumps(known)) == dict(known)
    # A document from before results carried a class: the default.
    assert failure_class.of({"check": "processes", "group": "gpu_health", "status": "fail"}) == "environment"
    # Every check of the node groups has its own entry (a new check must be classed on purpose).
    from gpufleet.checks import GROUPS

    assert not [name for checks in GROUPS.values() for name, _ in checks if name not in failure_class.DEFAULTS]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """r1: n0's GPU 2 held by another process, n1's GPU 3 with ECC errors; r2: both nodes clean."""
    reports = tmp_path_factory.mktemp("reports")
    g0, g1 = gpus_of(0), gpus_of(1)
    report.build(
        write_run(
            reports,
            "r1",
            {
                "n0": node_doc("n0", 0, started=R1, extra=[processes_failure(g0[2])]),
                "n1": node_doc("n1", 1, started=R1, extra=[ecc_failure(g1[3])]),
                "n2": node_doc("n2", 2, started=R1),
            },
        )
    )
    report.build(write_run(reports, "r2", {h: node_doc(h, i, started=R2) for i, h in enumerate(("n0", "n1", "n2"))}))
    return {
        "reports": reports,
        "gpus": (g0, g1),
        "r1": json.loads((reports / "r1" / "report.json").read_text()),
        "r2": json.loads((reports / "r2" / "report.json").read_text()),
    }


def _fleet(rep: dict, host: str, check: str) -> dict:
    return next(r for r in rep["nodes"][host]["results"] if r["group"] == "fleet" and r["check"] == check)


def test_only_hardware_failures_follow_a_gpu_to_the_next_run(two_runs):
    g0, g1 = two_runs["gpus"]
    held = _fleet(two_runs["r2"], "n0", "returning_gpu")
    assert held["status"] == "pass", held["reason"]  # another process on GPU 2 was no fault of the board
    back = _fleet(two_runs["r2"], "n1", "returning_gpu")
    assert back["status"] == "warn" and "gpu_health.ecc fail (hardware)" in back["reason"]
    assert back["detail"]["flagged_gpus"] == [{"index": 3, "uuid": g1[3]["uuid"], "serial": g1[3]["serial"]}]
    with Store(two_runs["reports"] / "gpufleet.db") as store:
        assert store.gpu_failures(g0[2]["uuid"], g0[2]["serial"], "r2") == []
        hist = store.history(g0[2]["uuid"])
        assert hist["runs"][0]["flags"] == [
            {
                "check_id": "gpu_health.processes",
                "status": "fail",
                "class": "environment",
                "reason": "GPU 2: pid 4242 (python3, 70000 MiB)",
            }
        ]
        node = store.history("n1")["runs"][0]["not_passing"]
        ecc = {"check": "gpu_health.ecc", "status": "fail", "class": "hardware"}
        assert (ecc | {"reason": "GPU 3: 2 volatile uncorrectable ECC errors"}) in node, node


def test_drain_line_and_prometheus_name_the_class(two_runs):
    drain = two_runs["r1"]["fleet"]["drain"]
    assert any("NodeName=n0 " in line and 'Reason="gpufleet env processes; run r1"' in line for line in drain)
    assert any("NodeName=n1 " in line and 'Reason="gpufleet hw ecc; run r1"' in line for line in drain)
    prom = (two_runs["reports"] / "r1" / "prometheus" / "n0.prom").read_text()
    assert 'gpufleet_check_severity{check="gpu_health.processes",class="environment",node="n0"} 3.0' in prom
    assert 'gpufleet_check_severity{check="gpu_inventory.gpu_count",class="",node="n0"} 0.0' in prom


def test_a_version_1_store_is_migrated_and_its_rows_take_the_default_class(tmp_path):
    path = tmp_path / "gpufleet.db"
    conn = sqlite3.connect(path)
    conn.executescript(version_1_tables())  # results and gpu_flags without failure_class, documents without versions
    conn.execute("INSERT INTO gpufleet_meta VALUES ('application', 'gpufleet'), ('schema_version', '1')")
    conn.execute("INSERT INTO runs (run_id, started) VALUES ('r0', ?)", (R1,))
    conn.executemany(
        "INSERT INTO gpu_flags VALUES ('r0', 'n0', ?, ?, NULL, ?, 'fail', 'old')",
        [(1, "GPU-aaaa", "gpu_health.processes"), (2, "GPU-bbbb", "gpu_health.ecc")],
    )
    conn.commit()
    conn.close()
    with Store(path) as store:
        assert store.conn.execute("SELECT value FROM gpufleet_meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION
        )
        assert "versions" in [r[1] for r in store.conn.execute("PRAGMA table_info(documents)")]
        assert store.gpu_failures("GPU-aaaa", None, "r9") == []
        (ecc,) = store.gpu_failures("GPU-bbbb", None, "r9")
        assert ecc["class"] == "hardware" and ecc["check_id"] == "gpu_health.ecc"
    with Store(path) as store:  # opening again migrates nothing twice
        cols = [r[1] for r in store.conn.execute("PRAGMA table_info(results)")]
        assert cols.count("failure_class") == 1
        migrated = {t: [r[1] for r in store.conn.execute(f"PRAGMA table_info({t})")] for t in store_tables.HOST_TABLES}
    # The tables alone, before any migration, have the columns a migrated store has, in the same order.
    bare = sqlite3.connect(":memory:")
    bare.executescript(store_tables.DDL)
    assert {t: [r[1] for r in bare.execute(f"PRAGMA table_info({t})")] for t in store_tables.HOST_TABLES} == migrated


def version_1_tables() -> str:
    """The tables of a store of schema version 1: today's, less what versions 2 and 3 added."""
    statements = [s for s in store_tables.DDL.split(";") if "sdc_hashes" not in s and "repairs" not in s]
    return ";".join(statements).replace(", failure_class TEXT", "").replace(", versions TEXT", "")
