#!/bin/bash
PY=/work/main/.venv/bin/python
(cd "$1" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --tasks --out "$3/before-tasks")
(cd "$2" && "$PY" scripts/controller_cost.py playbook --nodes 64 --forks 8 --tasks --out "$3/after-tasks")
