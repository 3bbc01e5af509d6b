#!/usr/bin/env bash
# The acceptance tier's wall time on a GPU machine, this checkout against an older one, alternating so that
# neither profits from a warmer machine, and what each run said of the node:
#   BEFORE=<folder with the older checkout> OUT=<dir> [ROUNDS=2] [ORDER="before after"] [BUDGET_S=540]
#     [TIER=acceptance] [RUNNER=playbook|fleet] [EXPECTED_GPUS=N] bash tools/gpu_tier_time.sh
# A round runs the checkouts in ORDER; each run is `ansible-playbook validate.yml -i inventory/local` (RUNNER
# playbook) or `gpufleet fleet run -i inventory/local` (RUNNER fleet, what an operator types), the engine of its
# checkout installed editable just before it, every run in its checkout's own reports folder (so later runs have
# the earlier ones as history, as on a site). No run starts once BUDGET_S could not hold it (the longest run so
# far, plus a tenth). Each checkout's first run with a report becomes its baseline. A warm-up (torch and CUDA
# loaded once) comes first.
# Needs python3 with torch (CUDA), ansible-playbook (or its wheels in ./.whl). Under $OUT: times.tsv (checkout,
# run id, wall s, exit, the node's verdict, its warn/fail/error/info counts, seconds measured again, the checks
# not passing), tiers.tar.gz (each run's output and report folder); the table is printed last.
set -uo pipefail
: "${BEFORE:?the folder of the older checkout}" "${OUT:?the results folder}"
ROUNDS=${ROUNDS:-2}
ORDER=${ORDER:-before after}
BUDGET_S=${BUDGET_S:-100000}
TIER=${TIER:-acceptance}
RUNNER=${RUNNER:-playbook}
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
start=$SECONDS
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
here=$PWD
BEFORE=$(realpath "$BEFORE")
mkdir -p "$OUT"
work=$(mktemp -d)
# the warm-up, and the GPU count the runs expect (EXPECTED_GPUS, else what torch sees)
gpus=$(python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.device_count())')
gpus=${EXPECTED_GPUS:-$gpus}
vars="{\"gpufleet_thresholds\": {\"gpus_expected\": $gpus}, \"gpufleet_lock_path\": \"$work/lock\"}"
printf 'checkout\trun_id\twall_s\texit\tverdict\twarn\tfail\terror\tinfo\tmeasured_again_s\tnot_passing\n' >"$OUT/times.tsv"
longest=0

summary() {  # REPORT_JSON: the node's verdict, counts, seconds measured again and checks not passing, tab-separated
  python3 - "$1" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no report\t\t\t\t\t\t{type(e).__name__}")
    raise SystemExit
nodes = report.get("nodes", {})
for node in nodes.values() if isinstance(nodes, dict) else nodes:
    counts = node.get("counts", {})
    again = next((f.get("value") for f in node.get("figures", []) if f.get("check") == "benchmark.measured_again"), "")
    bad = [f"{r['check']}={r['status']}" for r in node.get("results", []) if r.get("status") in ("warn", "fail", "error", "info")]
    print("\t".join(str(x) for x in (node.get("verdict"), counts.get("warn", 0), counts.get("fail", 0),
                                     counts.get("error", 0), counts.get("info", 0), again, " ".join(bad) or "-")))
PY
}

runs=0
one() {  # LABEL FOLDER ROUND
  local label=$1 dir=$2 round=$3 t0 rc wall id
  runs=$((runs + 1))
  id="$label-$round-$runs"  # a run id is used once
  (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1) || { echo "$label: install failed"; return; }
  t0=$(date +%s.%N)
  if [ "$RUNNER" = fleet ]; then
    (cd "$dir" && timeout 400 python3 -m gpufleet fleet run -i inventory/local --plain --json --tier "$TIER" --run-id "$id" \
      --reports-dir "$work/reports-$label" -e "$vars" >"$work/$id.log" 2>&1)
  else
    (cd "$dir" && timeout 400 ansible-playbook validate.yml -i inventory/local -e gpufleet_tier="$TIER" \
      -e gpufleet_run_id="$id" -e gpufleet_reports_dir="$work/reports-$label" -e "$vars" >"$work/$id.log" 2>&1)
  fi
  rc=$?
  wall=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$id" "$wall" "$rc" "$(summary "$work/reports-$label/$id/report.json")" >>"$OUT/times.tsv"
  tail -1 "$OUT/times.tsv"
  # The checkout's first run with a report becomes its baseline, as an operator sets one after the first run: a
  # node's stable facts (a lifetime ECC count, say) are then held against it rather than warned in every run.
  if [ ! -f "$work/baseline-$label" ] && [ -f "$work/reports-$label/$id/report.json" ]; then
    (cd "$dir" && python3 -m gpufleet baseline set "$id" --reports-dir "$work/reports-$label") >"$work/baseline-$label" 2>&1
  fi
  longest=$(python3 -c "print(max($longest, $wall))")
}
for round in $(seq "$ROUNDS"); do
  for label in $ORDER; do
    if python3 -c "import sys; sys.exit(0 if $(( SECONDS - start )) + 1.1 * $longest > $BUDGET_S else 1)"; then
      echo "budget: $BUDGET_S s would not hold another run (the longest so far took $longest s)"
      break 2
    fi
    case $label in before) one before "$BEFORE" "$round" ;; after) one after "$here" "$round" ;; *) echo "ORDER: before or after, not $label"; exit 2 ;; esac
  done
done
tar -czf "$OUT/tiers.tar.gz" -C "$work" --exclude='*.db*' --exclude=lock . 2>/dev/null
(cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
python3 - "$OUT/times.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for label in ("before", "after"):
    mine = [r for r in rows if r["checkout"] == label]
    if mine:
        walls = [float(r["wall_s"]) for r in mine]
        print(f"{label:7} runs {len(walls)}  wall s {', '.join(f'{w:.1f}' for w in walls)}  median {statistics.median(walls):.1f}  "
              f"exits {', '.join(r['exit'] for r in mine)}  verdicts {', '.join(r['verdict'] for r in mine)}")
        for r in mine:
            if r["not_passing"] != "-":
                print(f"  {r['run_id']}: {r['not_passing'][:300]}")
b = [float(r["wall_s"]) for r in rows if r["checkout"] == "before"]
a = [float(r["wall_s"]) for r in rows if r["checkout"] == "after"]
if a and b:
    print(f"after / before (medians): {statistics.median(a) / statistics.median(b):.3f}")
PY
