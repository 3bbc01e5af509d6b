"""Training workloads: the GPT-2 throughput gate (train.gpt2)."""
