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
#   soak:S:slow         the soak tier, its windows' limit (soak_slowdown_pct_max) set to 0.01% for the run, so that
#                       a window slows past it with nothing seen and the soak's bounded re-measure runs as its
#                       confirmation: what that costs on GPUs (measured_again), not a verdict
#   acc:gpu@T+D         the acceptance tier beside the same neighbour
#   acc:cpu@T+D         the acceptance tier beside busy processes on a third of the host's CPUs, as another user
#   acc:memcpy@T+D      the acceptance tier beside processes copying memory, a core each on about 7% of the CPUs
#                       (under host_foreign_cpu_share_max with room for the host's own daemons), as another
#                       user
#   confirm1            `gpufleet bench memory` handed a baseline whose GPU 1 (0) host-to-device figure is 100 GB/s,
#                       so that figure is past its limit and measured again to confirm it: the seconds of its first
#                       measurement and of the confirmation, this checkout's and $BEFORE's (where given)
# Each checkout's first clean acceptance run becomes its baseline (`gpufleet baseline set`), as on a site. Every run's folder
# is kept; each run with no neighbour of ours and no forced limit is also a calibration line
# (tools/calibration_from_runs.py) under $OUT/calibration.jsonl.gz.
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

summary() {  # KIND FILE: a run's report (run) or the memory step's document (confirm1), as runs.tsv's columns
  python3 - "$1" "$2" <<'PY'
import json, sys
kind, path = sys.argv[1:]
try:
    doc = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"no {'report' if kind == 'run' else 'document'}\t\t\t\t\t\t\t{type(e).__name__}")
    raise SystemExit
if kind == "confirm1":  # the h2d result, its measurements' seconds and what the confirmation measured
    res = next((r for r in doc.get("results", []) if r.get("check") == "pcie_h2d_bandwidth"), {})
    tries = (res.get("detail") or {}).get("attempts") or []
    again = sum(a.get("seconds") or 0 for a in tries if a.get("purpose") == "confirm")
    what = "; ".join(f"{a['purpose']} {a.get('seconds')} s ({a.get('measured') or 'the whole step'})" for a in tries)
    print("\t".join(str(x) for x in (res.get("status"), "-", "-", "-", "-", round(again, 1), res.get("class") or "-", what or "-")))
    raise SystemExit
for node in doc.get("nodes", {}).values():
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

neighbour() {  # KIND AT_S FOR_S: start it in the background, after AT_S seconds; its pid in $neighbour_pid
  local kind=$1 at=$2 for_s=$3 args
  case $kind in
    cpu) args="--kind cpu --procs $(( $(nproc) / 3 )) --as-user gpufleet-neighbour" ;;
    memcpy) args="--kind memcpy --procs $(( $(nproc) * 70 / 1000 > 0 ? $(nproc) * 70 / 1000 : 1 )) --as-user gpufleet-neighbour" ;;
    *) args="--kind matmul --gpu $neighbour_gpu" ;;
  esac
  (sleep "$at"; exec python3 tools/gpu_disturb.py $args --seconds "$for_s") >>"$OUT/neighbours.log" 2>&1 &
  neighbour_pid=$!  # a child of this shell, not of a $(...) subshell: so that `wait` can wait for it
}

