"""gpufleet: bring-up and acceptance of NVIDIA GPU nodes for LLM training."""

from gpufleet.version import VERSION as __version__  # galaxy.yml's, written there alone

__all__ = ["__version__"]
