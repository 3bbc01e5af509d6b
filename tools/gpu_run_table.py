"""Short table of a tools/gpu_run.sh run: validate verdicts, benchmark figures, quick vs sweep."""

import json
import sys
from pathlib import Path


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def main(out, validate_rc, validate_s):
    out = Path(out)
    rep = load(out / "validate-report.json")
    print(f"validate.yml: exit {validate_rc}, {validate_s} s, fleet verdict {rep.get('verdict')}")
    for host, node in (rep.get("nodes") or {}).items():
        for r in node["results"]:
            if r["group"] != "benchmark":
                print(f"  {host:10} {r['group'] or '':13} {r['check']:22} {r['status']:5} {r['reason'][:110]}")
    quick = {
        "results": [
            r for node in (rep.get("nodes") or {}).values() for r in node["results"] if r["group"] == "benchmark"
        ]
    }
    print(
        f"benchmarks, quick tier: {sum(r['seconds'] for r in quick['results'] if r['check'] in ('matmul_bf16', 'hbm_bandwidth', 'nccl_all_reduce', 'nccl'))} s"
    )
    for r in quick["results"]:
        val = f"{r['value']} {r['unit'] or ''}" if r.get("value") is not None else ""
        print(f"  {r['check']:22} {r['status']:5} {val:>16}  {r['reason'][:100]}")
    sweep = load(out / "bench-matmul-sweep.json")
    quick_mm = next((r for r in quick.get("results", []) if r["check"] == "matmul_bf16"), None)
    sweep_mm = next((r for r in sweep.get("results", []) if r["check"] == "matmul_bf16"), None)
    if quick_mm and sweep_mm:
        for gpu, q in quick_mm["detail"]["per_gpu"].items():
            s = sweep_mm["detail"]["per_gpu"][gpu]
            best = sweep_mm["detail"]["per_shape"][gpu]["bf16"]
            top = max(best, key=lambda x: x["tflops"]["median"])
            print(
                f"  GPU {gpu} bf16: quick {q['bf16']} TFLOPS, sweep best {s['bf16']} at {top['shape_mnk']}: "
                f"quick/sweep = {q['bf16'] / s['bf16']:.3f}"
            )

    ref_path = out / "nccl-reference.jsonl"
    ours = next((r for r in quick.get("results", []) if r["check"] == "nccl_all_reduce"), None)
    if ref_path.exists() and ours:
        ref = {row["size_bytes"]: row for row in map(json.loads, ref_path.read_text().split("\n")[:-1])}
        print("  all_reduce busbw, gpufleet (torch.distributed) vs NCCL called directly:")
        for row in ours["detail"]["rows"]:
            r = ref.get(row["size_bytes"])
            if r:
                print(
                    f"    {row['size_bytes'] >> 20:5} MiB  {row['busbw_gbps']:7.1f} vs {r['busbw_gbps']:7.1f} GB/s  "
                    f"= {row['busbw_gbps'] / r['busbw_gbps']:.2f}  ({row['launch'][:10]})"
                )


if __name__ == "__main__":
    main(*sys.argv[1:])
