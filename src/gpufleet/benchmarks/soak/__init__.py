"""The soak benchmark: its declaration (soak_declared.py, which the index imports), and what measures
and judges it on the node."""
