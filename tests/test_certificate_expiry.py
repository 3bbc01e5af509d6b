"""Certificates in service (docs/certificates.md): the reports folder's index of each node's latest certificate,
what the report and `gpufleet status` say of an expired one, and a sweep's order (the nodes whose certificates
expire soonest first). The certificates here are unsigned envelopes: these readers never verify (`gpufleet verify`
does: tests/test_certificates.py)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

from gpufleet import collect, report
from gpufleet.base import certificates
from gpufleet.service import sweep

import report_runs

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"


def certificate(run_dir: Path, host: str, certified: float, valid_until: float) -> Path:
    """A node certificate's envelope as `gpufleet certify` writes it, its signature left out."""
    stmt = {
        "_type": certificates.STATEMENT_TYPE,
        "subject": [],
        "predicateType": certificates.PREDICATE_TYPE,
        "predicate": {
            "node": host,
            "run": {"id": run_dir.name, "tier": "acceptance"},
            "certified": certificates.utc(certified),
            "valid_until": certificates.utc(valid_until),
        },
    }
    path = certificates.node_path(run_dir, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = base64.b64encode(json.dumps(stmt).encode()).decode()
    path.write_text(json.dumps({"payloadType": certificates.PAYLOAD_TYPE, "payload": payload, "signatures": []}))
    return path


def test_the_index_keeps_each_nodes_latest_and_is_read_again_from_the_runs_when_damaged(tmp_path):
    now = time.time()
    old = certificate(tmp_path / "r1", "n1", now - 30 * 86400, now - 9 * 86400)
    new = certificate(tmp_path / "r2", "n1", now - 86400, now + 20 * 86400)
    other = certificate(tmp_path / "r1", "n2", now - 30 * 86400, now - 9 * 86400)
    index = certificates.record(tmp_path, [certificates.claim(p) for p in (new, old, other)])
    assert index["n1"]["run_id"] == "r2" and index["n2"]["run_id"] == "r1"
    assert json.loads((tmp_path / certificates.INDEX_FILE).read_text()) == index
    (tmp_path / certificates.INDEX_FILE).write_bytes(b"\x00 damaged")
    assert certificates.latest(tmp_path) == index == certificates.scan(tmp_path)
    states = {h: certificates.state(c, now) for h, c in index.items()}
    assert not states["n1"]["expired"] and states["n2"]["expired"]
    assert states["n2"]["text"].startswith("certificate of run r1 expired on ")
    assert certificates.state(None)["text"] == "no certificate"


def test_a_sweep_takes_the_nodes_whose_certificates_expire_soonest_first():
    shown = {n: {"base": "IDLE", "flags": [], "state": "IDLE", "partitions": ["gpu"]} for n in "abcd"}
    last = {"a": "2026-11-01T00:00:00Z", "b": "2026-11-20T00:00:00Z", "c": "2026-11-10T00:00:00Z"}
    expiring = {"a": "2026-12-20T00:00:00Z", "b": "2026-12-01T00:00:00Z", "c": "2026-11-25T00:00:00Z"}
    planned = sweep.plan(shown, ["gpu"], [], (3, False), last, valid_until=expiring)
    # d has no certificate: first; then c, b and a by their expiry (a was measured longest ago, but holds the longest)
    assert planned["chosen"] == ["d", "c", "b"] and list(planned["deferred"]) == ["a"]
    # Without certificates the order is the one before them: never tested first, then the oldest.
    assert sweep.plan(shown, ["gpu"], [], (4, False), last)["chosen"] == ["d", "a", "c", "b"]


def test_the_report_and_status_say_a_nodes_certificate_expired(tmp_path):
    reports = tmp_path / "reports"
    earlier = reports / "earlier"
    certificate(earlier, "localhost", time.time() - 30 * 86400, time.time() - 9 * 86400)
    certificates.record(reports, [certificates.claim(certificates.node_path(earlier, "localhost"))])
    run = report_runs.one_gpu(reports)
    node = json.loads((run / "report.json").read_text())["nodes"]["localhost"]
    assert node["certificate"]["expired"] and node["certificate"]["run_id"] == "earlier"
    assert "**expired**: certificate of run earlier expired on " in (run / "report.md").read_text()
    assert "<strong>expired</strong>: certificate of run earlier expired on" in (run / "report.html").read_text()
    assert "its certificate of run earlier expired on" in report.summary_text(report.build(run, use_store=False))
    cert = certificates.node_path(earlier, "localhost")
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "status", "--readings", READINGS, "--certificate", cert, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    state = json.loads(done.stdout)["certificate"]
    assert state["expired"] and state["text"].startswith("certificate of run earlier expired on"), done
    shown = subprocess.run(
        [sys.executable, "-m", "gpufleet", "status", "--readings", READINGS, "--certificate", cert],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "certificate of run earlier expired on" in shown.stdout, shown
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet", "status", "--readings", READINGS, "--certificate", READINGS],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "is no node certificate" in bad.stderr


def test_the_board_identity_is_read_from_dmi_with_placeholders_and_absences_said(tmp_path):
    from gpufleet.collect.host.dmi import read_dmi

    dmi = tmp_path / "sys" / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "board_serial").write_text("BSN-4411\n")
    (dmi / "chassis_serial").write_text("To Be Filled By O.E.M.\n")
    (dmi / "product_uuid").write_text("00000000-0000-0000-0000-000000000000\n")
    (dmi / "board_vendor").write_text("Supermicro\n")
    got = read_dmi(tmp_path, path_env=str(tmp_path / "no-bin"))
    fields, not_read = got["fields"], got["not_read"]
    assert fields["board_serial"] == "BSN-4411" and fields["board_vendor"] == "Supermicro"
    assert fields["chassis_serial"] is None and "placeholder 'To Be Filled By O.E.M.'" in not_read["chassis_serial"]
    assert fields["product_uuid"] is None and "placeholder" in not_read["product_uuid"]
    assert (
        fields["product_serial"] is None
        and "product_serial: not present; dmidecode is not on PATH" in (not_read["product_serial"])
    )
    board = collect.board({"host": {"dmi": got}})  # what a certificate binds: the serials, placeholders unbound
    assert board["board_serial"] == "BSN-4411" and board["chassis_serial"] is None
    assert "placeholder" in board["unreadable"]["chassis_serial"]
