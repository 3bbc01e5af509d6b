"""NCCL's judgement (nccl_measure.run()'s output): each collective's bus bandwidth and correctness inside
a node, the send/recv matrix between GPU pairs, and the transport NCCL used between nodes."""

from __future__ import annotations

from gpufleet.base.registry import registers
from gpufleet.base import profiles, schema
from gpufleet.checks.benchmarks import CPU_NOTE, against_min
from gpufleet.base.schema import ERROR, FAIL, PASS, WARN, result


def _largest(rows):
    good = [r for r in rows if "busbw_gbps" in r]
    return max(good, key=lambda r: r["size_bytes"]) if good else None


ONE_GPU_NCCL = "one GPU on this node: no collective inside it to measure"


@registers("nccl", "judge")
def nccl(out: dict, profile: dict, *, host_has_ib: bool | None = None) -> list[dict]:
    """host_has_ib: whether the node has InfiniBand ports (default: what the measurement says, measure.run_nccl)."""
    if out.get("one_gpu"):
        return [result("nccl", schema.SKIP, ONE_GPU_NCCL)]
    host_has_ib = out.get("host_has_ib") if host_has_ib is None else host_has_ib
    cpu = out["device"] == "cpu"
    base = {
        k: out.get(k) for k in ("method", "world_size", "nnodes", "backend", "rc", "seconds", "nccl_log", "command")
    }
    if out.get("timed_out") or out.get("rc") != 0 or "collectives" not in out:
        why = "timed out and was killed" if out.get("timed_out") else f"exited {out.get('rc')}"
        # The folders a failed run keeps on the node (torchrun's and NCCL's logs) are named, to be read and removed.
        kept = {"kept_folders": [d for d in (out.get("workdir"), out.get("nccl_log_dir")) if d]}
        return [
            result(
                "nccl",
                FAIL,
                f"NCCL benchmark {why}",
                detail={**base, **kept, "log_tail": out.get("log_tail")},
                remedy="read the log tail; a hang across nodes is usually the fabric or a firewall on the rendezvous port",
            )
        ]
    if (
        out.get("world_size") == 1
    ):  # one GPU visible (CUDA_VISIBLE_DEVICES, or a one-GPU node): busbw is 0 by definition
        return [result("nccl", schema.SKIP, ONE_GPU_NCCL, detail=base)]
    res = []
    for name, rows in out["collectives"].items():
        detail = {**base, "rows": rows}
        check = f"nccl_{name}"
        wrong = [r["size_bytes"] for r in rows if not r.get("correct")]
        if wrong:
            res.append(
                result(
                    check,
                    FAIL,
                    f"{name} gave wrong results or failed at sizes {wrong} bytes",
                    detail=detail,
                    remedy="wrong collective results point to a faulty GPU, NVLink or NIC: run gpu_health and the sendrecv matrix",
                )
            )
            continue
        top = _largest(rows)
        what = f"{name} busbw at {schema.size_text(top['size_bytes'])} over {out['world_size']} ranks"
        if name == "all_reduce":
            res.append(
                against_min(
                    check,
                    top["busbw_gbps"],
                    "GB/s",
                    profile,
                    "nccl_allreduce_busbw_gbps_min",
                    what,
                    "compare the transport in detail.nccl_log; check NVLink state, ACS and the NCCL environment",
                    detail,
                    cpu,
                )
            )
        else:
            res.append(
                result(
                    check,
                    schema.SKIP if cpu else PASS,
                    f"{what}: {top['busbw_gbps']} GB/s, results correct" + (f"; {CPU_NOTE}" if cpu else ""),
                    value=top["busbw_gbps"],
                    unit="GB/s",
                    detail=detail,
                )
            )
    if out.get("sendrecv"):
        res.append(_sendrecv(out["sendrecv"], profile, cpu, base))
    if out.get("nnodes", 1) > 1:
        res.append(_inter_node(out["nccl_log"], host_has_ib, base, cpu))
    return res


