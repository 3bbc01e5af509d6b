"""NCCL collectives through torch.distributed, launched with torchrun.

`run()` starts `python -m torch.distributed.run ... -m gpufleet.benchmarks.nccl.nccl_measure --worker` on this host
(on every host of a multi-node run, each with its node rank), waits with a timeout and kills the
whole process group when it passes, then reads rank 0's results and NCCL's own log.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = S / t, where S is the collective's
size in bytes (all_gather: the gathered output; reduce_scatter: the input; all_to_all: one rank's
buffer); busbw = algbw * factor, the factor making busbw comparable to link speed:
    all_reduce       2(n-1)/n    (each byte crosses the links twice: reduce-scatter, then all-gather)
    all_gather       (n-1)/n
    reduce_scatter   (n-1)/n
    all_to_all       (n-1)/n
    send/recv        1
Time t per operation: `iters` operations launched back to back between two CUDA events, divided
by `iters`, measured twice: launched eagerly, and captured once into a CUDA graph that is then
replayed, which removes the Python launch gap that otherwise dominates at small sizes. The faster
of the two counts (`launch` says which); both are kept. NCCL_GRAPH_MIXING_SUPPORT=0: the benchmark
never overlaps captured and uncaptured operations on a communicator, and with the default (1) NCCL
adds synchronization to every captured operation (NVIDIA/nccl issue 1901).
On a machine without CUDA the same code runs with gloo at tiny sizes (logic only).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import tempfile
import warnings

from gpufleet.base import guard
from gpufleet.bench import BENCHMARK_VERSION, DeviceTimer
from gpufleet.bench.launch import torchrun
from gpufleet.bench.monitor import sampled
from gpufleet.base.registry import registers
from gpufleet.base.numbers import significant

MiB, GiB = 1 << 20, 1 << 30
SIZES = {
    # all_reduce only, a few sizes up to the one nccl_allreduce_busbw_gbps_min is set at; no send/recv matrix.
    "smoke": {"all_reduce": [1 * MiB, 64 * MiB, 1 * GiB, 4 * GiB]},
    "quick": {
        "all_reduce": [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB, 4 * GiB],
        "all_gather": [1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB],
        "reduce_scatter": [1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB],
        "all_to_all": [1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB],
        "sendrecv": [256 * MiB],
    },
    "thorough": {
        name: [MiB << i for i in range(13)]  # 1 MiB .. 4 GiB
        for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    }
    | {"sendrecv": [1 * GiB]},
    "cpu": {
        "all_reduce": [4096, 65536],
        "all_gather": [4096, 65536],
        "reduce_scatter": [4096, 65536],
        "all_to_all": [4096, 65536],
        "sendrecv": [65536],
    },
}
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
WARMUP_ITERS = 5
# NCCL's numbering in its TUNING log lines (src/include/nccl_common.h).
NCCL_ALGOS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
NCCL_PROTOS = {0: "LL", 1: "LL128", 2: "Simple"}


def iters_for(size_bytes: int, depth: str) -> int:
    """About 8 GiB moved per measurement, at least 10 and at most 200 operations (smoke: 4 GiB, 5 to 50)."""
    if depth == "cpu":
        return 3
    if depth == "smoke":
        return max(5, min(50, (4 * GiB) // size_bytes))
    return max(10, min(200, (8 * GiB) // size_bytes))


# ---------------------------------------------------------------- worker (one per rank)


def _prepare(torch, dist, name, size, world, rank, device):
    """Buffers for one collective, filled so the result can be checked; returns (op, check)."""
    count = size // 4  # float32 elements
    count -= count % world
    if name == "all_reduce":
        x = torch.full((count,), float(rank + 1), device=device)
        expect = world * (world + 1) / 2

        def op():
            dist.all_reduce(x)

        return op, lambda: bool(torch.all(x == expect))
    if name == "all_gather":
        inp = torch.full((count // world,), float(rank), device=device)
        out = torch.empty(count, device=device)
        ref = torch.arange(world, device=device, dtype=torch.float32).repeat_interleave(count // world)
        return (lambda: dist.all_gather_into_tensor(out, inp)), lambda: bool(torch.equal(out, ref))
    if name == "reduce_scatter":
        inp = torch.full((count,), float(rank + 1), device=device)
        out = torch.empty(count // world, device=device)
        expect = world * (world + 1) / 2
        return (lambda: dist.reduce_scatter_tensor(out, inp)), lambda: bool(torch.all(out == expect))
    if name == "all_to_all":
        chunk = count // world
        # Chunk j of rank r holds r*world + j; after the exchange chunk i of rank r holds i*world + r.
        inp = (rank * world + torch.arange(world, device=device, dtype=torch.float32)).repeat_interleave(chunk)
        out = torch.empty(count, device=device)
        ref = (torch.arange(world, device=device, dtype=torch.float32) * world + rank).repeat_interleave(chunk)
        return (lambda: dist.all_to_all_single(out, inp)), lambda: bool(torch.equal(out, ref))
    raise ValueError(name)


def _time_ops(torch, op, iters, device, use_graph):
    """Seconds per operation, launched eagerly and (on CUDA) replayed from a CUDA graph.

    Returns (best seconds, launch mode of the best, {mode: seconds}). At small sizes the eager
    figure is the Python launch gap, not the fabric; the graph removes it. Both are kept.
    """
    timer = DeviceTimer(device)
    per_mode = {}
    for _ in range(WARMUP_ITERS):
        op()
    timer.start()
    for _ in range(iters):
        op()
    per_mode["eager"] = timer.stop_s() / iters
    if use_graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_ITERS):
                    op()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(iters):
                    op()
            graph.replay()  # warm replay
            torch.cuda.synchronize()
            timer.start()
            graph.replay()
            per_mode["cuda_graph"] = timer.stop_s() / iters
            del graph
        except Exception as exc:  # capture not supported here: keep eager, and say why
            torch.cuda.synchronize()
            per_mode["cuda_graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    timed = {k: v for k, v in per_mode.items() if isinstance(v, float)}
    best = min(timed, key=timed.get)
    return timed[best], best, per_mode


def _sendrecv_matrix(torch, dist, size, rank, world, device, iters):
    """GB/s for every ordered pair (src -> dst) of ranks, one pair at a time."""
    buf = torch.full((size // 4,), float(rank), device=device)
    timer = DeviceTimer(device)
    matrix = [[None] * world for _ in range(world)]
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue
            dist.barrier()
            if rank in (src, dst):
                peer = dst if rank == src else src
                xfer = (lambda: dist.send(buf, peer)) if rank == src else (lambda: dist.recv(buf, peer))
                xfer()  # warm-up, and the communicator for this pair is made here
                timer.start()
                for _ in range(iters):
                    xfer()
                secs = timer.stop_s() / iters
                if rank == dst:
                    ok = bool(torch.all(buf == float(src)))
                    buf.fill_(float(rank))
                    matrix[src][dst] = {"gbps": significant(size / secs / 1e9), "correct": ok}
    gathered = [None] * world
    dist.all_gather_object(gathered, matrix)
    return [
        [next((m[s][d] for m in gathered if m[s][d] is not None), None) for d in range(world)] for s in range(world)
    ]


def depth_sizes(depth: str, max_bytes: int | None = None) -> dict:
    """The depth's sizes per collective, less those above max_bytes (a slow transport measured at its small end)."""
    capped = {name: [s for s in sizes if not max_bytes or s <= max_bytes] for name, sizes in SIZES[depth].items()}
    return {name: sizes for name, sizes in capped.items() if sizes}


