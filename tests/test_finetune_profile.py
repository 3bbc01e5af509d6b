"""tools/finetune_profile.py's timeline: GPU busy time and idle gaps, on made-up events and on the two traces
recorded on an H200 (docs/results/2026-11-22-h200-x2-lora-flash), with cuDNN's attention and with flash."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import tool_modules

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "docs/results/2026-11-22-h200-x2-lora-flash"


@pytest.fixture(scope="module")
def prof():
    return tool_modules.load("finetune_profile")


def _k(ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "ts": ts, "dur": dur, "name": "k"}


def test_busy_time_is_the_union_of_overlapping_intervals_and_gaps_name_the_host_op(prof):
    events = [
        _k(0, 1000),
        _k(500, 1000),
        _k(1500, 500, "gpu_memset"),  # 0..2000 busy, overlapping
        _k(5000, 1000),  # idle 2000..5000
        {"ph": "X", "cat": "cpu_op", "ts": 1900, "dur": 3000, "name": "aten::slow_host_thing"},
        {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 9000, "name": "outer"},
    ]
    tl = prof.timeline(events, gap_us=2000)
    assert tl["busy_ms"] == pytest.approx(3.0) and tl["span_ms"] == pytest.approx(6.0)
    assert tl["busy_fraction"] == pytest.approx(0.5) and tl["idle_in_gaps_ms"] == pytest.approx(3.0)
    assert tl["longest_gaps"] == [{"at_ms": 2.0, "idle_ms": 3.0, "host_op": "aten::slow_host_thing"}]
    assert prof.timeline([], gap_us=2000) == {"gpu_events": 0}


def test_recorded_traces_show_cudnn_plans_holding_the_gpu_idle_and_flash_keeping_it_busy(prof):
    cudnn = prof.timeline(json.load(gzip.open(RUN / "profile-cudnn/trace.json.gz"))["traceEvents"])
    flash = prof.timeline(json.load(gzip.open(RUN / "profile-flash/trace.json.gz"))["traceEvents"])
    assert cudnn["busy_fraction"] < 0.8 < 0.9 < flash["busy_fraction"]
    # The two longest idle stretches open each micro-batch, while the host builds cuDNN's plan for the new row length.
    top = cudnn["longest_gaps"][:2]
    assert all(g["idle_ms"] > 40 and g["host_op"] == "aten::_cudnn_attention_forward" for g in top)
    assert not any("cudnn" in (g["host_op"] or "") for g in flash["longest_gaps"])
