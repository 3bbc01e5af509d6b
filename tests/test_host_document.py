"""The host document model (schema.py): built by the node's commands, read back by the report, the store and
`gpufleet record`, which all take it from schema alone."""

from __future__ import annotations

import json
import time

from gpufleet import __version__
from gpufleet.base import profiles, schema

READINGS = {
    "nvml": {
        "gpus": [{"name": "NVIDIA H100 80GB HBM3"}],
        "driver_version": "580.95.05",
        "cuda_driver_version": "13.0",
        "nvml_version": "13.580.95.05",
    },
    "host": {"kernel": "6.8.0-88-generic", "os": "Ubuntu 24.04.3 LTS"},
}


def _doc() -> dict:
    profile = profiles.resolve(schema.first_gpu_name(READINGS))
    results = [
        dict(
            schema.result("gpu_count", schema.PASS, "8 GPUs"),
            group="gpu_inventory",
            started=schema.utc_now(),
            seconds=0.1,
        )
    ]
    return schema.host_document("node7", profile, READINGS, schema.utc_now(), time.monotonic(), results)


def test_a_built_document_reads_back_whole():
    doc = _doc()
    assert set(doc) == {
        "schema_version",
        "host",
        "engine_version",
        "profile",
        "versions",
        "platform",
        "machine",
        "started",
        "seconds",
        "results",
    }
    assert doc["platform"]["host_link"] == "pcie" and [g["host_link"] for g in doc["platform"]["gpus"]] == [
        "pcie"
    ] * len(READINGS["nvml"]["gpus"])
    assert doc["profile"]["name"] == "h100-sxm" and doc["host"] == "node7" and doc["engine_version"] == __version__
    assert doc["versions"]["driver"] == "580.95.05" and doc["versions"]["os"] == "Ubuntu 24.04.3 LTS"
    back, why = schema.parse_host_doc(json.dumps(doc).encode())
    assert why is None and back == json.loads(json.dumps(doc))
    assert [schema.result_problem(r) for r in back["results"]] == [None]


def test_first_gpu_name_of_readings_without_gpus():
    assert schema.first_gpu_name({}) is None and schema.first_gpu_name({"nvml": {"gpus": []}}) is None


def test_what_cannot_be_read_says_why():
    good = json.loads(json.dumps(_doc()))
    cases = {
        b"": "the file is empty",
        b"\xff\xfe": "not UTF-8 text (byte 0)",
        b'{"schema_version": 1, "host"': "not valid JSON",
        b"[]": "expected a JSON object (a host document), got list",
        b'{"host": "n1", "results": []}': "missing required key(s) schema_version",
        json.dumps(dict(good, schema_version=9)).encode(): "schema_version is 9; this report reads version 1",
        json.dumps(dict(good, host="")).encode(): "'host' must be a non-empty string",
        json.dumps(dict(good, results={})).encode(): "'results' must be a list of results, got dict",
    }
    for raw, why in cases.items():
        doc, problem = schema.parse_host_doc(raw)
        assert doc is None and problem.startswith(why), (raw, problem)


def test_a_result_that_cannot_be_reported_says_why():
    assert schema.result_problem("pass") == "expected an object, got str"
    assert schema.result_problem({"status": "pass"}) == "missing 'check' (a non-empty string)"
    assert schema.result_problem({"check": "x", "status": "ok"}).startswith(
        "'status' is 'ok'; expected one of pass, warn"
    )
