#!/usr/bin/env bash
# A stand-in for the Miniforge installer (Miniforge3-Linux-x86_64.sh) on test hosts that cannot download it: it takes
# the installer's arguments (-b -p PREFIX) and installs PREFIX/bin/conda, a stand-in for `conda create` that makes the
# environment with the system's `python3 -m venv` and appends the arguments it was given to PREFIX/conda-calls.log,
# so a scenario checks what the python_env role asked conda for (the prefix, the channel, the Python version).
set -euo pipefail
prefix=""
while [ $# -gt 0 ]; do
  case $1 in
    -b) ;;
    -p) prefix=$2; shift ;;
    *) echo "miniforge stand-in: unexpected argument $1 (takes -b -p PREFIX)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$prefix" ] || { echo "miniforge stand-in: -p PREFIX is required" >&2; exit 2; }
mkdir -p "$prefix/bin"
cat >"$prefix/bin/conda" <<'CONDA'
#!/usr/bin/env bash
# conda stand-in (molecule/resources/miniforge-standin.sh): conda create --yes --prefix P [--override-channels --channel C] python=X pip
set -euo pipefail
echo "$*" >>"$(dirname "$0")/../conda-calls.log"
[ "${1:-}" = create ] || { echo "conda stand-in: only create is known here" >&2; exit 2; }
shift
env_prefix=""
while [ $# -gt 0 ]; do
  case $1 in --prefix) env_prefix=$2; shift ;; esac
  shift
done
exec /usr/bin/python3 -m venv "$env_prefix"
CONDA
chmod 0755 "$prefix/bin/conda"