def _sendrecv(matrix: dict, profile: dict, cpu: bool, base: dict) -> dict:
    cells = [(s, d, c) for s, row in enumerate(matrix["gbps"]) for d, c in enumerate(row) if c is not None]
    wrong = [(s, d) for s, d, c in cells if not c["correct"]]
    detail = {**base, "matrix": matrix}
    if wrong:
        return result(
            "nccl_sendrecv",
            FAIL,
            f"send/recv delivered wrong data on pairs {wrong}",
            detail=detail,
            remedy="a pair that corrupts data: check that NVLink path and both GPUs' health",
        )
    vals = sorted(c["gbps"] for _, _, c in cells)
    median = vals[len(vals) // 2]
    ratio = profiles.value(profile, "nccl_sendrecv_pair_ratio_min")
    slow = [f"{s}->{d} {c['gbps']} GB/s" for s, d, c in cells if c["gbps"] < ratio * median]
    threshold = profiles.threshold(profile, "nccl_sendrecv_pair_ratio_min", min=ratio)
    if cpu:
        return result(
            "nccl_sendrecv",
            schema.SKIP,
            f"{len(cells)} pairs correct; {CPU_NOTE}",
            value=median,
            unit="GB/s",
            threshold=threshold,
            detail=detail,
        )
    if slow:
        return result(
            "nccl_sendrecv",
            FAIL,
            f"slow pairs (under {ratio:.0%} of the median {median} GB/s): {', '.join(slow)}",
            value=vals[0],
            unit="GB/s",
            threshold=threshold,
            detail=detail,
            remedy="the GPUs named share the slow link: check gpu_health.nvlink for them and their NVLink error counters",
        )
    return result(
        "nccl_sendrecv",
        PASS,
        f"{len(cells)} pairs, slowest {vals[0]} GB/s, median {median} GB/s",
        value=vals[0],
        unit="GB/s",
        threshold=threshold,
        detail=detail,
    )


def _inter_node(log: dict, host_has_ib: bool | None, base: dict, cpu: bool) -> dict:
    how = log.get("inter_node")
    detail = {**base, "transports": log.get("transports"), "networks": log.get("networks")}
    if cpu:
        return result(
            "nccl_transport", schema.SKIP, f"gloo on CPU: no NCCL transport to name; {CPU_NOTE}", detail=detail
        )
    if how == "ib_gdr":
        return result(
            "nccl_transport", PASS, "inter-node traffic used InfiniBand with GPUDirect RDMA", value=how, detail=detail
        )
    if how == "ib":
        return result(
            "nccl_transport",
            WARN,
            "inter-node traffic used InfiniBand without GPUDirect RDMA",
            value=how,
            detail=detail,
            remedy="load nvidia_peermem and check NCCL_NET_GDR_LEVEL and ACS (bringup.yml)",
        )
    if how == "socket" and host_has_ib:
        return result(
            "nccl_transport",
            FAIL,
            "inter-node traffic fell back to TCP sockets on a host that has InfiniBand",
            value=how,
            detail=detail,
            remedy="check NCCL_IB_DISABLE, NCCL_IB_HCA and the HCA ports (host_hygiene.infiniband)",
        )
    if how == "socket":
        return result(
            "nccl_transport",
            WARN,
            "inter-node traffic used TCP sockets (no InfiniBand on this host)",
            value=how,
            detail=detail,
        )
    if log.get("transports") and not any(t.startswith("NET") for t in log["transports"]):
        return result(
            "nccl_transport",
            schema.SKIP,
            f"NCCL joined these nodes through {', '.join(log['transports'])}, paths inside one "
            "machine: the nodes of this run share a machine, so there is no network between them to judge",
            detail=detail,
        )
    return result(
        "nccl_transport",
        ERROR,
        "NCCL's log names no inter-node transport",
        value=how,
        detail=detail,
        remedy="run with NCCL_DEBUG=INFO and read the log in detail.nccl_log_dir",
    )
