#!/usr/bin/env bash
# The acceptance certificate on a GPU machine, as an operator and a buyer meet it: `gpufleet fleet run -i
# inventory/local --certify-key KEY` accepts the machine and signs its certificate; `gpufleet verify --live` holds it
# against the same machine's hardware now (NVML, through the engine's own reader); the library's own verifier
# (securesystemslib's DSSE) checks it without gpufleet; a copy of the node's document with two GPU serials swapped is
# refused; no byte of the private key is in the run folder.
#   OUT=<dir> [EXPECTED_GPUS=N] [COMMIT=<sha>] bash tools/gpu_certificate.sh        (about 2 minutes)
# Needs python3 with torch (CUDA) and nvidia-ml-py, and ansible-core, ansible-runner and securesystemslib with
# cryptography (or their wheels in ./.whl: tools/gpu_wheelhouse.sh). COMMIT: the commit the checkout holds, where its
# .git is not this tree's (it goes into the certificate as gpufleet's commit).
# Under $OUT: fleet-run.json and .log, verify-*.json, library.txt, swapped.json, key-grep.txt, run.tar.gz (the run
# folder with its certificates) and site.key.pub (the public key, to verify them again); the table is printed last.
set -uo pipefail
: "${OUT:?the results folder}"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$SECONDS
mkdir -p "$OUT"
nvidia-smi -L >"$OUT/gpus.txt" 2>&1
if [ -d .whl ] && ! python3 -c 'import ansible, ansible_runner, securesystemslib, cryptography' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export GPUFLEET_COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
gpus=$(python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.device_count())' 2>/dev/null) || gpus=0
gpus=${EXPECTED_GPUS:-$gpus}
[ "$gpus" -gt 0 ] || { echo "no GPU: torch with CUDA sees none"; exit 2; }
work=$(mktemp -d)
key=$work/keys/site.key
reports=$work/reports
run=$reports/cert
cert=$run/certificates/nodes/localhost.intoto.json
python3 -m gpufleet keygen "$key" --reports-dir "$reports" >"$OUT/keygen.txt" 2>&1 || { cat "$OUT/keygen.txt"; exit 1; }
cp "$key.pub" "$OUT/site.key.pub"

t0=$SECONDS
python3 -m gpufleet fleet run -i inventory/local --plain --json --run-id cert --reports-dir "$reports" \
  --certify-key "$key" -e "{\"gpufleet_thresholds\": {\"gpus_expected\": $gpus}, \"gpufleet_lock_path\": \"$work/lock\"}" \
  >"$OUT/fleet-run.json" 2>"$OUT/fleet-run.log"
run_rc=$? run_s=$((SECONDS - t0))

verify() {  # NAME ARGS...: gpufleet verify --json into $OUT/verify-NAME.json; its exit code
  local name=$1
  shift
  python3 -m gpufleet verify "$@" --pubkey "$key.pub" --json >"$OUT/verify-$name.json" 2>>"$OUT/verify.log"
}
t0=$SECONDS
verify live "$cert" --live
live_rc=$? live_s=$((SECONDS - t0))
verify document "$cert" --document "$run/hosts/localhost.json" --report "$run/report.json"
doc_rc=$?
verify fleet "$run/certificates/fleet.intoto.json"
fleet_rc=$?
python3 -m gpufleet collect --identity >"$OUT/identity.json" 2>&1

# A buyer without gpufleet: securesystemslib's own DSSE verifier and the public key.
python3 - "$cert" "$key.pub" >"$OUT/library.txt" 2>&1 <<'PY'
import json, sys
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
key = SSlibKey.from_crypto(load_pem_public_key(open(sys.argv[2], "rb").read()))
envelope = Envelope.from_dict(json.load(open(sys.argv[1])))
envelope.verify([key], 1)
statement = json.loads(envelope.payload)
gpus = [s["annotations"]["serial"] for s in statement["subject"] if s["name"].startswith("gpu:")]
print(f"verified by securesystemslib: {statement['predicateType']}, {len(gpus)} GPU serials, "
      f"valid until {statement['predicate']['valid_until']}")
PY
lib_rc=$?

# Two GPU serials swapped (one GPU: its serial changed) in a copy of the node's document: refused as hardware.
python3 - "$run/hosts/localhost.json" "$work/swapped.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
gpus = next(r for r in doc["results"] if r["check"] == "gpu_count")["detail"]["inventory"]["gpus"]
if len(gpus) > 1:
    gpus[0]["serial"], gpus[1]["serial"] = gpus[1]["serial"], gpus[0]["serial"]
else:
    gpus[0]["serial"] += "0"
json.dump(doc, open(sys.argv[2], "w"))
PY
verify swapped "$cert" --document "$work/swapped.json"
swap_rc=$?

# No byte of the private key in the run folder.
body=$(grep -v -- ----- "$key" | tr -d '\n')
found=$( (grep -rl -e "PRIVATE KEY" -e "$body" "$reports" 2>/dev/null || true) | wc -l)
echo "files under the reports folder holding private key material: $found" >"$OUT/key-grep.txt"
(cd "$reports" && tar czf "$OUT/run.tar.gz" --exclude='*.db*' cert)

field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2]))' "$1" "$2" 2>/dev/null; }
echo
printf '%-34s %s\n' "step" "result"
printf '%-34s %s\n' "fleet run --certify-key" "exit $run_rc, $run_s s, $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("nodes"))' "$OUT/fleet-run.json" 2>/dev/null)"
printf '%-34s %s\n' "certificate" "$( [ -f "$cert" ] && echo "$cert" || echo missing)"
printf '%-34s %s\n' "verify --live" "exit $live_rc ($live_s s): $(field "$OUT/verify-live.json" reason)"
printf '%-34s %s\n' "verify --document --report" "exit $doc_rc: $(field "$OUT/verify-document.json" reason)"
printf '%-34s %s\n' "verify fleet certificate" "exit $fleet_rc: $(field "$OUT/verify-fleet.json" reason)"
printf '%-34s %s\n' "securesystemslib's verifier" "exit $lib_rc: $(tail -1 "$OUT/library.txt")"
printf '%-34s %s\n' "GPU serials swapped (expect 1)" "exit $swap_rc: $(field "$OUT/verify-swapped.json" reason)"
printf '%-34s %s\n' "private key in the run folder" "$found file(s)"
printf '%-34s %s\n' "total" "$((SECONDS - start)) s"
