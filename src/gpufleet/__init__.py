"""gpufleet: bring-up and acceptance of NVIDIA GPU nodes for LLM training."""

from gpufleet.version import VERSION as __version__  # galaxy.yml's, written there alone

# The benchmarks' declarations (their index), before anything reads the registry: as a Go program imports its
# components' all.go, every import of gpufleet makes them.
from gpufleet import benchmarks  # noqa: F401

__all__ = ["__version__"]
