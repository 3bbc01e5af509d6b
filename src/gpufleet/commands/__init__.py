"""The command lines: `gpufleet COMMAND` parsed and run, the top of the engine (docs/architecture.md).

main.py     the `gpufleet` entry point: routes a command to its family and loads that family alone
one_node.py gpufleet collect|check|bench|counters|profiles: one node's commands
run.py      gpufleet run|lock: a run's record and the node lock, for the playbooks
fleet.py    gpufleet fleet run|accept|resume|locate: the playbooks through ansible-runner
records.py  gpufleet record|history|baseline|store|versions|slurm|references: the fleet's records on the controller
report.py   gpufleet report RUN_DIR
service.py  gpufleet slurm sweep|ladder|evidence: the fleet kept in service
certify.py  gpufleet keygen|certify|verify: the acceptance certificates

Each imports the layers below it; none imports another of this folder.
"""
