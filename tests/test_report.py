"""report.build(): host documents in RUN_DIR/hosts -> report.json, report.md, report.html, junit.xml."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpufleet import report
from gpufleet.base import schema
from gpufleet.base.errors import InputError

SCRIPT = "<script>alert('x')</script>"


def _stamp(res: dict) -> dict:
    """What schema.timed() adds when a check runs."""
    return dict(res, started="2026-11-21T21:00:00Z", seconds=0.25)


def host_doc(host: str, results: list[dict], profile: str = "h100-sxm") -> dict:
    """A host document shaped like host_documents.check_host() output."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "host": host,
        "engine_version": "0.1.0",
        "profile": {"name": profile, "path": f"files/profiles/{profile}.yml", "thresholds": {}},
        "versions": {"engine": "0.1.0", "driver": "550.54.15", "cuda_driver": "12.4", "kernel": "5.15.0"},
        "started": "2026-11-21T21:00:00Z",
        "seconds": 1.5,
        "results": [_stamp(r) for r in results],
    }


def passing_results() -> list[dict]:
    return [
        schema.result(
            "gpu_count",
            schema.PASS,
            "8 GPUs found, 8 expected",
            group="gpu_inventory",
            value=8,
            unit="GPUs",
            threshold={"key": "gpus_expected", "value": 8, "source": "site fact"},
        ),
        schema.result("persistence_mode", schema.PASS, "persistence mode on for all 8 GPUs", group="gpu_health"),
    ]


def failing_results() -> list[dict]:
    return [
        schema.result(
            "gpu_count", schema.PASS, "8 GPUs found, 8 expected", group="gpu_inventory", value=8, unit="GPUs"
        ),
        schema.result(
            "gpu_ecc",
            schema.FAIL,
            f"GPU 3: 2 volatile uncorrectable ECC errors {SCRIPT}",
            group="gpu_health",
            value=2,
            unit="errors",
            threshold={
                "key": "ecc_volatile_uncorrected_max",
                "value": 0,
                "source": "reset the GPU after any uncorrectable error",
            },
            remedy="drain the node; reset GPU 3 and re-run",
            detail={"gpus": [{"index": 3, "volatile_uncorrected": 2}, {"index": 5, "volatile_uncorrected": 0}]},
        ),
        schema.result("pcie_acs", schema.ERROR, "check crashed: PermissionError: /sys/bus/pci", group="host_hygiene"),
        schema.result(
            "nccl_allreduce_8gpu",
            schema.WARN,
            "busbw 340.2 GB/s is under the 350 GB/s goal",
            group="benchmarks",
            value=340.2,
            unit="GB/s",
            threshold={"key": "nccl_busbw_min_gbps", "value": 350, "source": "nccl-tests on 8 x H100", "min": 350},
            remedy="check NVLink state with nvidia-smi nvlink -s",
        ),
        schema.result("ib_ports", schema.SKIP, "no InfiniBand devices on this host", group="host_hygiene"),
    ]


def write_host(run_dir: Path, name: str, doc) -> Path:
    hosts = run_dir / "hosts"
    hosts.mkdir(parents=True, exist_ok=True)
    path = hosts / f"{name}.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def fleet(tmp_path):
    """node1 passes, node2 fails (fail + error), node3's file is cut short, node4 never reported."""
    run = tmp_path / "run-20261121"
    write_host(run, "node1", host_doc("node1", passing_results()))
    write_host(run, "node2", host_doc("node2", failing_results()))
    write_host(run, "node3", '{"schema_version": 1, "host": "node3", "results": [{"check": "gpu_c')
    return run


@pytest.fixture
def built(fleet):
    summary = report.build(fleet, expected_hosts=["node1", "node2", "node3", "node4"])
    return fleet, summary, json.loads((fleet / "report.json").read_text())


# ---------------------------------------------------------------- report.json and the summary


def test_verdict_per_node_and_fleet(built):
    run, summary, doc = built
    verdicts = {h: n["verdict"] for h, n in doc["nodes"].items()}
    assert verdicts == {"node1": "pass", "node2": "fail", "node3": "fail", "node4": "fail"}
    assert doc["verdict"] == summary["verdict"] == "fail"
    assert doc["run_id"] == "run-20261121"
    assert {h: n["verdict"] for h, n in summary["nodes"].items()} == verdicts


