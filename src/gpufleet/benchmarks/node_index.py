"""The node's index of the benchmarks: the modules of each benchmark's folder that register how it is measured,
judged and its figures read (base/entries.py's ROLES), in the order of the declarations index
(benchmarks/__init__.py). Written by `make generate` (tools/generate.py) from the folders, never by hand;
node/measure.py imports it, so the registrations are made there and the import graph shows each of them."""

from gpufleet.benchmarks.matmul import matmul_figures, matmul_judge, matmul_measure  # noqa: F401
from gpufleet.benchmarks.memory import memory_again, memory_figures, memory_judge, memory_measure  # noqa: F401
from gpufleet.benchmarks.nccl import nccl_figures, nccl_judge, nccl_measure  # noqa: F401
from gpufleet.benchmarks.soak import soak_judge, soak_measure, soak_remeasure  # noqa: F401
from gpufleet.benchmarks.sdc import sdc_judge, sdc_measure  # noqa: F401
from gpufleet.benchmarks.host import host_figures, host_judge, host_measure  # noqa: F401
from gpufleet.benchmarks.train_gpt2 import train_gpt2_figures, train_gpt2_judge, train_gpt2_measure  # noqa: F401
from gpufleet.benchmarks.workloads import workloads_judge, workloads_measure  # noqa: F401
