"""The train_gpt2 benchmark: its declaration (train_gpt2_declared.py, which the index imports), and what measures
and judges it on the node."""
