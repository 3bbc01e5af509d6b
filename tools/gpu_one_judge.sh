#!/usr/bin/env bash
# The verdict as an operator meets it on a GPU machine: `gpufleet fleet run -i inventory/local` runs in a plan,
# clean and beside neighbours, each judged by its report, with its wall time and what it measured again.
#   OUT=<dir> PLAN="<step> ..." [BUDGET_S=540] [BEFORE=<older checkout>] [EXPECTED_GPUS=N] [COMMIT=<sha>]
#     bash tools/gpu_one_judge.sh          (COMMIT: the commit the checkout holds, where its .git is not this tree's)
# Steps, run in order while BUDGET_S can hold the next (the longest run of its kind so far, plus a tenth):
#   acc                 the acceptance tier, this checkout
#   before              the acceptance tier from the checkout in $BEFORE (its own reports folder): the base it is
#                       timed against, alternated with `acc` in the plan
#   soak:S              the soak tier, S seconds of soak
#   soak:S:gpu@T+D      the same, a bf16 matmul neighbour (tools/gpu_disturb.py) on GPU 1 (0 on a one-GPU
#                       machine) from T s to T+D s after the run started
#   acc:gpu@T+D         the acceptance tier beside the same neighbour
#   acc:cpu@T+D         the acceptance tier beside busy processes on a third of the host's CPUs, as another user
# Each checkout's first clean acceptance run becomes its baseline (`gpufleet baseline set`), as on a site. Every run's folder
# is kept; each run is also a calibration line (tools/calibration_from_runs.py) under $OUT/calibration.jsonl.gz.
# Needs python3 with torch (CUDA) and nvidia-ml-py, and ansible-core (or its wheels in ./.whl).
# Under $OUT: runs.tsv (step, run id, wall s, exit, verdict, counts, seconds measured again, classes, checks not
# passing), runs.tar.gz (each run's folder and output), calibration.jsonl.gz; the table is printed last.
set -uo pipefail
: "${OUT:?the results folder}" "${PLAN:?the steps to run}"
BUDGET_S=${BUDGET_S:-540}
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$SECONDS
here=$PWD
mkdir -p "$OUT"
nvidia-smi -L >"$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
if [ -d .whl ] && ! python3 -c 'import ansible, ansible_runner' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
work=$(mktemp -d)
# The warm-up (torch and CUDA loaded once), and the GPU count the runs expect (EXPECTED_GPUS, else what torch sees).
gpus=$(python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.device_count())' 2>/dev/null) || gpus=0
gpus=${EXPECTED_GPUS:-$gpus}
[ "$gpus" -gt 0 ] || { echo "no GPU: torch with CUDA sees none (EXPECTED_GPUS=N runs the logic anyway)"; exit 2; }
neighbour_gpu=$((gpus > 1 ? 1 : 0))
vars="{\"gpufleet_thresholds\": {\"gpus_expected\": $gpus}, \"gpufleet_lock_path\": \"$work/lock\"}"
printf 'step\trun_id\twall_s\texit\tverdict\twarn\tfail\terror\tinfo\tmeasured_again_s\tclasses\tnot_passing\n' >"$OUT/runs.tsv"
declare -A longest

summary() {  # REPORT_JSON
  python3 - "$1" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no report\t\t\t\t\t\t\t{type(e).__name__}")
    raise SystemExit
for node in report.get("nodes", {}).values():
    c = node.get("counts", {})
    res = node.get("results", [])
    again = sum(r.get("value") or 0 for r in res if r.get("check") == "measured_again")
    bad = [f"{r['group']}.{r['check']}={r['status']}" + (f"({r.get('trust')})" if r.get("trust") else "")
           for r in res if r.get("status") in ("warn", "fail", "error", "info")]
    classes = sorted({r.get("class") for r in res if r.get("class")})
    print("\t".join(str(x) for x in (node.get("verdict"), c.get("warn", 0), c.get("fail", 0), c.get("error", 0),
                                     c.get("info", 0), round(again, 1), ",".join(classes) or "-", " ".join(bad) or "-")))
PY
}

