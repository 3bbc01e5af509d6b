#!/usr/bin/env bash
# Bring-up proven on a GPU machine, from a checkout, as root, in one go (docs/bringup.md, "A cloud GPU VM"):
#   pin-refused  bringup.yml --tags nvidia_driver pinned to a driver that is not loaded: fails naming both, installs nothing
#   check        bringup.yml --check on the fresh machine: what it would change
#   bringup-1    bringup.yml: every role's real tasks (no --skip-tags), no reboot, persistence verified, not set
#   bringup-2    bringup.yml again: nothing changes
#   validate-1   validate.yml with bringup_required (tier smoke): accepted
#   drift        by hand (an ad-hoc command, not the roles): NCCL_DEBUG edited in /etc/nccl.conf, kernel.numa_balancing 1
#   validate-2   host_hygiene.bringup_drift fails naming both; not accepted
#   bringup-3    bringup.yml restores them
#   validate-3   accepted again
# The GPUs' settings (persistence, clocks, power limits, compute mode) are read before and after and must not move.
# Under $OUT: machine.txt, <step>.log (each step's full output), <step>.timed.log (the same with each line's time),
# validate-N/ (report.json, report.md, the host document), steps.jsonl, and summary.txt, the short table printed last
# (tools/bringup_steps.py judges each step).
# Exit 0 when every step went as it should.
#
# Needs: python3 with torch (the image's); ansible-core on PATH, or its wheels in .whl; the python_env wheelhouse in
# .whl/python_env (both from tools/gpu_wheelhouse.sh).
# Usage: OUT=/path [DRIVER_PIN=580.159.04] [WRONG_PIN=550.127.05] [INVENTORY=inventory/cloud-vm] [TIER=smoke]
#        [STEPS="bringup-1 bringup-2 ..."] [REPORTS_DIR=reports] bash tools/gpu_bringup.sh
# DRIVER_PIN defaults to the loaded driver (/sys/module/nvidia/version), which the run then says.
set -uo pipefail
: "${OUT:?the results folder}"
OUT=$(realpath -m "$OUT")
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
# NVLink multicast stays off on these machines, whatever a step runs.
export NCCL_NVLS_ENABLE=0
INVENTORY=${INVENTORY:-inventory/cloud-vm}
TIER=${TIER:-smoke}
REPORTS_DIR=$(realpath -m "${REPORTS_DIR:-reports}")
STEPS=${STEPS:-pin-refused check bringup-1 bringup-2 validate-1 drift validate-2 bringup-3 validate-3}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-300}
# The whole sequence stays within BUDGET_S: a step that cannot start in time is recorded as not run.
BUDGET_S=${BUDGET_S:-500}
WRONG_PIN=${WRONG_PIN:-550.127.05}
run_id=bringup-$(date -u +%Y%m%dT%H%M%SZ)
rm -f "$OUT/steps.jsonl"

. tools/ansible_from_wheels.sh "$OUT/ansible-install.log" || { echo "ansible-core from .whl failed: $OUT/ansible-install.log"; exit 2; }

