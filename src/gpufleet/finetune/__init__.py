"""LoRA fine-tune of a causal LM on function-calling data across nodes, under torchrun.

config.py   YAML configs (files/configs/*.yml), validated on load
data.py     glaive-function-calling-v2 records -> chat messages -> token ids, labels on assistant turns only
model.py    base model (hub, local or random weights of a known shape), LoRA, parameter counts, MFU formula
worker.py   run() on each node; worker() on each rank (the torchrun module), figures() the run's figures
rank.py     setup(): one rank's process group, data, tokenizer, model, optimizer and schedule (Rank)
loop.py     train(): the optimizer steps, evaluate() on the held-out split, TensorBoard, save_adapter()
failures.py why a run failed: the rank and node, or the rendezvous
results.py  the run as results of the one schema (check `finetune`)
command.py  `gpufleet finetune` / `python -m gpufleet.finetune`
"""