def test_a_finding_with_no_action_is_information_apart_from_the_warnings(tmp_path):
    """A warn without a remedy is `info`: the node still passes, and every rendering lists it apart."""
    run = tmp_path / "run-info"
    # A finding with no action for the operator: information, listed apart, part of no verdict.
    noted = schema.result(
        "nccl_transport",
        schema.WARN,
        "inter-node traffic used TCP sockets (no InfiniBand on this host)",
        group="benchmark",
    )
    write_host(run, "node1", host_doc("node1", passing_results() + [noted]))
    summary = report.build(run)
    doc = json.loads((run / "report.json").read_text())
    node1 = doc["nodes"]["node1"]
    assert node1["counts"] == {"error": 0, "fail": 0, "warn": 0, "info": 1, "skip": 0, "pass": 2}
    (info,) = [r for r in node1["results"] if r["check"] == "nccl_transport"]
    assert info["status"] == "info" and info["class"] is None and node1["verdict"] == "pass"
    assert summary["nodes"]["node1"]["warned_checks"] == [] and node1["not_passing"] == []
    md = (run / "report.md").read_text()
    start = md.index("\n## node1")
    section = md[start : md.find("\n## ", start + 3)]
    assert "### Not passing" not in section
    assert "### Information: findings with no action for the operator; they do not change the verdict (1)" in section
    assert "used TCP sockets" in section.split("### Passed")[0]
    html = (run / "report.html").read_text()
    assert "1 information: findings with no action" in html and "b-info" in html
    case = ET.parse(run / "junit.xml").getroot().find(".//testcase[@name='benchmark.nccl_transport']")
    assert case.find("system-out").text.startswith("INFO ") and case.find("failure") is None


def test_counts_and_failed_checks(built):
    _, summary, doc = built
    assert doc["nodes"]["node2"]["counts"] == {"error": 1, "fail": 1, "warn": 1, "info": 0, "skip": 1, "pass": 1}
    assert doc["nodes"]["node1"]["counts"] == {"error": 0, "fail": 0, "warn": 0, "info": 0, "skip": 0, "pass": 2}
    assert summary["nodes"]["node2"]["failed_checks"] == ["gpu_health.gpu_ecc", "host_hygiene.pcie_acs"]
    assert summary["nodes"]["node1"]["failed_checks"] == []
    assert doc["counts"]["error"] == 3  # node2's crash, node3's file, node4's silence


def test_every_result_is_kept_unchanged(built, fleet):
    _, _, doc = built
    for host in ("node1", "node2"):
        written = json.loads((fleet / "hosts" / f"{host}.json").read_text())
        assert doc["nodes"][host]["results"] == written["results"]
    node2 = doc["nodes"]["node2"]
    assert node2["profile"] == "h100-sxm"
    assert node2["versions"]["driver"] == "550.54.15"


def test_corrupt_file_becomes_an_error_not_a_gap(built):
    _, _, doc = built
    (res,) = doc["nodes"]["node3"]["results"]
    assert res["status"] == "error"
    assert res["reason"].startswith("results file hosts/node3.json is unreadable: not valid JSON")
    assert res["detail"]["head"].startswith('{"schema_version": 1')


def test_expected_host_without_file_is_an_error(built):
    _, _, doc = built
    (res,) = doc["nodes"]["node4"]["results"]
    assert res["status"] == "error"
    assert res["reason"] == "no results: the host never reported (unreachable or the play was interrupted)"


