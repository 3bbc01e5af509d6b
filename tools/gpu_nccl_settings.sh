#!/usr/bin/env bash
# The NCCL settings of the nccl role measured on a GPU machine with two GPUs or more, from a checkout, as root, in one go:
#   1 bringup.yml --tags nccl (inventory/cloud-vm): the role writes /etc/nccl.conf for this node and records its settings
#   2 tools/nccl_settings_effect.py: each setting, the documented ones for nodes with InfiniBand and the seeds' forced
#     algorithm and protocol, against running without them (the conf file moved aside meanwhile), the collectives
#     inside the node at the benchmark tier's sizes; then NCCL's own log of the transports it chose
# Under $OUT: machine.txt, nccl-role.log, nccl.conf, topo.txt and nccl_settings_effect.py's files (summary.txt,
# printed last; table.md, cells.csv, summary.json, method.json, runs/, nccl-logs/). NCCL_NVLS_ENABLE=0 throughout.
# Needs: python3 with torch (CUDA); ansible-core on PATH or its wheels in .whl (tools/gpu_wheelhouse.sh).
# Usage: OUT=/path [BUDGET_S=480] [TIER=quick] [INVENTORY=inventory/cloud-vm] bash tools/gpu_nccl_settings.sh
set -uo pipefail
: "${OUT:?the results folder}"
OUT=$(realpath -m "$OUT")
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 NCCL_NVLS_ENABLE=0
start=$SECONDS
. tools/ansible_from_wheels.sh "$OUT/ansible-install.log" || { echo "ansible-core from .whl failed: $OUT/ansible-install.log"; exit 2; }
{
  echo "checkout: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) file(s) changed"
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version(), "GPUs", torch.cuda.device_count())' 2>&1
  echo "HCAs: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')(none when empty); interfaces: $(ls /sys/class/net | tr '\n' ' ')"
} >"$OUT/machine.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
timeout 240 ansible-playbook bringup.yml -i "${INVENTORY:-inventory/cloud-vm}" --tags nccl >"$OUT/nccl-role.log" 2>&1 ||
  { echo "bringup.yml --tags nccl failed: $OUT/nccl-role.log"; tail -20 "$OUT/nccl-role.log"; exit 2; }
cp /etc/nccl.conf "$OUT/nccl.conf"
python3 tools/nccl_settings_effect.py --out "$OUT" --tier "${TIER:-quick}" --evidence \
  --budget-s "$(( ${BUDGET_S:-480} - (SECONDS - start) ))"
