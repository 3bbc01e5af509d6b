#!/usr/bin/env bash
# Every GPU step watched, on a GPU machine, from a checkout, in one go (about 6 minutes on one H200):
#   1 clean:       the acceptance tier's node stage with nothing else on the GPUs, timed: accepted, every figure
#                  `clean` (no confirmation);
#   2 bench:       the same, with a workload of our own (tools/gpu_disturb.py, a bf16 matmul loop) started once
#                  the matmul benchmark is on the GPU and stopped after DISTURB_S: the step is measured again once
#                  quiet, and the run ends not accepted, naming the process and the time (benchmark.matmul_processes);
#   3 soak:        a SOAK_S soak with the same workload started SOAK_DISTURB_AT_S into it for DISTURB_S: the soak
#                  names the slow windows with the process, is measured again once quiet, and is not accepted;
#   4 after:       `gpufleet counters --phase after` while the workload still runs: counters.processes_after fails;
#   5 train:       `gpufleet bench train_gpt2` (the training gate) with the workload started once the gate is on the
#                  GPU: measured again once quiet, and not accepted (benchmark.train_gpt2_processes).
# STEPS picks the steps (default "clean bench soak after train").
# The node stage runs through `ansible-playbook validate.yml` when ansible-playbook runs here (or its wheels are in
# ./.whl), else straight through the engine as the role runs it: check, counters before, bench matmul memory nccl,
# counters after (the run's verdict: schema.verdict over every result).
# Needs: python3 with torch (CUDA) and nvidia-ml-py, nvidia-smi.
# Usage: OUT=/path [STEPS="clean bench soak after train"] [SOAK_S=90] [DISTURB_S=30] [SOAK_DISTURB_AT_S=30] [DISTURB_GPU=0] [THRESHOLDS='{...}'] \
#          bash tools/gpu_watch_run.sh
# Files under $OUT: run.log; steps.tar.gz with <step>/ for each step's output (JSON documents, stderr, the
# workload's log, ansible's output and run folder); summary.json; the short table is printed last.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
SOAK_S=${SOAK_S:-90}
STEPS=${STEPS:-clean bench soak after train}
DISTURB_S=${DISTURB_S:-30}
SOAK_DISTURB_AT_S=${SOAK_DISTURB_AT_S:-30}
TRAIN_DISTURB_AT_S=${TRAIN_DISTURB_AT_S:-5}
TRAIN_DISTURB_S=${TRAIN_DISTURB_S:-20}
DISTURB_GPU=${DISTURB_GPU:-0}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 GPUFLEET_KEEP_LOGS=1
log="$OUT/run.log"
t_start=$(date +%s)
say() { echo "== [$(( $(date +%s) - t_start )) s] $*" | tee -a "$log"; }
now() { date +%s.%N; }
since() { python3 -c "print(round($(now) - $1, 1))"; }

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1 ||
    { say "wheel install failed"; tail "$log"; exit 1; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { say "engine install failed"; tail "$log"; exit 1; }
timeout 60 nvidia-smi >>"$log" 2>&1 || { say "nvidia-smi does not run"; exit 1; }
gpus=$(timeout 120 python3 -c 'import torch; print(torch.cuda.device_count())' 2>>"$log")
name=$(timeout 120 python3 -c 'import torch; print(torch.cuda.get_device_name(0))' 2>>"$log")
[ "${gpus:-0}" -ge 1 ] || { say "no CUDA GPU visible to torch"; exit 1; }
thresholds=$(python3 -c "import json,os; t=json.loads(os.environ.get('THRESHOLDS') or '{}'); t.setdefault('gpus_expected', $gpus); print(json.dumps(t))")
ansible=$(timeout 60 ansible-playbook --version 2>/dev/null | head -1)
mode=$([ -n "$ansible" ] && echo ansible || echo engine)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
say "machine: $gpus x $name; node stage through: $mode ${ansible:-(no ansible-playbook here)}; commit $commit"
printf '%s\n' "$gpus x $name" "$mode ${ansible:-}" "$commit" >"$OUT/machine.txt"

# Nothing of an earlier run may linger on the GPUs: the clean run must start clean.
foreign=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>>"$log")
[ -z "$foreign" ] || say "WARNING: processes on the GPUs before the first run: $foreign"