@pytest.mark.parametrize(
    "content, why",
    [
        ("", "the file is empty"),
        ("[1, 2]", "expected a JSON object"),
        ('{"schema_version": 1, "host": "nodeX"}', "missing required key(s) results"),
        ('{"schema_version": 7, "host": "nodeX", "results": []}', "schema_version is 7"),
        ('{"schema_version": 1, "host": "nodeX", "results": {"a": 1}}', "'results' must be a list"),
    ],
)
def test_unreadable_file_names_why(tmp_path, content, why):
    write_host(tmp_path, "nodeX", content)
    summary = report.build(tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    (res,) = doc["nodes"]["nodeX"]["results"]
    assert res["status"] == "error" and why in res["reason"], res["reason"]
    assert summary["verdict"] == "fail"


def test_malformed_result_is_kept_inside_an_error(tmp_path):
    good = passing_results()
    doc = host_doc("node1", good)
    doc["results"].append({"check": "odd", "status": "ok", "value": 3})
    write_host(tmp_path, "node1", doc)
    report.build(tmp_path)
    node = json.loads((tmp_path / "report.json").read_text())["nodes"]["node1"]
    assert node["verdict"] == "fail"
    assert node["results"][:2] == doc["results"][:2]
    bad = node["results"][2]
    assert bad["status"] == "error" and "result #2" in bad["reason"] and "'ok'" in bad["reason"]
    assert bad["detail"]["raw"] == {"check": "odd", "status": "ok", "value": 3}


def test_minimal_playbook_document(tmp_path):
    minimal = {
        "schema_version": 1,
        "host": "node1",
        "results": [
            {
                "check": "reachable",
                "group": "connection",
                "status": "error",
                "reason": "host unreachable: ssh: connect to host 10.2.0.130 port 22: No route to host",
            }
        ],
    }
    write_host(tmp_path, "node1", minimal)
    summary = report.build(tmp_path, expected_hosts=["node1"])
    assert summary["nodes"]["node1"] == {
        "verdict": "fail",
        "counts": {"error": 1, "fail": 0, "warn": 0, "info": 0, "skip": 0, "pass": 0},
        "failed_checks": ["connection.reachable"],
        "warned_checks": [],
        "causes": ["connection.reachable: host unreachable: ssh: connect to host 10.2.0.130 port 22: No route to host"],
    }
    assert "No route to host" in (tmp_path / "report.md").read_text()


def test_node_is_named_by_its_file(tmp_path):
    """The playbook writes hosts/<inventory name>.json; the node may call itself otherwise."""
    write_host(tmp_path, "node7", host_doc("gpu-node-7.internal", passing_results()))
    summary = report.build(tmp_path, expected_hosts=["node7"])
    assert list(summary["nodes"]) == ["node7"] and summary["verdict"] == "pass"
    node = json.loads((tmp_path / "report.json").read_text())["nodes"]["node7"]
    assert node["reported_host"] == "gpu-node-7.internal"


def test_warn_only_fleet_is_accepted(tmp_path):
    write_host(tmp_path, "node1", host_doc("node1", passing_results() + [failing_results()[3]]))
    summary = report.build(tmp_path)
    assert summary["verdict"] == "warn"
    assert summary["nodes"]["node1"]["warned_checks"] == ["benchmarks.nccl_allreduce_8gpu"]


def test_summary_text(built):
    run, summary, _ = built
    text = report.summary_text(summary)
    assert text.splitlines()[0] == "fleet verdict: FAIL (4 node(s): 3 not accepted, 1 accepted)"
    node2 = next(line for line in text.splitlines() if line.strip().startswith("node2"))
    assert "FAIL" in node2 and "gpu_health.gpu_ecc" in node2 and "host_hygiene.pcie_acs" in node2
    assert str(run / "report.html") in text
    for name, path in summary["files"].items():
        assert Path(path).is_dir() if name == "prometheus" else Path(path).is_file(), name


# ---------------------------------------------------------------- bad RUN_DIR


def test_missing_run_dir(tmp_path):
    with pytest.raises(InputError, match=r"does not exist; expected a directory holding hosts/<host>.json"):
        report.build(tmp_path / "nope")


def test_run_dir_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is not a directory"):
        report.build(tmp_path / "f")


def test_run_dir_without_hosts_folder(tmp_path):
    with pytest.raises(InputError, match="has no hosts/ folder"):
        report.build(tmp_path)


def test_empty_hosts_folder_and_nothing_expected(tmp_path):
    (tmp_path / "hosts").mkdir()
    with pytest.raises(InputError, match="holds no <host>.json files"):
        report.build(tmp_path)


# ---------------------------------------------------------------- report.md


def test_markdown_failures_first(built):
    run, _, _ = built
    md = (run / "report.md").read_text()
    table = [line for line in md.splitlines() if re.match(r"\| node\d \| \*\*", line)]
    assert [line.split("|")[1].strip() for line in table] == ["node2", "node3", "node4", "node1"]
    assert "| node2 | **FAIL** | 1 | 1 | 1 | 0 | 1 | 1 |" in md
    sections = re.findall(r"^## (node\d): (\w+)$", md, re.M)
    assert sections == [("node2", "FAIL"), ("node3", "FAIL"), ("node4", "FAIL"), ("node1", "PASS")]
    node2 = md.split("## node2")[1].split("## node3")[0]
    order = [
        node2.index(s)
        for s in (
            "ERROR `host_hygiene.pcie_acs`",
            "FAIL `gpu_health.gpu_ecc`",
            "WARN `benchmarks.nccl_allreduce_8gpu`",
            "### Skipped: not applicable on this node (1)",
            "| `host_hygiene.ib_ports` |",
            "### Passed (1)",
        )
    ]
    assert order == sorted(order)


def test_markdown_finding_has_value_threshold_reason_remedy(built):
    run, _, _ = built
    md = (run / "report.md").read_text()
    ecc = md.split("FAIL `gpu_health.gpu_ecc`")[1].split("####")[0]
    assert "- value: 2 errors" in ecc
    assert (
        "- limit: ecc_volatile_uncorrected_max = 0, not calibrated (source: reset the GPU after any uncorrectable error)"
        in ecc
    )
    assert "- remedy: drain the node; reset GPU 3 and re-run" in ecc
    # The reason stays readable, but its "<" is escaped so it cannot open a tag when rendered.
    assert "errors \\<script>alert('x')\\</script>" in md
    assert not re.search(r"(?<!\\)<", md)
    # A benchmark's threshold is shown by its key, not by check name.
    assert "- value: 340.2 GB/s" in md
    assert "- limit: nccl_busbw_min_gbps = 350, not calibrated (source: nccl-tests on 8 x H100)" in md


# ---------------------------------------------------------------- report.html


def test_html_failures_first_with_evidence(built):
    run, _, _ = built
    page = (run / "report.html").read_text()
    headings = re.findall(r"<h2>(node\d) <span class=\"badge b-(\w+)\">", page)
    assert headings == [("node2", "fail"), ("node3", "fail"), ("node4", "fail"), ("node1", "pass")]
    node2 = page.split("<h2>node2")[1].split("<h2>node3")[0]
    assert node2.index("gpu_health.gpu_ecc") < node2.index("skipped: not applicable") < node2.index("1 passed")
    ecc_row = node2.split("<code>gpu_health.gpu_ecc</code>")[1].split("</tr>\n")[0]
    assert "<details><summary>evidence" in ecc_row
    assert "<th>volatile_uncorrected</th>" in ecc_row  # per-GPU records as a small table
    assert "ecc_volatile_uncorrected_max = 0" in ecc_row and "source: reset the GPU" in ecc_row
    assert 'class="s-fail"' in page and 'class="s-error"' in page and "b-warn" in page


def test_html_is_self_contained(built):
    run, _, _ = built
    page = (run / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.I)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))


