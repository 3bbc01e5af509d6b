"""The benchmarks, one folder each (`benchmarks/<name>/`): its declaration (`<name>_declared.py`: its checks, run
tiers, profile keys and metrics, through base/registry.py's declare(); and, importing it, what reads its figures
for the fleet, `<name>_figures.py`), what measures it on the node and what judges its figures.

This module is the declarations index: one line a benchmark, in the order a node stage runs them (the soak before
the SDC hashes: they run at the temperature the soak left). It imports the declarations alone, which import base/
alone (and their figures' readers, which do too), so the controller reads every benchmark without loading what
measures; the package root imports it, so every entry point (the command lines, the Ansible modules and action
plugins, tools/) finds registry.BENCHMARKS whole.
"""

from gpufleet.benchmarks.matmul import matmul_declared  # noqa: F401
from gpufleet.benchmarks.memory import memory_declared  # noqa: F401
from gpufleet.benchmarks.nccl import nccl_declared  # noqa: F401
from gpufleet.benchmarks.soak import soak_declared  # noqa: F401
from gpufleet.benchmarks.sdc import sdc_declared  # noqa: F401
from gpufleet.benchmarks.host import host_declared  # noqa: F401
from gpufleet.benchmarks.train_gpt2 import train_gpt2_declared  # noqa: F401
from gpufleet.benchmarks.workloads import workloads_declared  # noqa: F401
