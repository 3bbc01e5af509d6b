#!/usr/bin/env bash
# The fabric, software and Slurm readings on a GPU machine, from a checkout, in one call, then the node stage:
#   1 `gpufleet collect` and `gpufleet hw`: the software and firmware each node reports (driver, CUDA, VBIOS,
#     InfoROM, HCA firmware, OFED/rdma-core, NCCL, its libraries and net plugin, torch), the InfiniBand ports and
#     the PCIe AER counts, or why each could not be read;
#   2 `gpufleet counters --phase after`: the fabric snapshot beside the GPUs' counters;
#   3 `gpufleet check --slurm-health` (and `=epilog`), timed as slurmd would start it, NVML polled meanwhile for any
#     process of its own on a GPU (tools/slurm_health_time.py);
#   4 the tests of the fabric, the version table and Slurm (those needing Slurm daemons skip where there are none);
#   5 tools/gpu_main_check.sh with STEPS (the GPU-facing tests, status, counters, the watched node stage).
# Needs: python3 with torch (CUDA), nvidia-ml-py, pytest; ansible-core's wheels in ./.whl.
# Usage: OUT=/path [STEPS="clean bench after"] bash tools/gpu_fleet_facts.sh
# Files: $OUT/summary.txt (the short table, printed last) and $OUT/all.tar.gz (every output above).
set -uo pipefail
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
: "${OUT:?the results folder}"
STEPS=${STEPS:-clean bench after}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
thresholds="{\"gpus_expected\": $gpus}"

python3 -m gpufleet collect --out "$OUT/collect.json" 2>"$OUT/collect.err"; echo "collect rc=$?"
python3 -m gpufleet hw >"$OUT/hw.txt" 2>"$OUT/hw.err"; echo "hw rc=$?"
python3 -m gpufleet hw --json >"$OUT/hw.json" 2>>"$OUT/hw.err"
python3 -m gpufleet counters --phase after --json --thresholds "$thresholds" >"$OUT/counters-after.json" 2>"$OUT/counters.err"
echo "counters rc=$?"
python3 tools/slurm_health_time.py --runs 5 --thresholds "$thresholds" >"$OUT/slurm_health.json" 2>"$OUT/slurm_health.err"
echo "slurm health timing rc=$?"
python3 tools/slurm_health_time.py --runs 3 --mode epilog --thresholds "$thresholds" >"$OUT/slurm_health_epilog.json" 2>>"$OUT/slurm_health.err"
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/test_fabric.py tests/test_fleet_versions.py tests/test_slurm.py \
  >"$OUT/pytest-fabric-versions-slurm.txt" 2>&1
echo "pytest (fabric, versions, slurm) rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest-fabric-versions-slurm.txt")"
mkdir -p "$OUT/main"
OUT="$OUT/main" STEPS="$STEPS" bash tools/gpu_main_check.sh >"$OUT/main/output.txt" 2>&1
grep -E "^(pytest|status|counters) rc" "$OUT/main/output.txt"
tail -22 "$OUT/main/output.txt"

python3 - "$OUT" >"$OUT/summary.txt" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
c = json.loads((out / "collect.json").read_text())
from gpufleet.base import schema
v = schema.versions(c)
rows = [(k, v.get(k) if v.get(k) is not None else f"None ({v.get('not_read', {}).get(k)})")
        for k in ("driver", "cuda_driver", "vbios", "inforom_image", "hca_fw", "ofed", "rdma_core", "nccl",
                  "nccl_libraries", "nccl_net_plugin", "torch", "torch_cuda", "kernel", "engine")]
hw = json.loads((out / "hw.json").read_text())
aer = hw.get("aer") or {}
rows.append(("aer", f"present={aer.get('present')} devices={len(aer.get('devices') or [])} reason={aer.get('reason')}"))
ib = hw.get("infiniband") or {}
rows.append(("infiniband", f"present={ib.get('present')} reason={ib.get('reason')}"))
cnt = json.loads((out / "counters-after.json").read_text())
for r in cnt.get("results", []):
    if r["check"].startswith("fabric"):
        rows.append((f"counters.{r['check']}", f"{r['status']}: {r['reason']}"))
for name in ("slurm_health", "slurm_health_epilog"):
    s = json.loads((out / f"{name}.json").read_text())
    rows.append((name, f"{s['gpus']} GPU(s): median {s['wall_s_median']} s, max {s['wall_s_max']} s, rc "
                       f"{sorted({r['rc'] for r in s['runs']})}, own processes on a GPU "
                       f"{sorted({p for r in s['runs'] for p in r['own_processes_on_gpus']})}, stdout "
                       f"{sorted({r['stdout'].strip()[:80] for r in s['runs']})}"))
print("\n== summary")
for k, val in rows:
    print(f"{k:28} {str(val)[:150]}")
PY
cat "$OUT/summary.txt"
tar czf /tmp/all.tar.gz -C "$OUT" . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/all.tar.gz "$OUT/"
