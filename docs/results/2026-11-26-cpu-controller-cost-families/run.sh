#!/bin/bash
set -x
PY=/work/main/.venv/bin/python
for i in 1 2 3; do
  (cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/before-$i")
  (cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/after-$i")
done
