#!/bin/bash
# Usage: run.sh BEFORE_CHECKOUT AFTER_CHECKOUT OUT  (one Python, the main checkout's .venv, runs both; each
# checkout's own src/ comes first on the engine's PYTHONPATH, so each measures its own engine and collection)
set -ex
PY=/work/main/.venv/bin/python
(cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/before")
(cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/after")
for i in 2 3; do
  (cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/after-$i")
  (cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/before-$i")
done
(cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --tasks --out "$3/after-tasks")
(cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --tasks --out "$3/before-tasks")
# Again later, with nothing else running on the machine: three pairs, before first.
for i in 1 2 3; do
  (cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/quiet/before-$i")
  (cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/quiet/after-$i")
done