wait_for() {  # SECONDS COMMAND...: poll every 0.5 s until COMMAND succeeds; 1 when it never did
  local until=$(( $(date +%s) + $1 )); shift
  while [ "$(date +%s)" -lt "$until" ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}
bench_running() { pgrep -f "gpufleet bench $1" >/dev/null; }
gpu_busy() { [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ]; }
ended() { ! kill -0 "$1" 2>/dev/null; }
matmul_or_ended() { bench_running matmul || ended "$1"; }
busy_or_ended() { gpu_busy || ended "$1"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

disturb_start() {  # DIR SECONDS: the workload in the background; its pid in $dpid, its first line in the run log
  python3 tools/gpu_disturb.py --gpu "$DISTURB_GPU" --seconds "$2" --kind matmul >"$1/gpu_disturb.log" 2>&1 &
  dpid=$!
  wait_for 60 grep -q "^gpu_disturb pid" "$1/gpu_disturb.log" || say "the workload said nothing within 60 s"
  python3 -c "import time; print(round(time.time(), 1))" >"$1/disturb-start.epoch"
  say "workload: $(head -1 "$1/gpu_disturb.log")"
}
disturb_stop() {  # DIR: stop the workload if it still runs, and record its end
  kill -TERM "$dpid" 2>/dev/null
  wait "$dpid" 2>/dev/null
  python3 -c "import time; print(round(time.time(), 1))" >"$1/disturb-end.epoch"
  say "workload ended: $(tail -1 "$1/gpu_disturb.log")"
}

node_stage() {  # RUN DIR: the acceptance tier's node stage, in the foreground, its wall time in DIR/wall_s and rc in DIR/rc
  local run=$1 dir=$2 t0 rc
  t0=$(now)
  if [ "$mode" = ansible ]; then
    timeout 500 ansible-playbook validate.yml -i inventory/local -e gpufleet_tier=acceptance -e gpufleet_run_id="$run" \
      -e gpufleet_reports_dir="$dir/reports" -e gpufleet_lock_path=/tmp/gpufleet-watch.lock \
      -e "{\"gpufleet_thresholds\": $thresholds}" >"$dir/ansible.log" 2>&1
    rc=$?
    [ "$rc" -ne 124 ] || rm -f /tmp/gpufleet-watch.lock
  else
    rc=0
    timeout 120 python3 -m gpufleet check --json --thresholds "$thresholds" >"$dir/check.json" 2>"$dir/check.err" || rc=$?
    timeout 120 python3 -m gpufleet counters --phase before --json --thresholds "$thresholds" >"$dir/counters-before.json" \
      2>"$dir/counters-before.err" || rc=$?
    timeout 500 python3 -m gpufleet bench matmul memory nccl --depth quick --json --thresholds "$thresholds" \
      >"$dir/bench.json" 2>"$dir/bench.err" || rc=$?
    timeout 120 python3 -m gpufleet counters --phase after --json --thresholds "$thresholds" >"$dir/counters-after.json" \
      2>"$dir/counters-after.err" || rc=$?
  fi
  since "$t0" >"$dir/wall_s"
  echo "$rc" >"$dir/rc"
  say "$run: exit $rc, $(cat "$dir/wall_s") s"
}

# 1: clean.
if want clean; then
mkdir -p "$OUT/clean"
say "1 clean: the acceptance tier's node stage, nothing else on the GPUs"
node_stage clean "$OUT/clean"
fi

# 2: a workload of our own starts once the matmul benchmark is on the GPU.
if want bench; then
mkdir -p "$OUT/bench"
say "2 bench: the same, with a workload started mid-benchmark for $DISTURB_S s"
node_stage bench "$OUT/bench" &
stage_pid=$!
if wait_for 300 matmul_or_ended "$stage_pid" && bench_running matmul && wait_for 120 busy_or_ended "$stage_pid" && gpu_busy; then
  sleep 2  # the matmul workers past their set-up: the workload meets them measuring
  disturb_start "$OUT/bench" "$DISTURB_S"
else
  say "the matmul benchmark never showed on the GPU; no workload started"
  dpid=
fi
wait "$stage_pid"
[ -z "$dpid" ] || disturb_stop "$OUT/bench"
fi

# 3: a short soak, the workload started SOAK_DISTURB_AT_S into it.
if want soak; then
mkdir -p "$OUT/soak"
say "3 soak: gpufleet bench soak --duration-s $SOAK_S, a workload from $SOAK_DISTURB_AT_S s for $DISTURB_S s"
t0=$(now)
timeout $(( 4 * SOAK_S + 400 )) python3 -m gpufleet bench soak --duration-s "$SOAK_S" --json --thresholds "$thresholds" \
  >"$OUT/soak/soak.json" 2>"$OUT/soak/soak.err" &
soak_pid=$!
if wait_for 300 busy_or_ended "$soak_pid" && gpu_busy; then
  sleep "$SOAK_DISTURB_AT_S"  # from the workers' set-up on: roughly this far into the soak's load
  disturb_start "$OUT/soak" "$DISTURB_S"
else
  say "the soak never showed on the GPU; no workload started"
  dpid=
fi
wait "$soak_pid"
echo $? >"$OUT/soak/rc"
since "$t0" >"$OUT/soak/wall_s"
[ -z "$dpid" ] || disturb_stop "$OUT/soak"
say "soak: exit $(cat "$OUT/soak/rc"), $(cat "$OUT/soak/wall_s") s"
fi

# 4: the counters after the benchmarks, with the workload still on the GPU.
if want after; then
mkdir -p "$OUT/after"
say "4 after: gpufleet counters --phase after beside the workload"
disturb_start "$OUT/after" 60
timeout 120 python3 -m gpufleet counters --phase after --json --thresholds "$thresholds" >"$OUT/after/counters-after.json" \
  2>"$OUT/after/counters-after.err"
echo $? >"$OUT/after/rc"
disturb_stop "$OUT/after"
fi

# 5: the training gate, the workload started once the gate is on the GPU.
if want train; then
mkdir -p "$OUT/train"
say "5 train: gpufleet bench train_gpt2, a workload started once it is on the GPU, for $TRAIN_DISTURB_S s"
t0=$(now)
timeout 500 python3 -m gpufleet bench train_gpt2 --json --thresholds "$thresholds" >"$OUT/train/train.json" \
  2>"$OUT/train/train.err" &
train_pid=$!
if wait_for 300 busy_or_ended "$train_pid" && gpu_busy; then
  sleep "$TRAIN_DISTURB_AT_S"
  disturb_start "$OUT/train" "$TRAIN_DISTURB_S"
else
  say "the training gate never showed on the GPU; no workload started"
  dpid=
fi
wait "$train_pid"
echo $? >"$OUT/train/rc"
since "$t0" >"$OUT/train/wall_s"
[ -z "$dpid" ] || disturb_stop "$OUT/train"
say "train: exit $(cat "$OUT/train/rc"), $(cat "$OUT/train/wall_s") s"
fi

# The summary and the short table.
python3 - "$OUT" <<'EOF' 2>>"$log" | tee -a "$log"
import json, sys
from pathlib import Path

from gpufleet.base import schema

out = Path(sys.argv[1])


def docs(step: Path) -> list:
    """Every host document of a step: the ansible run's report (its nodes' results) or the engine's own."""
    found = []
    for rep in step.glob("reports/*/report.json"):
        try:
            found += [{"results": node["results"]} for node in json.loads(rep.read_text()).get("nodes", {}).values()]
        except (OSError, ValueError, KeyError) as exc:
            found.append({"results": [], "error": f"{rep}: {exc}"})
    for p in sorted(step.glob("*.json")):
        try:
            found.append(json.loads(p.read_text()))
        except (OSError, ValueError) as exc:
            found.append({"results": [], "error": f"{p.name}: {exc}"})
    return found


def read(p: Path):
    try:
        return p.read_text().strip()
    except OSError:
        return None


machine = (out / "machine.txt").read_text().splitlines()
summary = {"machine": machine[0], "node_stage": machine[1], "commit": machine[2], "steps": {}}
for step in ("clean", "bench", "soak", "after", "train"):
    d = out / step
    if not d.is_dir():
        continue
    results = [r for doc in docs(d) for r in doc.get("results") or []]
    errors = [doc["error"] for doc in docs(d) if doc.get("error")]
    log = (d / "gpu_disturb.log")
    summary["steps"][step] = {
        "wall_s": read(d / "wall_s"), "rc": read(d / "rc"), "unreadable": errors,
        "verdict": schema.verdict(results) if results else "no results",
        "accepted": bool(results) and schema.verdict(results) != schema.FAIL,
        "workload": log.read_text().splitlines() if log.exists() else None,
        "workload_epochs": [read(d / "disturb-start.epoch"), read(d / "disturb-end.epoch")],
        "figures": [{k: r.get(k) for k in ("group", "check", "status", "value", "unit", "trust", "seconds")}
                    | {"attempts": len((r.get("detail") or {}).get("attempts") or []),
                       "confirmation_s": (r.get("detail") or {}).get("confirmation_s")}
                    for r in results if r.get("group") == "benchmark"],
        "not_passing": [{k: r.get(k) for k in ("group", "check", "status", "reason", "trust")}
                        for r in results if r.get("status") not in ("pass", "skip")],
    }
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(f"\nmachine: {summary['machine']}; node stage through {summary['node_stage']}; commit {summary['commit']}")
print(f"{'step':6} {'wall s':>7} {'rc':>3} {'verdict':8} accepted")
for step, s in summary["steps"].items():
    print(f"{step:6} {str(s['wall_s']):>7} {str(s['rc']):>3} {s['verdict']:8} {s['accepted']}")
    if s["workload"]:
        print(f"       workload: {s['workload'][0][:150]}")
    for f in s["figures"]:
        print(f"       {f['check']}: {f['status']} {f['value']} {f['unit'] or ''} trust={f.get('trust')} "
              f"attempts={f['attempts']} confirmation_s={f['confirmation_s']} ({f['seconds']} s)")
    for r in s["not_passing"]:
        print(f"       NOT PASSING {r['group']}.{r['check']} {r['status']}: {(r['reason'] or '')[:300]}")
    for e in s["unreadable"]:
        print(f"       unreadable: {e}")
EOF
# What comes back from a lent machine is a few files: the step folders go into one archive.
steps=$(cd "$OUT" && ls -d clean bench soak after train 2>/dev/null)
tar -czf "$OUT/steps.tar.gz" -C "$OUT" $steps && (cd "$OUT" && rm -rf $steps)
say "done in $(( $(date +%s) - t_start )) s; under $OUT: run.log, machine.txt, summary.json, steps.tar.gz (every step's output)"
