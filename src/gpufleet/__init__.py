"""gpufleet: bring-up and acceptance of NVIDIA GPU nodes for LLM training."""

__version__ = "0.1.0"
