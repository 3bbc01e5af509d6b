"""The bottom layer: the declarations, the document model and the run's files every other layer shares
(docs/architecture.md). Nothing here imports a folder above it.

registry.py       every check group, check, benchmark, run tier, metric and output, declared once
entries.py        the kinds of entry of the registry, and what each declares
schema.py         the one result value and the host document
profiles.py       thresholds per GPU model (profiles/, a link to files/profiles)
calibration.py    limits from measured healthy spread
judge.py          the one judgement of a figure against a limit
causes.py, failure_class.py   what a failure is and what likely caused it
paths.py, runs.py, lock.py, guard.py   run folders and records, the node lock, leaving nothing behind on a node
slurm.py          Slurm through its own command line (scontrol, sbatch, squeue, sacct)
command_line.py   what every command line shares (the parser, --json, exit codes)
errors.py, numbers.py   input errors and exit codes; significant digits, MFU
"""