neighbour() {  # KIND AT_S FOR_S: start it in the background, after AT_S seconds
  local kind=$1 at=$2 for_s=$3 args
  if [ "$kind" = cpu ]; then
    args="--kind cpu --procs $(( $(nproc) / 3 )) --as-user gpufleet-neighbour"
  else
    args="--kind matmul --gpu $neighbour_gpu"
  fi
  (sleep "$at"; exec python3 tools/gpu_disturb.py $args --seconds "$for_s") >>"$OUT/neighbours.log" 2>&1 &
  echo $!
}

one() {  # STEP
  local step=$1 kind tier dir label extra=() rc t0 wall id pid=""
  IFS=: read -r kind a b <<<"$step"
  dir=$here label=after
  if [ "$kind" = before ]; then
    [ -d "${BEFORE:-}" ] || { echo "skip $step: BEFORE names no checkout"; return 1; }
    dir=$(realpath "$BEFORE") label=before kind=acc
  fi
  tier=acceptance a_s=0
  if [ "$kind" = soak ]; then tier=soak a_s=$a; extra=(--soak-duration-s "$a"); a=$b; fi
  # Before a step has run here, a guess of its length: a soak's S s and its checks, a neighbour's re-measure.
  local guess=70
  [ "$tier" = soak ] && guess=$((a_s + 40))
  [[ "$step" == *@* ]] && guess=$((guess + 90))
  local need=${longest[$step]:-$guess}
  if [ $((SECONDS - start + need + need / 10)) -gt "$BUDGET_S" ]; then echo "skip $step: the budget"; return 1; fi
  id="$label-$(date -u +%H%M%S)-${step//[:@+]/_}"
  (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
  if [[ "$a" == gpu@* || "$a" == cpu@* ]]; then
    local what=${a%%@*} span=${a#*@}
    pid=$(neighbour "$what" "${span%%+*}" "${span#*+}")
  fi
  t0=$SECONDS
  (cd "$dir" && python3 -m gpufleet fleet run -i inventory/local --plain --json --tier "$tier" "${extra[@]}" \
    --reports-dir "$work/reports-$label" --run-id "$id" -e "$vars") >"$work/$id.out" 2>&1
  rc=$?
  wall=$((SECONDS - t0))
  [ -n "$pid" ] && wait "$pid" 2>/dev/null
  [ "$wall" -gt "${longest[$step]:-0}" ] && longest[$step]=$wall
  printf '%s\t%s\t%s\t%s\t%s\n' "$step" "$id" "$wall" "$rc" "$(summary "$work/reports-$label/$id/report.json")" >>"$OUT/runs.tsv"
  if [ -z "${based[$label]:-}" ] && [ -z "$pid" ] && [ "$tier" = acceptance ] && [ -f "$work/reports-$label/$id/report.json" ]; then
    (cd "$dir" && python3 -m gpufleet baseline set "$id" --reports-dir "$work/reports-$label" >/dev/null) && based[$label]=$id
  fi
  echo "[$((SECONDS - start)) s] $step: $id $wall s, exit $rc"
  # Each run's folder and output kept as it ends: a call stopped at its limit loses none of the runs before.
  (cd "$work" && tar czf "$OUT/runs.tar.gz" --exclude='*.db*' reports-* *.out 2>/dev/null)
}

declare -A based
for step in $PLAN; do
  one "$step" || true
done
(cd "$work" && tar czf "$OUT/runs.tar.gz" --exclude='*.db*' reports-* *.out 2>/dev/null)
runs=$(ls -d "$work"/reports-after/*/ 2>/dev/null)
if [ -n "$runs" ]; then
  python3 tools/calibration_from_runs.py $runs --machine "$(hostname)-x$gpus" --out "$OUT/calibration.jsonl.gz" \
    --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo '?')}" >"$OUT/calibration.log" 2>&1 || tail -3 "$OUT/calibration.log"
fi
echo
python3 -c 'import sys; rows=[l.rstrip("\n").split("\t") for l in open(sys.argv[1])]; w=[max(len(r[i]) for r in rows if i < len(r)) for i in range(11)]; [print("  ".join(c.ljust(w[i]) for i, c in enumerate(r[:11])) + "  " + (r[11][:300] if len(r) > 11 else "")) for r in rows]' "$OUT/runs.tsv"
