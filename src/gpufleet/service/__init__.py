"""Keeping the fleet accepted while it works: acting on verdicts and history, above the report. Nothing here
measures: the node stage runs on the nodes (node/stage.py, inside Slurm jobs), the report judges the documents,
and this package decides and, when the operator asked for it, acts.

    sweep.py     `gpufleet slurm sweep`: a tier's node stage as preemptible Slurm jobs on idle nodes, the run judged
    retest.py    a node gpufleet drained for a step of its ladder measured again by a sweep job, in a reservation
                 no user's job can enter
    ladder.py    `gpufleet ladder`: the remediation ladder (re-test, GPU reset, reboot, RMA) of each node not accepted,
                 its position from the node's history in the store; a replaced GPU sent back through acceptance
    policy.py    which steps for which root cause (the profile's remediation)
    commands.py  the site's commands of the ladder's steps, rendered without a shell and run with a timeout
    evidence.py  `gpufleet evidence NODE`: one archive for a vendor's RMA ticket
    redact.py    secrets kept out of what leaves the fleet
    outputs.py   what it cost (fleet/service_log.py) in the report, in Prometheus, in words

Every action is proposed unless the operator opted in, and every record lands in a run folder (sweep.json,
ladder.json beside slurm.json), which the store indexes (table events).
"""
