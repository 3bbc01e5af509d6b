#!/bin/bash
# Usage: run.sh BEFORE_CHECKOUT AFTER_CHECKOUT OUT  (the after checkout's .venv runs both, one after the other)
set -ex
PY="$2/.venv/bin/python"
(cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/before")
(cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --out "$3/after")
