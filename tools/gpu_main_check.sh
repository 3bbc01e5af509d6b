#!/usr/bin/env bash
# The engine's GPU-facing tests and the watched node stage, on a GPU machine, from a checkout, in one call:
#   pytest over the test files that read NVML or run the engine (their GPU paths run here, CPU-only ones skip),
#   `gpufleet status` and `gpufleet counters`, then tools/gpu_watch_run.sh with STEPS.
# Needs: python3 with torch (CUDA), nvidia-ml-py, pytest; ansible-core's wheels in ./.whl.
# Usage: OUT=/path [STEPS="clean bench after"] [SOAK_S=90] bash tools/gpu_main_check.sh
set -uo pipefail
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
: "${OUT:?the results folder}"
STEPS=${STEPS:-clean bench after}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/test_counters.py tests/test_nvml_collect.py tests/test_views.py \
  tests/test_watch_cpu.py src/gpufleet/benchmarks/sdc/test_sdc.py >"$OUT/pytest-gpu.txt" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest-gpu.txt")"
python3 -m gpufleet status --count 1 --json >"$OUT/status.json" 2>"$OUT/status.err"; echo "status rc=$?"
python3 -m gpufleet counters --phase after --json >"$OUT/counters-after.json" 2>"$OUT/counters.err"; echo "counters rc=$?"
OUT=$OUT STEPS="$STEPS" bash tools/gpu_watch_run.sh 2>&1 | tail -30
