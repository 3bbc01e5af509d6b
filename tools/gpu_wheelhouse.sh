#!/usr/bin/env bash
# The wheels a GPU machine without a package registry needs, fetched here (a machine that reaches one):
#   .whl/             ansible-core, ansible-runner and the controller's other packages (tools/gpu_*.sh install
#                     them with pip --target)
#   .whl/python_env/  pip, setuptools, wheel, PyYAML, nvidia-ml-py: the wheelhouse the python_env role installs
#                     from there (inventory/cloud-vm), where the image's Python lacks one of them
# .whl is git-ignored; carry it to the GPU machine with the checkout.
# Usage: bash tools/gpu_wheelhouse.sh [PYTHON_VERSION]   (default 3.12, the GPU machines' Python)
set -euo pipefail
py=${1:-3.12}
cd "$(dirname "$0")/.."
fetch() {
  local dest=$1
  shift
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
    --python-version "$py" --platform manylinux2014_x86_64 --dest "$dest" "$@"
}
fetch .whl 'ansible-core>=2.19,<2.21' 'ansible-runner>=2.4' 'prometheus-client>=0.20' 'rich>=13' 'securesystemslib[crypto]>=1.0'
fetch .whl/python_env pip setuptools wheel 'PyYAML>=6' 'nvidia-ml-py>=12.535'
ls .whl .whl/python_env
du -sh .whl
