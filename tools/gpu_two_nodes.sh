#!/usr/bin/env bash
# A machine with two GPUs run as two nodes of one GPU each (gpufleet_node_env sets CUDA_VISIBLE_DEVICES per
# inventory host; both hosts are this machine, connection local, rendezvous on 127.0.0.1), in one go:
#   1. the fast LoRA config on one GPU, once on each GPU at the same time;
#   2. `ansible-playbook finetune.yml` across the two nodes with that config (DDP over NCCL);
#   3. `ansible-playbook validate.yml` with the nccl and train_gpt2 benchmarks, so that both also run
#      across the two nodes.
# Everything is saved under $OUT; a short table is printed last.
# Needs: python3 with torch (CUDA), transformers, peft; ansible-core, datasets and their dependencies
# installed or as wheels in ./.whl and ./.whlft.
# Usage: OUT=/path [ONE_GPU_RUNS=''] [VALIDATE_RUN=''] tools/gpu_two_nodes.sh   (set to '': leave step 1 or 3 out)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-two-nodes}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
log="$OUT/run.log"
say() { echo "== $*" | tee -a "$log"; }

# One pip call: a second --target install would replace the first one's bin/.
wheels=$(ls .whl/*.whl .whlft/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels >>"$log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1 || { echo "engine install failed"; tail "$log"; exit 1; }
py=$(command -v python3)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >>"$log" 2>&1

say "fast LoRA config on one GPU, on GPU 0 and GPU 1 at once"
for g in ${ONE_GPU_RUNS-0 1}; do
  CUDA_VISIBLE_DEVICES=$g python3 -m gpufleet finetune --config files/configs/qwen2-7b-lora-fast.yml --nproc-per-node 1 \
    --master-port $((29700 + g)) --output-dir "/tmp/gpufleet-fast-gpu$g" --json >"$OUT/fast-one-gpu-$g.json" 2>>"$log" &
done
wait

cat >"$OUT/inventory.yml" <<EOF
all:
  children:
    gpu_nodes:
      hosts:
        node0: {gpufleet_node_env: {CUDA_VISIBLE_DEVICES: "0"}, gpufleet_finetune_dir: /tmp/gpufleet-node0}
        node1: {gpufleet_node_env: {CUDA_VISIBLE_DEVICES: "1"}, gpufleet_finetune_dir: /tmp/gpufleet-node1}
      vars:
        ansible_connection: local
        ansible_host: 127.0.0.1
        ansible_python_interpreter: $py
        gpufleet_python: $py
        gpufleet_thresholds: {gpus_expected: 2}
EOF

say "ansible-playbook finetune.yml across two nodes of one GPU"
ansible-playbook finetune.yml -i "$OUT/inventory.yml" -e gpufleet_run_id=finetune-two-nodes -e "gpufleet_reports_dir=$OUT/reports" \
  -e gpufleet_finetune_config=files/configs/qwen2-7b-lora-fast.yml >>"$log" 2>&1
echo "finetune.yml rc $?" | tee -a "$log"

if [ -n "${VALIDATE_RUN-1}" ]; then
  say "ansible-playbook validate.yml, nccl and train_gpt2, across two nodes of one GPU"
  ansible-playbook validate.yml -i "$OUT/inventory.yml" -e gpufleet_run_id=validate-two-nodes -e "gpufleet_reports_dir=$OUT/reports" \
    -e '{"gpufleet_benchmarks": ["nccl", "train_gpt2"]}' >>"$log" 2>&1
  echo "validate.yml rc $?" | tee -a "$log"
fi

python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"\n{'run':44} {'status':6} {'value':>12}  reason")
def show(label, r):
    v = r.get("value")
    print(f"{label:44} {r['status']:6} {v if v is not None else '':>12}  {r['reason'][:150]}")
for g in (0, 1):
    try:
        doc = json.loads((out / f"fast-one-gpu-{g}.json").read_text().strip().splitlines()[-1])
        show(f"fast config, one GPU ({g})", next(r for r in doc["results"] if r["group"] == "finetune"))
    except Exception as exc:  # noqa: BLE001
        print(f"fast config, one GPU ({g}): no result ({exc})")
for run, groups in (("finetune-two-nodes", ("finetune",)), ("validate-two-nodes", ("benchmark", "benchmark_multinode"))):
    for host in ("node0", "node1"):
        path = out / "reports" / run / "hosts" / f"{host}.json"
        if not path.is_file():
            print(f"{run}/{host}: no host document")
            continue
        for r in json.loads(path.read_text())["results"]:
            if r["group"] in groups:
                show(f"{run}/{host} {r['group']}.{r['check']}", r)
EOF