def worker(depth: str, out_path: str, use_graph: bool, max_bytes: int | None = None) -> None:
    import torch
    import torch.distributed as dist

    # all_gather_into_tensor / reduce_scatter_tensor: renamed in newer torch, the old names still work.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        use_graph = False
    results: dict = {}
    sizes_of = depth_sizes(depth, max_bytes)
    for name, sizes in sizes_of.items():
        if name == "sendrecv":
            continue
        rows = []
        for size in sizes:
            row = {"size_bytes": size, "iters": iters_for(size, depth)}
            try:
                op, check = _prepare(torch, dist, name, size, world, rank, device)
                op()
                ok = check()
                secs, launch, per_mode = _time_ops(torch, op, row["iters"], device, use_graph)
                algbw = size / secs / 1e9
                row.update(
                    time_us=significant(secs * 1e6),
                    algbw_gbps=significant(algbw),
                    busbw_gbps=significant(algbw * BUS_FACTOR[name](world)),
                    launch=launch,
                    time_us_by_launch={
                        k: significant(v * 1e6) if isinstance(v, float) else v for k, v in per_mode.items()
                    },
                )
            except RuntimeError as exc:  # e.g. a collective gloo does not have
                ok, row["error"] = False, f"{type(exc).__name__}: {str(exc)[:300]}"
            oks = [None] * world
            dist.all_gather_object(oks, ok)
            row["correct"] = all(oks)
            rows.append(row)
            if cuda:
                torch.cuda.empty_cache()
        results[name] = rows
    matrix = None
    if world == local_world and world > 1 and "sendrecv" in sizes_of:  # inside one node only: names a slow NVLink pair
        size = sizes_of["sendrecv"][0]
        matrix = {
            "size_bytes": size,
            "gbps": _sendrecv_matrix(torch, dist, size, rank, world, device, 5 if depth != "cpu" else 2),
        }
    if local_rank == 0:  # every node reports the run; the figures are the same on all
        doc = {
            "node_rank": rank // local_world,
            "world_size": world,
            "nnodes": world // local_world,
            "backend": dist.get_backend(),
            "device": "cuda" if cuda else "cpu",
            "collectives": results,
            "sendrecv": matrix,
            "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        }
        with open(out_path, "w") as f:
            json.dump(doc, f)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- NCCL log


_CHANNEL = re.compile(r"Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\](?: \[\w+\])? via (\S+)")
# "AllReduce: 1048576 Bytes -> Algo RING proto LL ..." (NCCL 2.2x prints names; older ones numbers)
_TUNING = re.compile(r"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_NET = re.compile(r"Using network (\w+)")


def parse_nccl_log(text: str) -> dict:
    """What NCCL itself says it chose: transports per channel, the network plugin, algorithms."""
    transports = sorted(set(_CHANNEL.findall(text)))
    networks = sorted(set(_NET.findall(text)))
    algos: dict = {}
    for coll, size, algo, proto in _TUNING.findall(text):
        if algo.isdigit():
            algo, proto = NCCL_ALGOS.get(int(algo), algo), NCCL_PROTOS.get(int(proto), proto)
        algos.setdefault(coll, {})[int(size)] = f"{algo.upper()}/{proto}"
    net_transports = [t for t in transports if t.startswith("NET/")]
    return {
        "transports": transports,
        "networks": networks,
        "inter_node": (
            None
            if not net_transports
            else "ib_gdr"
            if any(t.startswith("NET/IB") and "GDRDMA" in t for t in net_transports)
            else "ib"
            if any(t.startswith("NET/IB") for t in net_transports)
            else "socket"
            if any(t.startswith("NET/Socket") for t in net_transports)
            else "other"
        ),
        "algorithms": {c: {str(k): v for k, v in sorted(d.items())} for c, d in algos.items()},
    }


# ---------------------------------------------------------------- launcher


def run(
    depth: str = "quick",
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29511,
    nproc_per_node: int | None = None,
    timeout_s: float = 600,
    use_graph: bool = True,
    rdzv_timeout_s: int = 120,
) -> dict:
    import torch

    n_gpus = torch.cuda.device_count()
    requested = depth
    if n_gpus == 0:
        depth = "cpu"
    nproc = nproc_per_node or n_gpus or 2
    log_dir = tempfile.mkdtemp(prefix="gpufleet-nccl-")
    guard.track_dir(log_dir)  # removed should the run be stopped
    args = ["--worker", "--depth", depth] + ([] if use_graph else ["--no-graph"])
    run = torchrun(
        "gpufleet.benchmarks.nccl.nccl_measure", args,
        nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
        master_port=master_port, timeout_s=timeout_s, rdzv_timeout_s=rdzv_timeout_s, prefix="gpufleet-nccl-",
        env_extra={
            # INFO into the benchmark's own files: the transport and algorithm come from NCCL's own words.
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING,NET",
            "NCCL_DEBUG_FILE": os.path.join(log_dir, "nccl.%h.%p.log"),
            "NCCL_GRAPH_MIXING_SUPPORT": os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "0"),
        },
    )  # fmt: skip
    nccl_text = ""
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.*.log"))):
        with open(path, errors="replace") as f:
            nccl_text += f.read()
    keep_logs = run["workdir"] is not None  # kept on failure or with GPUFLEET_KEEP_LOGS
    guard.untrack_dir(log_dir)
    if not keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    return {
        "benchmark": "nccl",
        "device": "cuda" if n_gpus else "cpu",
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "tier": depth,  # the depth, under the name the comparisons' contexts and earlier documents know
            "requested_tier": requested,
            "sizes_bytes": SIZES[depth],
            "warmup_iters": WARMUP_ITERS,
            "iters": "about 4 GiB per measurement, 5 to 50 operations"
            if depth == "smoke"
            else "about 8 GiB per measurement, 10 to 200 operations",
            "timer": "cuda events around back-to-back operations" if n_gpus else "perf_counter",
            "launch": "faster of eager and cuda_graph" if use_graph and n_gpus else "eager",
            "dtype": "float32",
            "busbw": "nccl-tests conventions (doc/PERFORMANCE.md)",
        },
        **{k: run[k] for k in ("command", "rc", "timed_out", "seconds", "log_tail", "workdir")},
        "nccl_log": parse_nccl_log(nccl_text),
        "nccl_log_dir": log_dir if keep_logs else None,
        **run["out"],
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="gpufleet.benchmarks.nccl.nccl_measure")
    p.add_argument("--worker", action="store_true", help="run as one torchrun rank")
    p.add_argument("--depth", default="quick", choices=list(SIZES))
    p.add_argument("--out", required=True)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--max-bytes", type=int, help="leave out the depth's sizes above this (a slow transport)")
    args = p.parse_args(argv)
    worker(args.depth, args.out, not args.no_graph, args.max_bytes)


if __name__ == "__main__":
    main()


@registers("nccl", "run")
def run_nccl(steps) -> dict:
    """In the node stage (steps: measure.NodeSteps, whose torchrun places it): inside a node of one
    GPU there is no collective to measure; the node's InfiniBand ports go with the output."""
    if steps.gpus == 1 and steps.torchrun.get("nnodes", 1) == 1:
        return {"one_gpu": True}
    out = sampled(lambda: run(steps.depth, **steps.torchrun))
    return {**out, "host_has_ib": bool(((steps.readings.get("host") or {}).get("infiniband") or {}).get("ports"))}