def test_html_escapes_text(built):
    run, _, _ = built
    page = (run / "report.html").read_text()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page


# ---------------------------------------------------------------- junit.xml


def test_junit_counts(built):
    run, _, _ = built
    root = ET.parse(run / "junit.xml").getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("9", "1", "3", "1")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["node2", "node3", "node4", "node1"]
    node2 = suites["node2"]
    assert (node2.get("tests"), node2.get("failures"), node2.get("errors"), node2.get("skipped")) == (
        "5",
        "1",
        "1",
        "1",
    )
    cases = {c.get("name"): c for c in node2.findall("testcase")}
    assert set(cases) == {
        "gpu_inventory.gpu_count",
        "gpu_health.gpu_ecc",
        "host_hygiene.pcie_acs",
        "benchmarks.nccl_allreduce_8gpu",
        "host_hygiene.ib_ports",
    }
    assert len(root.findall(".//failure")) == 1 and len(root.findall(".//error")) == 3
    assert len(root.findall(".//skipped")) == 1


def test_junit_elements_carry_reason_remedy_detail(built):
    run, _, _ = built
    root = ET.parse(run / "junit.xml").getroot()
    case = root.find(".//testcase[@name='gpu_health.gpu_ecc']")
    failure = case.find("failure")
    assert failure.get("message") == f"GPU 3: 2 volatile uncorrectable ECC errors {SCRIPT}"  # escaped, parses back
    assert "remedy: drain the node; reset GPU 3 and re-run" in failure.text
    detail = json.loads(failure.text.split("detail: ", 1)[1])
    assert detail["gpus"][0] == {"index": 3, "volatile_uncorrected": 2}
    warn = root.find(".//testcase[@name='benchmarks.nccl_allreduce_8gpu']")
    assert warn.find("failure") is None and warn.find("error") is None
    assert "busbw 340.2 GB/s is under the 350 GB/s goal" in warn.find("system-out").text
    skipped = root.find(".//testcase[@name='host_hygiene.ib_ports']/skipped")
    assert skipped.get("message") == "no InfiniBand devices on this host"
    node4_error = root.find("testsuite[@name='node4']/testcase/error")
    assert node4_error.get("message").startswith("no results: the host never reported")


