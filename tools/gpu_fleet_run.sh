#!/usr/bin/env bash
# The fleet layer on a GPU machine, from a checkout, in two phases (the soak outlasts what one go may take):
#   A: validate.yml at the smoke tier; at the acceptance tier, set as the baseline; at the acceptance tier again
#      beside a workload of our own on one GPU (tools/gpu_disturb.py), judged against that baseline; then
#      `gpufleet status` and `gpufleet hw` on the idle GPUs; then the soak starts in its own process session
#      (setsid) and `gpufleet status --json` is read every STATUS_EVERY_S until PHASE_A_S have passed;
#   B: wait for the soak (at most WAIT_S), collect it, print the short table of both phases.
# The tiers run first and one after the other, so each is measured on GPUs that nothing else uses
# (the disturbed run on purpose excepted); the soak loads every GPU, so it comes last.
# Needs: python3 with torch (CUDA) and nvidia-ml-py; ansible-core, or its wheels in ./.whl.
# Usage: OUT=/path [EXPECTED_GPUS=N] [SOAK_S=640] [DISTURB_GPU=0] [PHASE_A_S=540] [WAIT_S=570] \
#          tools/gpu_fleet_run.sh A|B
# Files under $OUT: run-A.log, fleet-A.tar.gz (the run folders, status, hw, the disturbing workload's log),
# summary-A.json; run-B.log, soak.json, soak.log, summary.json (both phases).
set -uo pipefail
phase=${1:-}
case "$phase" in A | B) ;; *) echo "usage: $0 A|B" >&2; exit 2 ;; esac
OUT=${OUT:-$PWD/gpu-results}
STATE=/tmp/gpufleet-fleet-run  # what phase A leaves for phase B (same machine, same boot)
mkdir -p "$OUT" "$STATE"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 GPUFLEET_KEEP_LOGS=1
log="$OUT/run-$phase.log"
t_phase=$(date +%s)
say() { echo "== [$(( $(date +%s) - t_phase )) s] $*" | tee -a "$log"; }
elapsed() { echo $(( $(date +%s) - t_phase )); }

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi

table() {  # the short table, from the summaries of both phases (whichever exist)
  python3 - "$STATE" <<'EOF'
import json, sys
from pathlib import Path

state = Path(sys.argv[1])
s = {}
for name in ("summary-A.json", "summary-B.json"):
    p = state / name
    if p.exists():
        s.update(json.loads(p.read_text()))
print(f"machine: {s.get('machine')}; driver {s.get('driver')}; ansible {s.get('ansible')}")
print(f"{'run':10} {'tier':10} {'wall s':>7} {'rc':>3}  {'verdict':8} not passing")
for run in s.get("runs", []):
    print(f"{run['run_id']:10} {run['tier']:10} {run['wall_s']:7.1f} {run['rc']:3}  {str(run['verdict']):8} "
          f"{', '.join(run['not_passing'])[:150] or '-'}")
    for name, fig in run.get("figures", {}).items():
        print(f"{'':22} {name}: {fig}")
d = s.get("disturbed_findings")
if d:
    print(f"disturbed: workload pid {d.get('disturb_pid')} ({d.get('disturb_line')})")
    print(f"  processes: {d.get('processes_status')}: {d.get('processes_reason')}")
    print(f"  flagged GPUs: {d.get('flagged_gpus')}")
    for r in d.get("fleet", []):
        print(f"  fleet.{r['check']}: {r['status']}: {r['reason'][:200]}")
for k in ("status_idle", "status_soak", "hw", "hw_json"):
    if k in s:
        print(f"{k}: {s[k]}")
soak = s.get("soak")
if soak:
    print(f"soak: {soak.get('verdict')} ({soak.get('wall_s')} s wall, rc {soak.get('rc')}); ran {soak.get('ran_s')} s of "
          f"{soak.get('duration_s')} s, stopped early {soak.get('stopped_early')}")
    for r in soak.get("results", []):
        print(f"  {r['check']}: {r['status']}: {r['reason'][:220]}")
    for gpu, g in (soak.get("gpus") or {}).items():
        print(f"  GPU {gpu} ({g.get('uuid')}): matmul median {g.get('matmul_tflops_median')} TFLOPS, HBM median "
              f"{g.get('hbm_gbps_median')} GB/s, windows {g.get('windows')}")
EOF
}