loaded=$(cat /sys/module/nvidia/version 2>/dev/null)
DRIVER_PIN=${DRIVER_PIN:-$loaded}
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
{
  echo "checkout: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) file(s) changed"
  echo "driver loaded: ${loaded:-none}; pin: ${DRIVER_PIN:-none}$([ "${DRIVER_PIN:-}" = "$loaded" ] && echo ' (the loaded one: DRIVER_PIN not given)')"
  echo "GPUs (torch): $gpus; python3: $(command -v python3) $(python3 -V 2>&1); ansible: $(ansible-playbook --version 2>&1 | head -1)"
  echo "virtualization: $(systemd-detect-virt 2>/dev/null || echo unknown); PID 1: $(cat /proc/1/comm 2>/dev/null)"
  echo "kernel: $(uname -r); kernel.numa_balancing: $(cat /proc/sys/kernel/numa_balancing 2>/dev/null || echo absent)"
  echo "cpufreq: $(ls /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo absent)"
  echo "HCAs: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ' || true)(none when empty)"
  echo "NVSwitches: $(grep -l 0x0680 /sys/bus/pci/devices/*/class 2>/dev/null | xargs -r grep -l 0x10de 2>/dev/null | wc -l)"
  echo "/etc/nccl.conf before: $( [ -e /etc/nccl.conf ] && echo present || echo absent); record: $( [ -e /etc/gpufleet/bringup.json ] && echo present || echo absent)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"

gpu_settings() {  # the settings this sequence must leave as it found them
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode,compute_mode,clocks.applications.graphics,clocks.applications.memory,power.limit,enforced.power.limit \
    --format=csv >"$OUT/gpu-settings-$1.csv" 2>&1
}

# validate.yml's variables: the thresholds replace the inventory's, so bringup_required is said again here.
python3 - "$OUT/validate-vars.json" "$gpus" "$DRIVER_PIN" <<'PY'
import json, sys
path, gpus, pin = sys.argv[1], int(sys.argv[2]), sys.argv[3]
thresholds = {"bringup_required": True, **({"gpus_expected": gpus} if gpus else {}), **({"driver_version": pin} if pin else {})}
json.dump({"gpufleet_thresholds": thresholds, "gpufleet_node_env": {"NCCL_NVLS_ENABLE": "0"}}, open(path, "w"))
PY

pin_args=()
[ -n "$DRIVER_PIN" ] && pin_args=(-e "nvidia_driver_version=$DRIVER_PIN")
# The drift, by hand: the file and the sysctl where the roles keep them (a test host's are under a fake root).
# Given as JSON: the shell module would take words like conf=... for its own options.
drift=$(python3 -c 'import json, sys; print(json.dumps({"cmd": sys.argv[1]}))' 'conf={{ nccl_conf_path | default("/etc/nccl.conf") }}
sysctl={{ host_tuning_sysfs_root | default("/") | regex_replace("/$", "") }}/proc/sys/kernel/numa_balancing
before=$(sha256sum "$conf")
sed -i "s/^NCCL_DEBUG=WARN$/NCCL_DEBUG=INFO/" "$conf"
[ "$(sha256sum "$conf")" != "$before" ] || echo NCCL_DEBUG=INFO >>"$conf"
echo 1 >"$sysctl"
echo "$conf now:"; cat "$conf"; echo "$sysctl now: $(cat "$sysctl")"')

step() {  # step NAME COMMAND...: run it with a timeout, its output in $OUT/NAME.log, then judge it
  local name=$1 report=() start end rc left=$((deadline - SECONDS))
  shift
  start=$(date +%s.%N)
  if [ "$left" -lt 30 ]; then
    echo "not run: the sequence's budget (BUDGET_S=$BUDGET_S s) was spent" >"$OUT/$name.log"
    rc=124
  else
    # The same output with each line's time in $name.timed.log: where a slow step spent its time.
    ANSIBLE_LOG_PATH="$OUT/$name.timed.log" timeout --kill-after=15 "$((left < STEP_TIMEOUT_S ? left : STEP_TIMEOUT_S))" \
      "$@" >"$OUT/$name.log" 2>&1
    rc=$?
  fi
  end=$(date +%s.%N)
  if [[ $name == validate-* ]]; then
    mkdir -p "$OUT/$name"
    cp "$REPORTS_DIR/$run_id-$name"/report.{json,md} "$OUT/$name/" 2>/dev/null
    cp -r "$REPORTS_DIR/$run_id-$name/hosts" "$OUT/$name/" 2>/dev/null
    report=(--report "$OUT/$name/report.json")
  fi
  python3 tools/bringup_steps.py record "$OUT" "$name" "$rc" "$(awk "BEGIN {print $end - $start}")" "${report[@]}"
}

deadline=$((SECONDS + BUDGET_S))
gpu_settings before
for s in $STEPS; do
  case $s in
    pin-refused) step "$s" ansible-playbook bringup.yml -i "$INVENTORY" --tags nvidia_driver -e "nvidia_driver_version=$WRONG_PIN" ;;
    check) step "$s" ansible-playbook bringup.yml -i "$INVENTORY" --check "${pin_args[@]}" ;;
    bringup-*) step "$s" ansible-playbook bringup.yml -i "$INVENTORY" "${pin_args[@]}" ;;
    validate-*) step "$s" ansible-playbook validate.yml -i "$INVENTORY" -e "gpufleet_run_id=$run_id-$s" \
      -e "gpufleet_tier=$TIER" -e "gpufleet_reports_dir=$REPORTS_DIR" -e "@$OUT/validate-vars.json" ;;
    drift) step "$s" ansible gpu_nodes -i "$INVENTORY" -m ansible.builtin.shell -a "$drift" ;;
    *) echo "unknown step $s (known: pin-refused check bringup-N validate-N drift)"; exit 2 ;;
  esac
done
gpu_settings after
python3 tools/bringup_steps.py table "$OUT"
