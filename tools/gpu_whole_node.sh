#!/usr/bin/env bash
# The whole node on a GPU machine: what its host shows of itself (EDAC, NVMe health logs, PCIe links, NUMA nodes; what
# is absent), then `gpufleet fleet run -i inventory/local` acceptance runs in a plan, clean and with each planted
# host fault, each judged by its report, with its wall time and the host step's seconds.
#   OUT=<dir> [SCRATCH=<folder on the local NVMe drive>] [PLAN="base acc memory full io acc base"] [BUDGET_S=560]
#     [EXPECTED_GPUS=N] bash tools/gpu_whole_node.sh
# Steps: base (gpufleet_benchmarks without host: the wall time the host step is added to), acc (the default
# benchmarks, host among them), memory | full | io (acc with a planted fault, tools/gpu_disturb.py: 60% of the
# host's memory held and streamed through by another user, in place before the run; the scratch drive filled to
# 512 MiB free, before the run; two direct-I/O writers and readers on the scratch drive through the run).
# SCRATCH unset: a 24 GiB ext4 file system in a file of /var/tmp on a loop device with direct I/O (as root, with
# mkfs.ext4), so the full-drive fault fills it and never the machine's own; else $OUT/scratch. host.txt says which
# drive it is on. Needs python3 with torch (CUDA)
# and nvidia-ml-py, ansible-core (or its wheels in ./.whl), root (the NVMe health log, the neighbour's user).
# Under $OUT: host.txt and readings.json (what the host shows), runs.tsv, runs.tar.gz; the table is printed last.
set -uo pipefail
: "${OUT:?the results folder}"
PLAN=${PLAN:-base acc memory full io acc base}
BUDGET_S=${BUDGET_S:-560}
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$SECONDS
mkdir -p "$OUT"
loop=""
if [ -z "${SCRATCH:-}" ] && [ "$(id -u)" = 0 ] && command -v mkfs.ext4 >/dev/null && command -v losetup >/dev/null; then
  img=/var/tmp/gpufleet-scratch.img SCRATCH=/mnt/gpufleet-scratch
  truncate -s 24G "$img" && mkfs.ext4 -q -F "$img" && loop=$(losetup --find --show --direct-io=on "$img") &&
    mkdir -p "$SCRATCH" && mount "$loop" "$SCRATCH" || { echo "no loop file system: $OUT/scratch instead"; SCRATCH=""; }
  trap '[ -n "$loop" ] && { umount "$SCRATCH"; losetup -d "$loop"; rm -f "$img"; }' EXIT
fi
SCRATCH=${SCRATCH:-$OUT/scratch}
mkdir -p "$SCRATCH"
if [ -d .whl ] && ! python3 -c 'import ansible, ansible_runner' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
gpus=$(python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.device_count())' 2>/dev/null) || gpus=0
gpus=${EXPECTED_GPUS:-$gpus}
[ "$gpus" -gt 0 ] || { echo "no GPU: torch with CUDA sees none (EXPECTED_GPUS=N runs the logic anyway)"; exit 2; }

# What the host shows of itself: each reader's finding, absent ones with their reason.
python3 -m gpufleet collect >"$OUT/readings.json" 2>"$OUT/collect.err"
python3 - "$OUT/readings.json" "$SCRATCH" >"$OUT/host.txt" <<'PY'
import json, os, shutil, sys
from gpufleet.bench import io_watch
from gpufleet.benchmarks.host import host_memory
from gpufleet.collect.host import pcie_link_states as pcie_links
r = json.load(open(sys.argv[1]))
h, log = r["host"], r.get("kernel_log") or {}
edac = h.get("edac") or {}
print("EDAC:", f"{len(edac['controllers'])} controller(s), {sum(len(c['dimms']) for c in edac['controllers'])} DIMM(s)"
      if edac.get("present") else f"absent: {edac.get('reason')}")
nvme = h.get("nvme") or {}
print("NVMe:", "; ".join(f"{d['controller']} {d.get('model')} via {d['source']}: "
                         + (f"warning {d['log']['critical_warning']}, spare {d['log']['available_spare_pct']}%, "
                            f"used {d['log']['percentage_used']}%, media errors {d['log']['media_errors']}, "
                            f"{d['log']['temperature_c']} C" if d.get("log") else f"not read: {d.get('reason')}")
                         for d in nvme.get("drives") or []) or f"absent: {nvme.get('reason')}")
links = pcie_links.plan(h.get("pci") or [])
kinds = [l["kind"] for l in links]
print(f"PCIe links watched: {len(links)} ({kinds.count('nic')} NIC, {kinds.count('gpu')} GPU, {kinds.count('bridge')} "
      "switch uplink); now: " + ", ".join(f"{l['bdf']} ({l['kind']}) Gen{d['current_link_gen']} x{d['current_link_width']}"
                                        f" of Gen{l['max_gen']} x{l['max_width']}"
                                        for l in links for d in h["pci"] if d["bdf"] == l["bdf"])[:1500])
mce = log.get("machine_checks") or {}
print(f"kernel log: {log.get('source')}, readable {log.get('readable')}; machine checks {len(mce.get('events') or [])}, "
      f"'events logged' lines {mce.get('logged_lines')}")
