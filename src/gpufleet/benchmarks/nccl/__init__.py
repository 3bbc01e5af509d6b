"""The nccl benchmark: its declaration (nccl_declared.py, which the index imports), and what measures
and judges it on the node."""
