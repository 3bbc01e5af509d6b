#!/usr/bin/env bash
# The acceptance tier's wall time on a GPU machine, this checkout against an older one, alternating so that
# neither profits from a warmer machine:
#   BEFORE=<folder with the older checkout> OUT=<dir> [ROUNDS=2] [TIER=acceptance] bash scripts/gpu_tier_time.sh
# Each round runs `ansible-playbook validate.yml` (inventory/local) from the older checkout, then from this one,
# each engine installed editable just before its run; a warm-up (torch and CUDA loaded once) comes first.
# Needs python3 with torch (CUDA), ansible-playbook (or its wheels in ./.whl). Under $OUT: times.tsv (checkout,
# round, wall s, exit), tiers.tar.gz (each run's ansible output and report folder); the table is printed last.
set -uo pipefail
: "${BEFORE:?the folder of the older checkout}" "${OUT:?the results folder}"
ROUNDS=${ROUNDS:-2}
TIER=${TIER:-acceptance}
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
here=$PWD
work=$(mktemp -d)
gpus=$(python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.device_count())')  # the warm-up
thresholds="{\"gpus_expected\": $gpus}"
printf 'checkout\tround\twall_s\texit\n' >"$OUT/times.tsv"
one() {  # LABEL FOLDER ROUND
  local label=$1 dir=$2 round=$3 t0 rc
  (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1) || { echo "$label: install failed"; return; }
  t0=$(date +%s.%N)
  (cd "$dir" && timeout 400 ansible-playbook validate.yml -i inventory/local -e gpufleet_tier="$TIER" \
    -e gpufleet_run_id="$label-$round" -e gpufleet_reports_dir="$work/reports-$label" -e gpufleet_lock_path="$work/lock" \
    -e "{\"gpufleet_thresholds\": $thresholds}" >"$work/ansible-$label-$round.log" 2>&1)
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$label" "$round" "$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" "$rc" >>"$OUT/times.tsv"
  tail -1 "$OUT/times.tsv"
}
for round in $(seq "$ROUNDS"); do
  one before "$BEFORE" "$round"
  one after "$here" "$round"
done
tar -czf "$OUT/tiers.tar.gz" -C "$work" . 2>/dev/null
(cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
python3 - "$OUT/times.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for label in ("before", "after"):
    walls = [float(r["wall_s"]) for r in rows if r["checkout"] == label]
    exits = [r["exit"] for r in rows if r["checkout"] == label]
    if walls:
        print(f"{label:7} runs {len(walls)}  wall s {', '.join(f'{w:.1f}' for w in walls)}  median {statistics.median(walls):.1f}  exits {', '.join(exits)}")
b = [float(r["wall_s"]) for r in rows if r["checkout"] == "before"]
a = [float(r["wall_s"]) for r in rows if r["checkout"] == "after"]
if a and b:
    print(f"after / before (medians): {statistics.median(a) / statistics.median(b):.3f}")
PY