m = h.get("meminfo") or {}
print(f"memory: {m.get('total_kib', 0) / 2**20:.0f} GiB, {m.get('available_kib', 0) / 2**20:.0f} GiB available; NUMA "
      f"nodes and their CPUs: { {n: len(c) for n, c in host_memory.numa_nodes().items()} }")
print(f"scratch: {sys.argv[2]} on {io_watch.block_device(sys.argv[2])}, "
      f"{shutil.disk_usage(sys.argv[2]).free / 2**30:.0f} GiB free; fio {shutil.which('fio') or 'absent'}; "
      f"nvme-cli {shutil.which('nvme') or 'absent'}")
PY
cat "$OUT/host.txt"

work=$(mktemp -d)
base_vars="\"gpufleet_thresholds\": {\"gpus_expected\": $gpus}, \"gpufleet_lock_path\": \"$work/lock\", \"gpufleet_scratch_dir\": \"$SCRATCH\""
printf 'step\trun_id\twall_s\texit\thost_step_s\tverdict\tnew checks\tnot passing\n' >"$OUT/runs.tsv"
declare -A longest

summary() {  # REPORT_JSON: the host step's seconds, the verdict, the new checks' statuses, what did not pass
  python3 - "$1" <<'PY'
import json, sys
NEW = ("memory_errors", "machine_checks", "memory_available", "nvme_health", "pcie_links", "host_memory_bandwidth",
       "disk_write_bandwidth", "disk_read_bandwidth", "data_loader", "host_processes", "fabric_during_run")
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"-\tno report\t-\t{type(e).__name__}")
    raise SystemExit
for node in report.get("nodes", {}).values():
    res = node.get("results", [])
    host_s = max((r.get("seconds") or 0 for r in res if r.get("check") == "host_memory_bandwidth"), default=0)
    new = " ".join(f"{r['check']}={r['status']}" for r in res if r.get("check") in NEW)
    bad = [f"{r['group']}.{r['check']}={r['status']}[{r.get('class') or ''}]: {r['reason'][:160]}"
           for r in res if r.get("status") in ("warn", "fail", "error")]
    print("\t".join(str(x) for x in (round(host_s, 1), node.get("verdict"), new or "-", " | ".join(bad) or "-")))
PY
}

fault() {  # STEP: start the step's planted fault; its pid, once it is in place
  local args
  case $1 in
    memory) args="--kind memory --procs 2 --as-user gpufleet-neighbour" ;;
    full) args="--kind fill --path $SCRATCH" ;;
    io) args="--kind io --procs 2 --path $SCRATCH" ;;
    *) return 0 ;;
  esac
  : >"$work/fault-$1.log"
  python3 tools/gpu_disturb.py $args --seconds 400 >"$work/fault-$1.log" 2>&1 &
  local pid=$! n=0
  until grep -q "^gpu_disturb pid" "$work/fault-$1.log" || [ $n -ge 600 ] || ! kill -0 $pid 2>/dev/null; do
    sleep 0.5; n=$((n + 1))
  done
  echo "$pid"
}

for step in $PLAN; do
  need=${longest[$step]:-120}
  if [ $((SECONDS - start + need + need / 10)) -gt "$BUDGET_S" ]; then echo "skip $step: the budget"; continue; fi
  benchmarks='"gpufleet_benchmarks": ["matmul", "memory", "nccl", "sdc"], '
  [ "$step" = base ] || benchmarks=""
  id="$step-$(date -u +%H%M%S)"
  pid=$(fault "$step")
  t0=$SECONDS
  python3 -m gpufleet fleet run -i inventory/local --plain --json --tier acceptance --reports-dir "$work/reports" \
    --run-id "$id" -e "{$benchmarks$base_vars}" >"$work/$id.out" 2>&1
  rc=$?
  wall=$((SECONDS - t0))
  if [ -n "$pid" ]; then  # stopped (its files removed) before the next step; not this shell's child: polled
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    cat "$work/fault-$step.log" >>"$OUT/faults.log"
  fi
  [ "$wall" -gt "${longest[$step]:-0}" ] && longest[$step]=$wall
  printf '%s\t%s\t%s\t%s\t%s\n' "$step" "$id" "$wall" "$rc" "$(summary "$work/reports/$id/report.json")" >>"$OUT/runs.tsv"
  echo "[$((SECONDS - start)) s] $step: $id $wall s, exit $rc"
  (cd "$work" && tar czf "$OUT/runs.tar.gz" --exclude='*.db*' reports *.out fault-*.log 2>/dev/null)
done
echo
python3 - "$OUT/runs.tsv" <<'PY'
import csv, statistics, sys
lines = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
widths = [max(len(row[i]) for row in lines if i < len(row)) for i in range(6)]
for row in lines:  # the short columns aligned, the checks after them
    print(("  ".join(c.ljust(widths[i]) for i, c in enumerate(row[:6])) + "  " + " ".join(row[6:]))[:400])
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
wall = lambda s: [int(r["wall_s"]) for r in rows if r["step"] == s and r["exit"] in ("0", "1")]  # noqa: E731
base, acc = wall("base"), wall("acc")
if base and acc:
    print(f"acceptance wall: base (no host step) median {statistics.median(base):g} s over {len(base)}, with it "
          f"{statistics.median(acc):g} s over {len(acc)}: +{statistics.median(acc) - statistics.median(base):g} s "
          "(limit +15 s)")
PY
