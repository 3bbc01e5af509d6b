#!/usr/bin/env bash
# Acceptance run on a GPU machine, from a checkout, in one go:
#   record NVML/sysfs readings, run `ansible-playbook validate.yml -i inventory/local` (node checks and
#   the quick benchmark tier), an all-reduce straight through NCCL to judge ours against, and the
#   thorough matmul sweep to judge the quick figure;
#   save everything under $OUT and print a short table last.
# Needs: python3 with torch (CUDA) and nvidia-ml-py; ansible-core, or its wheels in ./.whl.
# Usage: OUT=/path EXPECTED_GPUS=2 [THRESHOLDS='{"nccl_allreduce_busbw_gbps_min": 340}'] tools/gpu_run.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 GPUFLEET_KEEP_LOGS=1
log="$OUT/run.log"
say() { echo "== $*" | tee -a "$log"; }

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { echo "engine install failed"; tail "$log"; exit 1; }

gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))')
expected=${EXPECTED_GPUS:-$gpus}
thresholds=$(python3 -c "import json,os; t=json.loads(os.environ.get('THRESHOLDS') or '{}'); t.setdefault('gpus_expected', $expected); print(json.dumps(t))")
say "machine: $gpus x $name; thresholds override: $thresholds"
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv >>"$log" 2>&1

say "record readings"
python3 -m gpufleet collect --out "$OUT/recorded-$name-x$gpus.json" 2>>"$log"

say "ansible-playbook validate.yml -i inventory/local"
start=$(date +%s)
ansible-playbook validate.yml -i inventory/local -e gpufleet_run_id=gpu-run \
  -e "{\"gpufleet_thresholds\": $thresholds}" >>"$log" 2>&1
validate_rc=$?
validate_s=$(( $(date +%s) - start ))
cp reports/gpu-run/report.json "$OUT/validate-report.json" 2>>"$log"
cp reports/gpu-run/report.md "$OUT/validate-report.md" 2>>"$log"

if [ "$gpus" -ge 2 ] && command -v nvcc >/dev/null; then
  say "NCCL reference: all-reduce straight through NCCL (tools/nccl_reference)"
  nvcc -O2 -o /tmp/allreduce_ref tools/nccl_reference/allreduce_ref.cu -lnccl >>"$log" 2>&1 &&
    /tmp/allreduce_ref $((1 << 20)) $((1 << 32)) >"$OUT/nccl-reference.jsonl" 2>>"$log"
fi

say "matmul sweep (thorough tier)"
python3 -m gpufleet bench matmul --depth thorough --json --thresholds "$thresholds" >"$OUT/bench-matmul-sweep.json" 2>>"$log"

tar czf "$OUT/nccl-logs.tar.gz" -C /tmp $(cd /tmp && ls -d gpufleet-nccl-* 2>/dev/null) 2>>"$log"
python3 tools/gpu_run_table.py "$OUT" "$validate_rc" "$validate_s"