if [ "$phase" = B ]; then
  [ -f "$STATE/soak.pid" ] || { say "no soak was started by phase A on this machine"; exit 1; }
  pid=$(cat "$STATE/soak.pid")
  say "waiting for the soak (pid $pid), at most ${WAIT_S:-570} s"
  while kill -0 "$pid" 2>/dev/null && [ "$(elapsed)" -lt "${WAIT_S:-570}" ]; do sleep 5; done
  if kill -0 "$pid" 2>/dev/null; then
    say "soak still running after ${WAIT_S:-570} s; run phase B again"
    tail -5 "$STATE/soak.log" | tee -a "$log"
    exit 3
  fi
  soak_end=$(date +%s)
  cp "$STATE/soak.json" "$OUT/soak.json" 2>>"$log"
  tail -c 1000000 "$STATE/soak.log" >"$OUT/soak.log" 2>>"$log"
  python3 - "$STATE" "$soak_end" <<'EOF' >>"$log" 2>&1
import json, sys
from pathlib import Path

state, soak_end = Path(sys.argv[1]), int(sys.argv[2])
start = json.loads((state / "soak-start.json").read_text())
out = {"soak": {"wall_s": soak_end - start["started_epoch"], "rc": None, "duration_s": start["duration_s"]}}
rc = state / "soak.rc"
out["soak"]["rc"] = int(rc.read_text()) if rc.exists() and rc.read_text().strip() else None
try:
    doc = json.loads((state / "soak.json").read_text())
except (OSError, ValueError) as exc:
    out["soak"]["verdict"] = f"unreadable: {exc}"
else:
    from gpufleet.base import schema

    out["soak"]["verdict"] = schema.verdict(doc["results"])
    out["soak"]["results"] = [{k: r.get(k) for k in ("check", "status", "reason", "value", "unit")} for r in doc["results"]]
    for r in doc["results"]:
        det = r.get("detail") or {}
        out["soak"]["ran_s"] = det.get("ran_s")
        out["soak"]["stopped_early"] = det.get("stopped_early")
        out["soak"]["stop_reason"] = det.get("stop_reason")
        if r["check"] == "soak_slowdown":  # per CUDA device: the throughput medians and windows
            out["soak"]["gpus"] = {i: {"nvml_index": g.get("nvml_index"), "uuid": g.get("uuid"),
                                       "matmul_tflops_median": g.get("matmul_tflops_median"),
                                       "hbm_gbps_median": g.get("hbm_gbps_median"), "windows": len(g.get("windows") or [])}
                                   for i, g in (det.get("per_gpu") or {}).items()}
