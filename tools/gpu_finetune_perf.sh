#!/usr/bin/env bash
# Fine-tune performance on a machine with two GPUs, in one go:
#   zero3    the seeds' DeepSpeed ZeRO-3 variant on both GPUs (tools/finetune_sweep.py variant zero3);
#   sweep    the sweep variants named in $VARIANTS, one GPU each, two at a time;
#   profile  then tools/finetune_profile.py on GPU 0 alone (host against GPU time, top kernels).
# Everything is saved under $OUT (one tar file, results.tgz, beside the tables); a short table is printed last.
# Needs: python3 with torch (CUDA), transformers, peft; datasets, liger-kernel and deepspeed (with its
# dependencies) installed or as wheels in ./.whlft.
# Usage: OUT=/path [STEPS="zero3 sweep profile"] [VARIANTS="nogc-compile-drop0"] [PROFILE_ARGS=...] tools/gpu_finetune_perf.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-finetune-perf}
STEPS=${STEPS:-zero3 sweep profile}
VARIANTS=${VARIANTS:-nogc-compile-drop0}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/gpufleet-perf
mkdir -p "$work"
log="$work/run.log"
say() { echo "== $(date +%T) $*" | tee -a "$log"; }

wheels=$(ls .whlft/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels >>"$log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { echo "engine install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >>"$log" 2>&1
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" >>"$log" 2>&1

if [[ " $STEPS " == *" zero3 "* ]]; then
  say "zero3 on GPUs 0,1"
  python3 tools/finetune_sweep.py "$work/zero3" --gpus 0,1 --gpus-per-variant 2 --budget-s 60 --run-timeout-s 300 zero3 \
    >"$work/zero3.txt" 2>>"$log"
fi
if [[ " $STEPS " == *" sweep "* ]]; then
  say "sweep on GPUs 0,1: $VARIANTS"
  python3 tools/finetune_sweep.py "$work/sweep" --gpus 0,1 --budget-s 300 --run-timeout-s 280 $VARIANTS >"$work/sweep.txt" 2>>"$log"
fi
if [[ " $STEPS " == *" profile "* ]]; then
  say "profile on GPU 0"
  CUDA_VISIBLE_DEVICES=0 python3 tools/finetune_profile.py "$work/profile" ${PROFILE_ARGS:-} >"$work/profile.txt" 2>>"$log"
fi
say "done"
tar -czf "$OUT/results.tgz" -C "$work" --exclude='*.safetensors' .
for f in zero3 profile sweep; do
  [ -f "$work/$f.txt" ] && { echo "--- $f"; tail -n 12 "$work/$f.txt"; }
done
