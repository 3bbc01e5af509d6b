"""The host's own throughput (benchmarks.host: memory per NUMA node, the scratch drive, a data loader) run for real on
this machine's CPU as a logic check (figures kept, `skip`: no performance figure is judged here), the judges on
made-up figures of a GPU node, the scratch folder refused or full, and the drive's watch naming a writer that is
not the run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.base import profiles, schema
from gpufleet.bench import io_watch
from gpufleet.benchmarks.host import host_disk, host_judge, host_loader, host_memory
from gpufleet.comparisons import metrics

from sysfs_tree import hgx
from test_fabric import _env
from waiting import wait_for

H100 = "NVIDIA H100 80GB HBM3"


def _profile(**overrides):
    return profiles.resolve(H100, overrides=overrides or None)


@pytest.fixture(scope="module")
def bench_doc(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "host", "--json", "--exit-zero", "--host", "n0"],
        capture_output=True,
        text=True,
        env=dict(_env(), GPUFLEET_SCRATCH_DIR=str(scratch)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list(scratch.iterdir())  # the test file is gone
    return json.loads(proc.stdout)


def test_the_host_step_runs_on_the_cpu_and_keeps_every_figure(bench_doc):
    res = {r["check"]: r for r in bench_doc["results"]}
    for check in ("host_memory_bandwidth", "disk_write_bandwidth", "disk_read_bandwidth", "data_loader"):
        assert res[check]["status"] == schema.SKIP and "not a performance figure" in res[check]["reason"], check
        assert res[check]["value"] > 0 and res[check]["group"] == "benchmark"
    mem = res["host_memory_bandwidth"]["detail"]
    assert mem["method"]["bytes_counted"].startswith("40 an element") and mem["per_node"]["0"]["threads"] >= 1
    write = res["disk_write_bandwidth"]["detail"]
    assert write["tool"] in ("O_DIRECT threads",) or write["tool"].startswith("fio")
    assert write["write"]["bytes"] > 0 and write["read"]["io"]["phase"] == "read" and write["free_bytes"] > 0
    load = res["data_loader"]["detail"]
    assert load["pinned"] is False and "a plain copy, not pinned" in load["method"]["hand_off"]
    assert load["cpu_us_per_sample"] > 0 and [n["job"] for n in load["needs_tokens_per_s_per_gpu"]][0].startswith(
        "GPT-2"
    )
    assert "x GPT-2 124M at llm.c's pace (468k)" in res["data_loader"]["reason"]
    # a CPU run loads no GPU link: as for its <step>_processes, no pcie_links result (tests/test_pcie_links.py)
    assert "pcie_links" not in res and "host_processes" not in res
    # and the fleet reads the figures, flagged as a CPU run's
    got = {m["key"]: m for m in metrics.extract(bench_doc)["metrics"]}
    assert {"host_memory_gbps", "disk_write_gbps", "disk_read_gbps", "loader_tokens_per_s_per_gpu"} <= set(got)
    assert got["host_memory_gbps"]["cpu"] and got["disk_read_gbps"]["unit"] == "GB/s"


def test_numa_nodes_come_from_sysfs_and_each_gets_its_cpus(tmp_path):
    tree = hgx(tmp_path)
    nodes = host_memory.numa_nodes(str(tree.root))
    allowed = os.sched_getaffinity(0)
    assert set(nodes) <= {0, 1} and all(set(c) <= allowed for c in nodes.values())
    assert host_memory.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]


def _gpu_node(**parts) -> dict:
    """A GPU node's benchmarks.host output with made-up figures (what a GPU machine measures), the parts given replaced."""
    node = lambda g: {"cpus": 56, "gbps": g, "threads": 56, "samples_gbps": {"median": g}}  # noqa: E731
    out = {
        "device": "cuda",
        "memory": {"per_node": {"0": node(210.0), "1": node(205.0)}, "method": {"tier": "quick"}},
        "disk": {
            "scratch": "/raid",
            "device": "md0",
            "tool": "fio 3.36",
            "free_bytes": 900 << 30,
            "method": {"tier": "quick"},
            "write": {"gbps": 11.5},
            "read": {"gbps": 24.0},
            "foreign": [],
        },
        "loader": {
            "tokens_per_s_per_gpu": 9.1e6,
            "samples_per_s_per_gpu": 2222,
            "gpus": 8,
            "workers": 111,
            "cpu_us_per_sample": 60,
            "method": {"tier": "quick"},
        },
    }
    out.update(parts)
    return out


