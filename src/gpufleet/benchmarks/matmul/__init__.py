"""The matmul benchmark: its declaration (matmul_declared.py, which the index imports), and what measures
and judges it on the node."""
