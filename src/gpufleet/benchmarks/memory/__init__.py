"""The memory benchmark: its declaration (memory_declared.py, which the index imports), and what measures
and judges it on the node."""