def test_a_gpu_nodes_figures_are_judged(tmp_path):
    res = {r["check"]: r for r in host_judge.host(_gpu_node(), _profile())}
    assert all(r["status"] == schema.PASS for r in res.values()), [r["reason"] for r in res.values()]
    assert "NUMA node 0 210 GB/s (56 threads), NUMA node 1 205 GB/s" in res["host_memory_bandwidth"]["reason"]
    assert "no minimum set (host_memory_gbps_min)" in res["host_memory_bandwidth"]["reason"]
    assert "19.4 x GPT-2 124M at llm.c's pace (468k)" in res["data_loader"]["reason"]
    # one socket's memory a fifth slower than its sibling: a DIMM or channel short there
    slow = _gpu_node(memory={"per_node": {"0": {"gbps": 210.0, "threads": 56}, "1": {"gbps": 150.0, "threads": 56}}})
    r = host_judge.memory_result(slow, _profile(), cpu=False)
    assert (
        r["status"] == schema.FAIL
        and "NUMA node 1 150 GB/s is 16.7% below its siblings' median 180 GB/s" in r["reason"]
    )
    assert "generic: this model is not calibrated" in r["reason"] and "dmidecode" in r["remedy"]
    # a loader that cannot feed GPT-2 at llm.c's pace
    starved = _gpu_node(loader={**_gpu_node()["loader"], "tokens_per_s_per_gpu": 300_000})
    r = host_judge.loader_result(starved, _profile(), cpu=False)
    assert r["status"] == schema.FAIL and "under the minimum 468,000 tokens/s a GPU" in r["reason"]
    # a drive under the site's minimum
    r = host_judge.disk_results(_gpu_node(), _profile(disk_read_gbps_min=30), cpu=False)[1]
    assert r["status"] == schema.FAIL and "read of /raid (md0) 24 GB/s is under the minimum 30 GB/s" in r["reason"]


def test_the_scratch_folder_unset_refused_or_full(tmp_path, monkeypatch):
    monkeypatch.delenv(host_disk.SCRATCH_ENV, raising=False)
    out = {"device": "cpu", "disk": host_disk.run("cpu")}
    results = host_judge.disk_results(out, _profile(), cpu=True)
    assert [r["status"] for r in results] == [schema.SKIP, schema.SKIP]
    assert "no scratch folder named (gpufleet_scratch_dir, GPUFLEET_SCRATCH_DIR" in results[0]["reason"]
    for bad, words in (
        ("/dev/nvme0n1", "never a device"),
        ("scratch", "an absolute path"),
        (str(tmp_path / "no"), "no such folder"),
    ):
        r = host_judge.disk_results({"disk": host_disk.run("cpu", scratch=bad)}, _profile(), cpu=True)[0]
        assert r["status"] == schema.ERROR and r["class"] == "configuration" and words in r["reason"], bad
        assert f"gpufleet_scratch_dir (GPUFLEET_SCRATCH_DIR) is {bad!r}" in r["reason"]
    # a drive with less room than the test file and its margin: nothing written, the drive named full
    monkeypatch.setitem(host_disk.MAX_BYTES, "cpu", 1 << 60)
    part = host_disk.run("cpu", scratch=str(tmp_path))
    assert "refused" in part and not list(tmp_path.iterdir())
    r = host_judge.disk_results({"disk": part}, _profile(), cpu=True)[0]
    assert r["status"] == schema.FAIL and r["class"] == "environment" and "the scratch drive is full" in r["reason"]
    # room for the file, under the site's minimum of free space
    monkeypatch.setitem(host_disk.MAX_BYTES, "cpu", 8 << 20)
    part = host_disk.run("cpu", scratch=str(tmp_path))
    r = host_judge.disk_results({"disk": part}, _profile(disk_scratch_free_gib_min=10**7), cpu=True)[1]
    assert r["status"] == schema.FAIL and "under the minimum 1e+07 GiB" in r["reason"] and "du -xsh" in r["remedy"]


