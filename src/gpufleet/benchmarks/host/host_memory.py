"""Host memory bandwidth per NUMA node: a STREAM-style triad, a = b + s x c over float64 arrays, on every CPU of
the node at once (a thread each, pinned to it) and the node's own memory (each thread touches its arrays first,
so the kernel places their pages on its node). Every node measures at the same time, each timed on its own, as a
training job loads them all.

numpy does the triad in two passes, `multiply(c, s, out=a)` then `add(a, b, out=a)`: the first reads c and writes a,
the second reads a and b and writes a, 40 bytes an element where STREAM's one loop moves 24 (b and c read, a
written; neither counts the cache's write-allocate reads). The figure is those 40 bytes an element over the time of
both passes: the rate at which the node's memory moved data, comparable with STREAM's triad. Each sample times
one triad of every thread of the node between two barriers; the figure is the median sample. The arrays of a node
together are far larger than its caches (the quick depth: 3 GiB a node, 1 GiB an array: STREAM asks each array to be
4 x the caches, so up to 256 MiB of last-level cache a node).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gpufleet.bench import BENCHMARK_VERSION, summarize
from gpufleet.base.numbers import significant
from gpufleet.collect.host.files import parse_cpulist

BYTES_PER_NODE = {"smoke": 768 << 20, "quick": 3 << 30, "thorough": 12 << 30, "cpu": 48 << 20}
SAMPLES = {"smoke": 5, "quick": 8, "thorough": 20, "cpu": 4}
MAX_THREADS = 64  # memory bandwidth saturates long before every CPU of a large socket is busy
BYTES_PER_ELEMENT = 40  # the two passes: c read, a written; a and b read, a written
SCALAR = 3.0


def numa_nodes(root: str = "/") -> dict[int, list[int]]:
    """NUMA node -> the CPUs of it this process may run on; a node without any (memory only) left out. Without
    NUMA in sysfs, node 0 holds every CPU allowed."""
    allowed = os.sched_getaffinity(0)
    base = Path(root) / "sys/devices/system/node"
    nodes = {}
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = [c for c in parse_cpulist((d / "cpulist").read_text()) if c in allowed]
        except OSError:
            continue
        if cpus:
            nodes[int(d.name[4:])] = cpus
    return nodes or {0: sorted(allowed)}


def _triad_on(cpus: list[int], total_bytes: int, samples: int) -> dict:
    """The triad on these CPUs, a thread pinned to each: {"gbps", "samples_gbps", "threads", "elements"}."""
    import numpy as np

    threads_n = len(cpus)
    per = max(1024, total_bytes // (24 * threads_n))  # elements of each of a thread's three arrays
    ready = threading.Barrier(threads_n + 1)
    start, done = threading.Barrier(threads_n + 1), threading.Barrier(threads_n + 1)
    errors: list[str] = []

    def work(cpu: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # this thread only: its pages land on its node at first touch
            a, b, c = np.empty(per), np.full(per, 1.0), np.full(per, 2.0)
            a.fill(0.0)
        except Exception as exc:
            errors.append(f"CPU {cpu}: {type(exc).__name__}: {exc}")
            ready.abort()
            return
        ready.wait()
        for _ in range(samples):
            start.wait()
            np.multiply(c, SCALAR, out=a)
            np.add(a, b, out=a)
            done.wait()

    pool = [threading.Thread(target=work, args=(cpu,), daemon=True) for cpu in cpus]
    for t in pool:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        for t in pool:
            t.join()
        return {"error": "; ".join(errors) or "a thread did not start"}
    seconds = []
    for _ in range(samples):
        start.wait()
        t0 = time.perf_counter()
        done.wait()
        seconds.append(time.perf_counter() - t0)
    for t in pool:
        t.join()
    moved = BYTES_PER_ELEMENT * per * threads_n
    gbps = [moved / s / 1e9 for s in seconds]
    return {
        "gbps": significant(summarize(gbps)["median"]),
        "samples_gbps": summarize(gbps),
        "threads": threads_n,
        "elements_per_thread": per,
        "bytes_per_sample": moved,
    }


def run(depth: str = "quick", root: str = "/") -> dict:
    """Every NUMA node's triad, all at once, each timed on its own."""
    nodes = numa_nodes(root)
    per_node: dict[str, dict] = {}

    def node_run(node: int, cpus: list[int]) -> None:
        chosen = cpus[:: max(1, -(-len(cpus) // MAX_THREADS))]
        try:
            per_node[str(node)] = {"cpus": len(cpus), **_triad_on(chosen, BYTES_PER_NODE[depth], SAMPLES[depth])}
        except Exception as exc:  # one node's failure keeps the others
            per_node[str(node)] = {"cpus": len(cpus), "error": f"{type(exc).__name__}: {exc}"}

    runs = [threading.Thread(target=node_run, args=item, daemon=True) for item in nodes.items()]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    per_node = dict(sorted(per_node.items(), key=lambda kv: int(kv[0])))
    figures = [v["gbps"] for v in per_node.values() if "gbps" in v]
    return {
        "per_node": per_node,
        "slowest_gbps": min(figures) if figures else None,
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "tier": depth,
            "what": "a = b + 3.0 x c over float64 arrays, numpy's two passes (multiply, then add), every thread of a "
            "node pinned to one of its CPUs with its arrays on the node's memory",
            "bytes_counted": f"{BYTES_PER_ELEMENT} an element (c read, a written; a and b read, a written), "
            "write-allocate not counted, as STREAM does",
            "bytes_per_node": BYTES_PER_NODE[depth],
            "nodes": "all at once, each timed on its own",
            "samples": SAMPLES[depth],
            "max_threads": MAX_THREADS,
            "timer": "perf_counter between two barriers",
            "statistic": "median",
        },
    }
