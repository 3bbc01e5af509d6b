#!/usr/bin/env bash
# The README's command as a new operator runs it, on a GPU machine: a fresh copy of this checkout (`git clone`)
# in a temporary folder, then `make validate` there, unchanged; then `make validate ARGS=--check` (nothing measured,
# no run added). The machine reaches no package registry, so pip reads the wheels of ./.whl instead: PIP_NO_INDEX
# and PIP_FIND_LINKS are set here, in this script's environment, never typed. The node side is whatever
# `make validate` finds: the machine's own python3 when it has torch with CUDA and nvidia-ml-py.
#
# Build the wheelhouse where the registry is reachable (Python 3.12, manylinux x86_64; the controller extra and
# what the engine needs, setuptools for the editable install):
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform any 'ansible-core>=2.16,<2.21' 'ansible-runner>=2.4' 'prometheus-client>=0.20' 'rich>=13' \
#     'PyYAML>=6' 'nvidia-ml-py>=12.535' 'setuptools>=68'
# Run: OUT=/path bash tools/gpu_make_validate.sh   (full outputs under $OUT, a short table last)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
repo=$(pwd)
log="$OUT/script.log"
say() { echo "== $*" | tee -a "$log"; }

[ -d "$repo/.whl" ] || { echo "no .whl/ here: build the wheelhouse first (see the head of this script)"; exit 2; }
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$repo/.whl" PIP_DISABLE_PIP_VERSION_CHECK=1 LC_ALL=C.UTF-8
tmp=$(mktemp -d)
clone="$tmp/gpufleet"
# A clone only where the checkout is its HEAD: a copied working tree (a GPU machine's copy of a checkout) may carry a
# .git of an older commit, and a clone of it would test that commit, not these files.
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 && [ -z "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  git clone -q "$repo" "$clone" && how="git clone of $(git -C "$repo" rev-parse --short HEAD)"
else  # a copy of the working tree without its .git: the same files, what a clone would hold
  mkdir -p "$clone" && tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./.whl --exclude=./reports \
    --exclude=./.pytest_cache --exclude='*.egg-info' --exclude='__pycache__' -cf - . | tar -C "$clone" -xf -
  how="copy of the working tree (no .git here, or files that differ from its HEAD)"
fi
say "fresh checkout: $how in $clone"
{ nvidia-smi -L; python3 --version; python3 -c 'import torch, pynvml; print("python3: torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count())'; \
  python3 -c 'import ensurepip, venv' && echo "python3 -m venv: ok"; } >>"$log" 2>&1

cd "$clone" || exit 2
say "make validate"
start=$(date +%s)
make validate >"$OUT/make-validate.log" 2>&1
rc=$?
wall=$(( $(date +%s) - start ))
run=$(ls -td reports/*/ 2>/dev/null | head -n 1)
[ -n "$run" ] && cp -r "$run" "$OUT/run" 2>>"$log"
say "make validate ARGS=--check"
runs_before=$(ls -d reports/*/ 2>/dev/null | wc -l)
make validate ARGS=--check >"$OUT/make-validate-check.log" 2>&1
check_rc=$?
runs_after=$(ls -d reports/*/ 2>/dev/null | wc -l)
history=$(.venv/bin/gpufleet history localhost --reports-dir reports --json 2>>"$log" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["runs"]))' 2>>"$log")

python3 - "$OUT" "$rc" "$wall" "$check_rc" "$runs_before" "$runs_after" "${history:-?}" <<'EOF'
import json, re, sys
from pathlib import Path
out, rc, wall, check_rc, before, after, history = sys.argv[1:]
text = (Path(out) / "make-validate.log").read_text(errors="replace")
said = [l for l in text.splitlines() if l.startswith("make validate:")]
rows = [("make validate exit", rc), ("wall s", wall)] + [(f"said {i + 1}", l[len("make validate: "):][:150]) for i, l in enumerate(said)]
try:
    rep = json.loads((Path(out) / "run" / "report.json").read_text())
    node = next(iter(rep["nodes"].values()))
    rows += [("verdict", rep["verdict"]), ("counts", " ".join(f"{k}={v}" for k, v in rep["counts"].items())),
             ("profile", node.get("profile")), ("gpus_expected", (next((r.get("threshold") for r in node["results"] if r["check"] == "gpu_count"), None) or {}).get("value")),
             ("causes", "; ".join(g["cause"][:80] + f" ({len(g['checks'])})" for g in node.get("causes", [])) or "none")]
    for r in node["results"]:
        if r.get("group") == "benchmark" and r.get("value") is not None:
            rows.append((f"{r['check']}", f"{r['status']} {r['value']:.6g} {r.get('unit') or ''}"))
except (OSError, ValueError, StopIteration) as exc:
    rows.append(("report", f"none ({exc})"))
rows += [("--check exit", check_rc), ("run folders before/after --check", f"{before}/{after}"), ("runs in history", history)]
print()
for k, v in rows:
    print(f"{k:<34} {v}")
EOF
