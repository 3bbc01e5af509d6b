"""The fleet layer: every run remembered, every node and GPU judged against its peers, its past and a baseline.

    store.py    the SQLite store (<reports_dir>/gpufleet.db): runs, host documents, GPUs, results, metrics,
                counter snapshots, GPU flags and the baseline; an index that `rebuild()` recreates from the run folders
                (store_tables.py its tables, store_folders.py the run folders, store_baseline.py, store_queries.py)
    repair.py   a damaged or missing store moved aside and rebuilt before a run indexes into it (open_for_run), or
                when a run meets the damage while it uses the store (use_for_run)
    run_files.py  run.json and baseline.json, the files the store reads beside it and in the run folders
    compare.py  the results of group `fleet` per node: the comparisons of gpufleet.comparisons (GPU against its
                node's median, node against the fleet median, sample spread, against the baseline run), counter_growth.py (counter rates, over counter_table.py), fabric_growth.py (InfiniBand port
                and PCIe AER counters as rates), fabric_peers.py (port speed and rails against the other nodes),
                returning.py (GPUs that failed before), sdc_voters.py, report_rows.py (the
                report's fleet view), versions.py (the software and firmware table, fleet.versions, the nodes
                the NCCL run across nodes leaves out)
    export.py   a Prometheus textfile per node and the Slurm drain lines
                (document_writer.py: a host document written into its run folder; history_text.py)

The node side never imports this package: it runs on the controller only.
"""

from __future__ import annotations

# The comparisons' shared names, used across this layer too.
from gpufleet.comparisons import GROUP, figure_text, flagged, gpu_text, short_uuid  # noqa: F401

DB_NAME = "gpufleet.db"
BASELINE_FILE = "baseline.json"  # beside the store, so `store rebuild` keeps the baseline
