#!/usr/bin/env bash
# The acceptance tier's wall time before and after, with where it goes, on a GPU machine:
#   BEFORE=<folder of the older checkout> OUT=<dir> [ROUNDS=4] bash tools/gpu_tier_steps.sh
# 1. tools/gpu_matmul_phases.py --engine: `gpufleet bench matmul` and `bench matmul sdc` as the benchmark module
#    runs them, with the workers' phases (phases.json);
# 2. tools/gpu_tier_time.sh: ROUNDS alternating runs of each checkout (times.tsv, tiers.tar.gz);
# 3. the seconds of each benchmark step in every run's host document (steps.tsv).
# The table is printed last.
set -uo pipefail
: "${BEFORE:?the folder of the older checkout}" "${OUT:?the results folder}"
export ROUNDS=${ROUNDS:-4} LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
here=$PWD
PYTHONPATH=$here/src timeout 200 python3 tools/gpu_matmul_phases.py --engine --rounds 1 --json "$OUT/phases.json" \
  >"$OUT/phases.log" 2>&1 || echo "phases: exit $?"
BEFORE=$BEFORE OUT=$OUT bash tools/gpu_tier_time.sh >"$OUT/tier-time.log" 2>&1
work=$(mktemp -d)
tar -xzf "$OUT/tiers.tar.gz" -C "$work" 2>/dev/null
python3 - "$work" "$OUT/steps.tsv" <<'PY'
import glob, json, os, statistics, sys
work, tsv = sys.argv[1:3]
rows = []
for path in sorted(glob.glob(os.path.join(work, "reports-*", "*", "hosts", "*.json"))):
    doc = json.load(open(path))
    run = os.path.basename(os.path.dirname(os.path.dirname(path)))
    steps = {}
    for r in doc["results"]:
        if r.get("group") == "benchmark" and r.get("seconds") is not None:
            step = {"matmul_bf16": "matmul", "hbm_bandwidth": "memory"}.get(r["check"], r["check"])
            steps[step] = max(steps.get(step, 0), r["seconds"])
    trust = sorted({r.get("trust") for r in doc["results"] if r.get("trust")})
    rows.append((run, doc["seconds"], steps.get("matmul"), steps.get("memory"), ",".join(trust)))
with open(tsv, "w") as f:
    f.write("run\tnode_document_s\tmatmul_step_s\tmemory_step_s\ttrust\n")
    for row in rows:
        f.write("\t".join(str(x) for x in row) + "\n")
print("run        node doc s  matmul s  memory s  trust")
for row in rows:
    print(f"{row[0]:10} {row[1]:10.1f} {row[2] or 0:9.2f} {row[3] or 0:9.2f}  {row[4]}")
for label in ("before", "after"):
    mine = [r for r in rows if r[0].startswith(label)]
    if mine:
        print(f"{label}: median matmul step {statistics.median([r[2] or 0 for r in mine]):.2f} s, "
              f"memory step {statistics.median([r[3] or 0 for r in mine]):.2f} s")
PY
echo
tail -25 "$OUT/phases.log"
echo
tail -4 "$OUT/tier-time.log"