def test_junit_survives_control_characters(tmp_path):
    res = failing_results()[1].replace(
        reason="Xid 79 \x1b[31mfallen off the bus\x00", detail={"kernel_log_tail": "line\x07one\nline two"}
    )
    write_host(tmp_path, "node1", host_doc("node1", [res]))
    report.build(tmp_path)
    failure = ET.parse(tmp_path / "junit.xml").getroot().find(".//failure")
    assert "fallen off the bus" in failure.get("message")


# ---------------------------------------------------------------- the CLI


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufleet", "report", *map(str, args)], capture_output=True, text=True)


def test_cli_exit_1_when_a_node_fails(fleet):
    proc = _cli(fleet, "--expect-host", "node4")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("fleet verdict: FAIL")
    assert "node4" in proc.stdout and (fleet / "junit.xml").is_file()


def test_cli_exit_0_when_all_pass_or_warn(tmp_path):
    write_host(tmp_path, "node1", host_doc("node1", passing_results()))
    write_host(tmp_path, "node2", host_doc("node2", passing_results() + [failing_results()[3]]))
    proc = _cli(tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["verdict"] == "warn"
    assert {h: n["verdict"] for h, n in summary["nodes"].items()} == {"node2": "warn", "node1": "pass"}


def test_cli_exit_2_for_missing_run_dir(tmp_path):
    proc = _cli(tmp_path / "missing")
    assert proc.returncode == 2
    assert f"run directory {tmp_path / 'missing'} does not exist" in proc.stderr


def test_nodes_whose_locks_were_not_given_back_are_named(fleet):
    """run.json's last attempt names the nodes whose lock it could not give back: the report names them."""
    attempts = [
        {"attempt": 1, "locks_not_given_back": {"node1": "gone"}},
        {"attempt": 2, "locks_not_given_back": {"node2": "did not answer", "node5<b>": "unreachable"}},
    ]
    (fleet / "run.json").write_text(json.dumps({"run_id": fleet.name, "attempts": attempts}))
    report.build(fleet, use_store=False)
    md = (fleet / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Locks not given back"))
    assert "node2 (did not answer)" in line and "node5\\<b> (unreachable)" in line and "node1" not in line
    page = (fleet / "report.html").read_text()
    assert "node2 (did not answer); node5&lt;b&gt; (unreachable)" in page
    assert json.loads((fleet / "report.json").read_text())["locks_not_given_back"]["node2"] == "did not answer"


def test_no_lock_line_when_every_lock_was_given_back(fleet):
    (fleet / "run.json").write_text(
        json.dumps({"run_id": fleet.name, "attempts": [{"attempt": 1, "locks_not_given_back": {}}]})
    )
    report.build(fleet, use_store=False)
    assert "Locks not given back" not in (fleet / "report.md").read_text()
    assert "Locks not given back" not in (fleet / "report.html").read_text()
