"""The host benchmark: its declaration (host_declared.py, which the index imports), and what measures
and judges it on the node."""