def test_a_writer_on_the_scratch_drive_that_is_not_the_runs_disturbs_and_is_named(tmp_path):
    watch = io_watch.IoWatch(str(tmp_path), limit_mib_s=1)
    if watch.device is None or io_watch.disk_counts(watch.device) is None:
        pytest.skip(f"{tmp_path} is on no block device in /proc/diskstats")
    marker, release = tmp_path / "done", tmp_path / "release"
    # it writes, says so, and stays (a neighbour still there when the phase ends) until released
    writer = (
        "import os, time; f = os.open(%r, os.O_WRONLY | os.O_CREAT); b = os.urandom(1 << 20)\n"
        "for _ in range(256): os.write(f, b)\n"
        "os.fsync(f); os.close(f); open(%r, 'w').write(str(os.getpid()))\n"
        "while not os.path.exists(%r): time.sleep(0.1)"
    ) % (str(tmp_path / "hog"), str(marker), str(release))
    watch.start()
    # started by a shell that exits at once: the writer is reparented, no longer in this process's tree
    subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" &', writer], check=True)
    pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 120, "the writer to finish"))
    phase = watch.stop(own_bytes=0, phase="write")
    release.write_text("")
    assert phase["disturbed"] and phase["foreign_mib_s"] > 1, phase
    assert pid in [m["pid"] for m in phase["movers"]], phase["movers"]
    seen = watch.foreign()[0]
    assert (
        seen["kind"] == "host_io" and seen["index"] is None and f"I/O not this run's on {watch.device}" in seen["label"]
    )
    assert "limit 1 MiB/s" in seen["label"]


def test_the_loader_hands_batches_over_and_says_what_a_sample_cost():
    out = host_loader.run("cpu")
    assert out["tokens_per_s_per_gpu"] > 0 and out["samples_tokens_per_s_per_gpu"]["n"] >= 2
    assert out["workers"] >= 1 and out["gpus"] == 0 and out["per_gpu_of"] == 1
    assert "no GPU here: the whole host's figure" == out["method"]["per_gpu"]
    records = host_loader.corpus()
    assert len(records) == host_loader.RECORDS and all(
        len(r) < host_loader.SEQ_TOKENS * host_loader.BYTES_PER_TOKEN for r in records
    )
    assert not list(Path("/dev/shm").glob("psm_*gpufleet*"))  # nothing of ours left in shared memory


def test_fios_report_and_bandwidth_log_give_the_phase(tmp_path):
    # fio 3.x --output-format=json (a warning line before it, as fio prints one), and its --write_bw_log file:
    # "msec, KiB/s, direction, block size, offset" every --log_avg_msec
    report = "fio: this platform does not support process shared mutexes\n" + json.dumps(
        {
            "fio version": "fio-3.36",
            "jobs": [{"jobname": "gpufleet", "write": {"io_bytes": 12 << 30, "runtime": 1000, "bw_bytes": 12 << 30}}],
        }
    )
    log = "250, 11718750, 1, 4194304, 0\n500, 12207031, 1, 4194304, 0\n750, 11962890, 1, 4194304, 0\n"
    got = host_disk.parse_fio(report, log, "write")
    assert got["bytes"] == 12 << 30 and got["seconds"] == 1.0 and got["version"] == "fio-3.36"
    assert got["samples_gbps"] == [11718750 * 1024 / 1e9, 12207031 * 1024 / 1e9, 11962890 * 1024 / 1e9]