(state / "summary-B.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out, indent=1))
EOF
  python3 -c "import json,sys; a={}; [a.update(json.load(open(p))) for p in sys.argv[1:]]; print(json.dumps(a, indent=1))" \
    "$STATE/summary-A.json" "$STATE/summary-B.json" >"$OUT/summary.json" 2>>"$log"
  table | tee -a "$log"
  exit 0
fi

# ---------------------------------------------------------------- phase A
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { echo "engine install failed"; tail "$log"; exit 1; }
ansible=$(ansible-playbook --version 2>>"$log" | head -1)
[ -n "$ansible" ] || { say "ansible-playbook does not run"; tail "$log"; exit 1; }
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))')
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
expected=${EXPECTED_GPUS:-$gpus}
thresholds=$(python3 -c "import json,os; t=json.loads(os.environ.get('THRESHOLDS') or '{}'); t.setdefault('gpus_expected', $expected); print(json.dumps(t))")
say "machine: $gpus x $name, driver $driver; $ansible; thresholds override: $thresholds"
nvidia-smi >>"$log" 2>&1
rm -rf "${STATE:?}"/* && mkdir -p "$STATE/extra"
reports=$STATE/extra/reports  # the run folders and the store (gpufleet_reports_dir)
printf '%s\n' "$gpus x $name" "$driver" "$ansible" >"$STATE/machine.txt"
common=(-i inventory/local -e gpufleet_reports_dir="$reports" -e gpufleet_lock_path=/tmp/gpufleet.base.lock -e "{\"gpufleet_thresholds\": $thresholds}")

validate() {  # RUN_ID TIER TIMEOUT_S [more -e ...]: one timed validate.yml run, its wall time and rc in $STATE/runs.tsv
  local run=$1 tier=$2 limit=$3
  shift 3
  say "ansible-playbook validate.yml -e gpufleet_tier=$tier -e gpufleet_run_id=$run $*"
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout "$limit" ansible-playbook validate.yml "${common[@]}" -e gpufleet_tier="$tier" -e gpufleet_run_id="$run" "$@" \
    >"$STATE/extra/ansible-$run.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  [ "$rc" -ne 124 ] || rm -f /tmp/gpufleet.base.lock  # killed at its limit: the next run must not wait for its lock
  printf '%s\t%s\t%s\t%s\n' "$run" "$tier" "$(python3 -c "print(round($t1 - $t0, 1))")" "$rc" >>"$STATE/runs.tsv"
  say "$run: exit $rc, $(python3 -c "print(round($t1 - $t0, 1))") s"
  grep -E "fleet verdict|failed acceptance|FAILED|ERROR" "$STATE/extra/ansible-$run.log" | head -5 | tee -a "$log"
}

# 1-2: the smoke tier, then the acceptance tier, set as the baseline; nothing else on the GPUs.
validate smoke smoke 180
validate baseline acceptance 240 -e gpufleet_baseline_set=true

# 3: the acceptance tier beside a workload of our own on one GPU, judged against the baseline.
dgpu=${DISTURB_GPU:-0}
dlog="$STATE/extra/gpu_disturb.log"
python3 tools/gpu_disturb.py --gpu "$dgpu" --seconds 400 --kind matmul >"$dlog" 2>&1 &
dpid=$!
for _ in $(seq 60); do grep -q "^gpu_disturb pid" "$dlog" && break; sleep 1; done
sleep 3  # past its trial bursts: the run meets it in its steady loop
say "disturbing workload: $(head -1 "$dlog")"
validate disturbed acceptance 240 -e gpufleet_baseline=baseline
kill -TERM "$dpid" 2>/dev/null
wait "$dpid"
say "disturbing workload ended (exit $?): $(tail -1 "$dlog")"

# 4: the operator views on the idle GPUs.
say "gpufleet status --json --count 1; gpufleet hw; gpufleet hw --json"
python3 -m gpufleet status --json --count 1 >"$STATE/extra/status-idle.json" 2>"$STATE/extra/status-idle.err"
echo "status_idle_rc=$?" >>"$STATE/views.txt"
python3 -m gpufleet hw >"$STATE/extra/hw.txt" 2>&1
echo "hw_rc=$?" >>"$STATE/views.txt"
python3 -m gpufleet hw --json >"$STATE/extra/hw.json" 2>"$STATE/extra/hw.err"
echo "hw_json_rc=$?" >>"$STATE/views.txt"
cat "$STATE/extra/hw.txt" | tee -a "$log"

# 5: the soak, in its own process session so that it outlives this phase.
soak_s=${SOAK_S:-640}
say "soak: gpufleet bench soak --duration-s $soak_s --json (setsid, background)"
python3 -c "import json,time; print(json.dumps({'started_epoch': int(time.time()), 'duration_s': $soak_s}))" >"$STATE/soak-start.json"
setsid bash -c "python3 -m gpufleet bench soak --duration-s $soak_s --json --thresholds '$thresholds' \
  >'$STATE/soak.json' 2>'$STATE/soak.log' </dev/null; echo \$? >'$STATE/soak.rc'" </dev/null >/dev/null 2>&1 &
echo $! >"$STATE/soak.pid"

# 6: the live view while the soak loads every GPU, until PHASE_A_S.
sleep 45
: >"$STATE/extra/status-soak.jsonl"
while [ "$(elapsed)" -lt "${PHASE_A_S:-540}" ] && kill -0 "$(cat "$STATE/soak.pid")" 2>/dev/null; do
  python3 -m gpufleet status --json --count 1 >>"$STATE/extra/status-soak.jsonl" 2>>"$STATE/extra/status-soak.err"
  echo "status_soak_rc=$?" >>"$STATE/views.txt"
  sleep "${STATUS_EVERY_S:-30}"
done

# Summary of phase A, the folders in one archive.
python3 - "$STATE" >>"$log" 2>&1 <<'EOF'
import json, sys
from pathlib import Path

state = Path(sys.argv[1])
machine, driver, ansible = state.joinpath("machine.txt").read_text().splitlines()[:3]
out = {"machine": machine, "driver": driver, "ansible": ansible, "runs": []}
for line in state.joinpath("runs.tsv").read_text().splitlines():
    run_id, tier, wall_s, rc = line.split("\t")
    run = {"run_id": run_id, "tier": tier, "wall_s": float(wall_s), "rc": int(rc), "verdict": None, "not_passing": [],
           "figures": {}}
    try:
        rep = json.loads(state.joinpath("extra", "reports", run_id, "report.json").read_text())
    except (OSError, ValueError) as exc:
        run["verdict"] = f"no report: {exc}"
        out["runs"].append(run)
        continue
    run["verdict"] = rep.get("verdict")
    for host, node in (rep.get("nodes") or {}).items():
        run["not_passing"] += [f"{r['group']}.{r['check']}:{r['status']}" for r in node["results"]
                               if r["status"] not in ("pass", "skip")]
        for r in node["results"]:
            if r["group"] == "benchmark" and r.get("value") is not None:
                run["figures"][r["check"]] = f"{r['status']} {r['value']} {r.get('unit') or ''} ({r.get('seconds')} s)"
        if run_id == "disturbed":
            proc = next((r for r in node["results"] if r["check"] == "processes"), {})
            flagged = [f for r in node["results"] for f in (r.get("detail") or {}).get("flagged_gpus") or []]
            dline = state.joinpath("extra", "gpu_disturb.log").read_text().splitlines()
            out["disturbed_findings"] = {
                "disturb_line": dline[0] if dline else None,
                "disturb_pid": dline[0].split()[2].rstrip(":") if dline else None,
                "processes_status": proc.get("status"), "processes_reason": proc.get("reason"),
                "processes": (proc.get("detail") or {}).get("processes"),
                "flagged_gpus": sorted({json.dumps(f, sort_keys=True) for f in flagged}),
                "fleet": [{k: r.get(k) for k in ("check", "status", "reason")} for r in node["results"]
                          if r["group"] == "fleet" and r["status"] != "skip"],
            }
    out["runs"].append(run)
views = dict(line.split("=", 1) for line in state.joinpath("views.txt").read_text().split())
try:
    st = json.loads(state.joinpath("extra", "status-idle.json").read_text().splitlines()[0])
    out["status_idle"] = f"rc {views.get('status_idle_rc')}; {len(st.get('gpus') or [])} GPU(s), error {st.get('error')}"
except (OSError, ValueError, IndexError) as exc:
    out["status_idle"] = f"rc {views.get('status_idle_rc')}; unreadable: {exc}"
lines = state.joinpath("extra", "status-soak.jsonl").read_text().splitlines() if state.joinpath("extra", "status-soak.jsonl").exists() else []
out["status_soak"] = f"{len(lines)} reading(s) during the soak"
try:
    g = json.loads(lines[-1])["gpus"][0]
    out["status_soak"] += "; last GPU 0: " + json.dumps({k: g.get(k) for k in g if k in (
        "utilization_gpu_pct", "util_pct", "power_w", "temperature_c", "sm_clock_mhz", "processes")})[:300]
except (IndexError, KeyError, ValueError, TypeError):
    pass
out["hw"] = f"rc {views.get('hw_rc')}"
try:
    hw = json.loads(state.joinpath("extra", "hw.json").read_text())
    out["hw_json"] = f"rc {views.get('hw_json_rc')}; {len(hw.get('gpus') or [])} GPU(s); not read: {sorted(hw.get('unreadable') or hw.get('not_read') or [])}"
except (OSError, ValueError) as exc:
    out["hw_json"] = f"rc {views.get('hw_json_rc')}; unreadable: {exc}"
state.joinpath("summary-A.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out, indent=1))
EOF
cp "$STATE/summary-A.json" "$OUT/summary-A.json"
rm -rf "$STATE"/extra/reports/*/runner
tar czf "$OUT/fleet-A.tar.gz" -C "$STATE" extra 2>>"$log"
table | tee -a "$log"
say "phase A done; the soak (pid $(cat "$STATE/soak.pid")) goes on: run phase B next"
