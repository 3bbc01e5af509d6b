#!/usr/bin/env bash
# The example site workload (gpufleet.train.image_ddp, declared in files/workloads/h200-sxm.yml) as a gate on a GPU
# machine, in one go, at 1 GPU and at every GPU of the machine:
#   measure  the shipped declaration (no expected figure yet): the figures, each run's log;
#   gate     the same with the measured figures as its expected ones: passes, as a node that keeps its promise;
#   promise  the 1-GPU figure promised at 1.5 x what was measured: measured again, then fails naming the workload,
#            its figure and the promise's source.
# Each phase is `gpufleet bench workloads --json` with the site's profile folder (GPUFLEET_SITE_PROFILE_DIR), as on a
# node without Ansible (docs/workloads.md). Everything is saved under $OUT; a short table is printed last.
# Needs: python3 with torch (CUDA) and nvidia-ml-py. About 3-4 minutes on 2 x H200.
# Usage: OUT=/path [STEPS=150] tools/gpu_workload.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
STEPS=${STEPS:-150}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
log="$OUT/run.log"
say() { echo "== $*" | tee -a "$log"; }

python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { echo "engine install failed"; tail "$log"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv >>"$log" 2>&1
site=$(mktemp -d /tmp/gpufleet-workload-site-XXXX)
export GPUFLEET_SITE_PROFILE_DIR=$site

# The declaration, named after the shipped profile this GPU matches (a site profile of that name extends it);
# `expected` from the phase before: none, as measured, or the 1-GPU figure at 1.5 x.
declare_phase() {
  python3 - "$1" "$site" "$STEPS" "${2:-}" <<'EOF'
import json, os, sys, time
from pathlib import Path
import torch, yaml
from gpufleet.base import profiles
phase, site, steps, before = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
doc = yaml.safe_load(Path("files/workloads/h200-sxm.yml").read_text())
(w,) = doc["workloads"]
os.environ.pop("GPUFLEET_SITE_PROFILE_DIR")  # the shipped profiles alone: which one this GPU matches
if torch.cuda.is_available():
    gpu = torch.cuda.get_device_name(0)
    shipped = profiles.match(profiles.load_all(), gpu)
    doc["name"] = shipped or "site-workload"
    if not shipped:
        doc["match"] = [gpu]
    w["command"] = w["command"].replace("--steps 200", f"--steps {steps}")
else:  # a machine without GPUs: the same phases at tiny sizes, a logic check of this script
    doc["name"] = "cpu-site"
    w["command"] = w["command"].replace(
        "--steps 200", "--steps 3 --warmup 1 --workers 0 --width 8 --blocks 1 --batch-per-gpu 8 --images 64 --precision fp32"
    )
    w["scaling_efficiency_min"] = None
if before:
    rows = next(r for r in json.loads(Path(before).read_text())["results"] if r["check"] == "workload")["detail"]["rows"]
    day = time.strftime("%Y-%m-%d")
    for row in rows:
        value, source = row["figure"], f"measured by tools/gpu_workload.sh (phase measure) on this machine, {day}"
        if phase == "promise" and row["gpus"] == "1":
            value, source = round(row["figure"] * 1.5, 1), "1.5 x the figure measured here: a promise this node cannot keep"
        w["expected"][row["gpus"]] = {"value": value, "source": source}
for f in site.glob("*.yml"):
    f.unlink()
(site / f"{doc['name']}.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
print(doc["name"])
EOF
}

run_phase() {
  say "phase $1: gpufleet bench workloads"
  local start=$(date +%s)
  python3 -m gpufleet bench workloads --profile "$profile" --json >"$OUT/workloads-$1.json" 2>>"$log"
  echo "$1 $? $(( $(date +%s) - start ))" >>"$OUT/phases.txt"
  cp "$site"/*.yml "$OUT/declared-$1.yml"
}

: >"$OUT/phases.txt"
profile=$(declare_phase measure) && say "the site profile, named as the shipped one this GPU matches: $profile" &&
  run_phase measure
declare_phase gate "$OUT/workloads-measure.json" >/dev/null && run_phase gate
declare_phase promise "$OUT/workloads-measure.json" >/dev/null && run_phase promise

python3 - "$OUT" <<'EOF' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
seconds = {line.split()[0]: line.split()[2] for line in (out / "phases.txt").read_text().splitlines()}
print(f"{'phase':8} {'check':17} {'status':7} {'trust':12} {'attempts':8} {'gpus':5} {'figure':>12} {'expected':>12} "
      f"{'run':5} seconds")
for phase in ("measure", "gate", "promise"):
    try:
        doc = json.loads((out / f"workloads-{phase}.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"{phase:8} no document: {exc}")
        continue
    for r in doc["results"]:
        if r["check"] not in ("workload", "workload_scaling"):
            continue
        attempts = len(r["detail"].get("attempts") or [])
        rows = r["detail"].get("rows") or [{}]
        for row in rows:
            figure = row.get("figure", row.get("per_gpu_over_one"))
            expected = row.get("expected", row.get("min"))
            print(f"{phase:8} {r['check']:17} {r['status']:7} {str(r.get('trust')):12} {attempts:<8} "
                  f"{str(row.get('gpus', '')):5} {str(figure):>12} {str(expected):>12} {row.get('status', ''):5} "
                  f"{seconds.get(phase, '?')}")
    print(f"{'':8} reason: {next(r['reason'] for r in doc['results'] if r['check'] == 'workload')[:300]}")
EOF
