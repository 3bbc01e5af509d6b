"""The sdc benchmark: its declaration (sdc_declared.py, which the index imports), and what measures
and judges it on the node."""
