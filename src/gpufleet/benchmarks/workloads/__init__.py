"""The workloads benchmark: its declaration (workloads_declared.py, which the index imports), and what measures
and judges it on the node."""