confirm1() {  # the memory step with one GPU's host-to-device figure past a baseline of 100 GB/s, each checkout
  local uuid refs label dir t0 rc
  uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$neighbour_gpu" | tr -d ' ')
  refs="{\"baseline\": {\"run_id\": \"confirm1\", \"rows\": [{\"host\": \"localhost\", \"metric\": \"pcie_h2d_gbps\","
  refs+=" \"context\": \"tier=quick\", \"value\": 100, \"uuid\": \"$uuid\", \"gpu_index\": $neighbour_gpu, \"cpu\": false, \"unit\": \"GB/s\"}]}}"
  for label in after before; do
    dir=$here
    if [ "$label" = before ]; then
      [ -d "${BEFORE:-}" ] || { echo "skip confirm1 before: BEFORE names no checkout"; continue; }
      dir=$(realpath "$BEFORE")
    fi
    if [ $((SECONDS - start + 90)) -gt "$BUDGET_S" ]; then echo "skip confirm1 $label: the budget"; continue; fi
    (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
    t0=$SECONDS
    (cd "$dir" && python3 -m gpufleet bench memory --references "$refs" --thresholds "{\"gpus_expected\": $gpus}" --json) \
      >"$work/confirm1-$label.json" 2>"$work/confirm1-$label.err"
    rc=$?
    printf 'confirm1\t%s\t%s\t%s\t%s\n' "$label" $((SECONDS - t0)) "$rc" "$(summary confirm1 "$work/confirm1-$label.json")" >>"$OUT/runs.tsv"
    echo "[$((SECONDS - start)) s] confirm1 $label: $((SECONDS - t0)) s, exit $rc"
    keep
  done
  (cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
}

one() {  # STEP
  local step=$1 kind tier dir label extra=() rc t0 wall id pid="" run_vars=$vars
  IFS=: read -r kind a b <<<"$step"
  if [ "$kind" = confirm1 ]; then confirm1; return; fi
  dir=$here label=after
  if [ "$kind" = before ]; then
    [ -d "${BEFORE:-}" ] || { echo "skip $step: BEFORE names no checkout"; return 1; }
    dir=$(realpath "$BEFORE") label=before kind=acc
  fi
  tier=acceptance a_s=0
  if [ "$kind" = soak ]; then tier=soak a_s=$a; extra=(--soak-duration-s "$a"); a=$b; fi
  if [ "$a" = slow ]; then
    run_vars="{\"gpufleet_thresholds\": {\"gpus_expected\": $gpus, \"soak_slowdown_pct_max\": 0.01}, \"gpufleet_lock_path\": \"$work/lock\"}"
  fi
  # Before a step has run here, a guess of its length: a soak's S s and its checks, a neighbour's re-measure.
  local guess=70
  [ "$tier" = soak ] && guess=$((a_s + 40))
  [ "$a" = slow ] && guess=$((guess + 100))  # a warm-up window and two more, measured again
  [[ "$step" == *@* ]] && guess=$((guess + 90))
  local need=${longest[$step]:-$guess}
  if [ $((SECONDS - start + need + need / 10)) -gt "$BUDGET_S" ]; then echo "skip $step: the budget"; return 1; fi
  id="$label-$(date -u +%H%M%S)-${step//[:@+]/_}"
  (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1)
  if [[ "$a" == gpu@* || "$a" == cpu@* || "$a" == memcpy@* ]]; then
    local what=${a%%@*} span=${a#*@}
    neighbour "$what" "${span%%+*}" "${span#*+}"
    pid=$neighbour_pid
  fi
  t0=$SECONDS
  (cd "$dir" && python3 -m gpufleet fleet run -i inventory/local --plain --json --tier "$tier" "${extra[@]}" \
    --reports-dir "$work/reports-$label" --run-id "$id" -e "$run_vars") >"$work/$id.out" 2>&1
  rc=$?
  wall=$((SECONDS - t0))
  [ -n "$pid" ] && wait "$pid" 2>/dev/null
  [ "$wall" -gt "${longest[$step]:-0}" ] && longest[$step]=$wall
  [ -n "$pid" ] || [ "$a" = slow ] && planted[$id]=1  # not a clean run: no calibration line
  printf '%s\t%s\t%s\t%s\t%s\n' "$step" "$id" "$wall" "$rc" "$(summary run "$work/reports-$label/$id/report.json")" >>"$OUT/runs.tsv"
  if [ -z "${based[$label]:-}" ] && [ -z "$pid" ] && [ "$tier" = acceptance ] && [ -f "$work/reports-$label/$id/report.json" ]; then
    (cd "$dir" && python3 -m gpufleet baseline set "$id" --reports-dir "$work/reports-$label" >/dev/null) && based[$label]=$id
  fi
  echo "[$((SECONDS - start)) s] $step: $id $wall s, exit $rc"
  keep
}

keep() {  # each run's folder and output kept as it ends: a call stopped at its limit loses none of the runs before
  (cd "$work" && tar czf "$OUT/runs.tar.gz" --exclude='*.db*' reports-* *.out confirm1-* 2>/dev/null)
}

declare -A based planted
for step in $PLAN; do
  one "$step" || true
done
keep
runs=""
for run in "$work"/reports-after/*/; do
  [ -d "$run" ] && [ -z "${planted[$(basename "$run")]:-}" ] && runs+=" $run"
done
if [ -n "$runs" ]; then
  python3 tools/calibration_from_runs.py $runs --machine "$(hostname)-x$gpus" --out "$OUT/calibration.jsonl.gz" \
    --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo '?')}" >"$OUT/calibration.log" 2>&1 || tail -3 "$OUT/calibration.log"
fi
echo
python3 -c 'import sys; rows=[l.rstrip("\n").split("\t") for l in open(sys.argv[1])]; w=[max(len(r[i]) for r in rows if i < len(r)) for i in range(11)]; [print("  ".join(c.ljust(w[i]) for i, c in enumerate(r[:11])) + "  " + (r[11][:300] if len(r) > 11 else "")) for r in rows]' "$OUT/runs.tsv"
