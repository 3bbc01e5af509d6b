"""What the benchmarks share, on the CPU: `gpufleet bench`'s host document, the smoke depth's sizes of each, and the
workers' gathering and GPU identities (bench/). Each benchmark's own tests are in its folder
(src/gpufleet/benchmarks/<name>/test_<name>*.py). These check logic, never performance.
"""

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from gpufleet.benchmarks.nccl import nccl_measure as nccl  # noqa: E402
from gpufleet.benchmarks.matmul import matmul_measure as matmul  # noqa: E402
from gpufleet.benchmarks.memory import memory_measure as memory  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")


@pytest.mark.slow
def test_bench_cli_prints_a_host_document():
    env = dict(os.environ)
    cp = subprocess.run(
        [sys.executable, "-m", "gpufleet", "bench", "matmul", "memory", "--json", "--host", "cpu-box"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["host"] == "cpu-box" and {r["check"] for r in doc["results"]} == {"matmul_bf16", "hbm_bandwidth"}
    assert all(r["group"] == "benchmark" and r["seconds"] >= 0 for r in doc["results"])


# --- the smoke depth, the workers, the GPUs' identities -------------------------------------------------


def test_smoke_tier_sizes():
    assert list(nccl.SIZES["smoke"]) == ["all_reduce"]  # no send/recv matrix, no other collective
    assert nccl.SIZES["smoke"]["all_reduce"] == [1 << 20, 64 << 20, 1 << 30, 4 << 30]
    assert [nccl.iters_for(s, "smoke") for s in nccl.SIZES["smoke"]["all_reduce"]] == [50, 50, 5, 5]
    assert matmul.SHAPES["smoke"] == [(8192, 8192, 8192)] and matmul.ITERS["smoke"] < matmul.ITERS["quick"]
    assert memory.SIZES_BYTES["smoke"]["hbm"] < memory.SIZES_BYTES["quick"]["hbm"]


@pytest.mark.slow
def test_gather_names_a_worker_that_died_and_kills_one_that_hangs():
    import multiprocessing as mp

    from gpufleet.bench import gather

    # Forked, so the answering worker answers at once: a spawned one first imports this module and torch, which
    # can take a busy machine longer than the timeout. gather judges the processes, however they were started.
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_answer, args=(0, queue)),
        ctx.Process(target=os._exit, args=(3,)),
        ctx.Process(target=time.sleep, args=(60,)),
    ]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    got = gather(procs, [0, 1, 2], queue, timeout_s=8, what="worker")
    assert time.monotonic() - t0 < 30
    assert got[0] == {"ok": True}
    assert got[1] == {"error": "worker 1 exited with code 3 without a result"}
    assert got[2] == {"error": "worker 2 gave no result within 8 s and was killed"}
    assert not any(p.is_alive() for p in procs)


def _answer(key, queue):
    queue.put((key, {"ok": True}))


def test_device_uuids_take_nvmls_form():
    import uuid

    from gpufleet.bench import uuid_text

    u = uuid.UUID("df63b106-711b-65ab-d334-1175fcbc7655")
    want = "GPU-df63b106-711b-65ab-d334-1175fcbc7655"
    assert uuid_text(str(u)) == uuid_text(want.upper()) == uuid_text(u.bytes) == uuid_text(list(u.bytes)) == want
    assert uuid_text("not a uuid") is None and uuid_text(None) is None
